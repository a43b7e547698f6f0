//! Why a peer closed a connection, said in words a user can act on. In TLS
//! 1.3 the client finishes its handshake before the server has checked the
//! client's certificate, so a refused certificate shows up on the client as
//! a connection closed with a TLS alert (RFC 9001 §4.8: QUIC error code
//! 0x0100 + the alert) on its first stream, not as a failed dial.

/// Why the peer closed `conn`, if it did: the TLS alert it closed with (see
/// [`tls_refusal`]), or the reason it gave with an application close (a
/// refusal such as "not granted channel ..."). Whichever call on the
/// connection fails first, the user reads the peer's words, not "connection
/// lost".
pub(crate) fn peer_refusal(conn: &quinn::Connection) -> Option<String> {
    if let Some(tls) = tls_refusal(conn) {
        return Some(tls);
    }
    match conn.close_reason()? {
        quinn::ConnectionError::ApplicationClosed(close) => Some(format!(
            "the peer closed the connection (code {}): {}",
            close.error_code,
            String::from_utf8_lossy(&close.reason)
        )),
        _ => None,
    }
}

/// The TLS alert the peer closed `conn` with, as a sentence, if it did.
pub(crate) fn tls_refusal(conn: &quinn::Connection) -> Option<String> {
    let Some(quinn::ConnectionError::ConnectionClosed(close)) = conn.close_reason() else {
        return None;
    };
    let code = u64::from(close.error_code);
    let alert = u8::try_from(code.checked_sub(0x100)?).ok()?;
    let name = rustls::AlertDescription::from(alert);
    Some(format!(
        "the peer refused our TLS handshake with alert {name:?} ({alert}): it does not accept \
         this certificate (is it signed by the CA the peer trusts, and allowed there?)"
    ))
}

/// Why our own side refused the peer's certificate, as a sentence, when a
/// handshake failed for that reason (rustls names the cause in the local
/// close: `invalid peer certificate: UnknownIssuer`, `NotValidForName`, an
/// expired or not yet valid certificate).
pub(crate) fn local_certificate_refusal(e: &quinn::ConnectionError) -> Option<String> {
    let quinn::ConnectionError::TransportError(t) = e else {
        return None;
    };
    let why = t.to_string();
    let (cause, fix) = if why.contains("UnknownIssuer") {
        (
            "is not signed by a CA we trust",
            "give the CA that signed it with --ca (or --cert for a self-signed server)",
        )
    } else if why.contains("NotValidForName") || why.contains("not valid for name") {
        (
            "does not name the address or server name we dialled",
            "dial the name it was issued for, or give it with --server-name",
        )
    } else if why.contains("Expired") || why.contains("NotValidYet") {
        (
            "is outside its validity period",
            "issue a new certificate (or check this host's clock)",
        )
    } else {
        return None;
    };
    Some(format!("the peer's certificate {cause}: {fix} ({why})"))
}
