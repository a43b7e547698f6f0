//! Readiness for service managers: systemd's notify protocol (sd_notify(3)).
//! A unit with `Type=notify` starts the service with `NOTIFY_SOCKET` set to
//! a datagram socket; the service sends `READY=1` once it serves, so units
//! ordered after it start only then. Without `NOTIFY_SOCKET` nothing is sent.

use std::io;
use std::os::unix::net::UnixDatagram;

/// Tell the service manager this process is ready, with a status line
/// (`systemctl status` shows it). Failures are logged, not fatal: the
/// service works either way.
pub(crate) fn ready(status: &str) {
    let msg = format!("READY=1\nSTATUS={}", status.replace('\n', " "));
    if let Err(e) = notify(&msg) {
        tracing::warn!("NOTIFY_SOCKET: {e} (systemd was not told the service is ready)");
    }
}

/// Tell the service manager this process is stopping (it closes its
/// connections before it exits).
pub(crate) fn stopping() {
    if let Err(e) = notify("STOPPING=1") {
        tracing::warn!("NOTIFY_SOCKET: {e} (systemd was not told the service is stopping)");
    }
}

/// Send `msg` to `$NOTIFY_SOCKET`: a path, or `@name` for an abstract socket.
/// `Ok(false)` when the variable is not set.
fn notify(msg: &str) -> io::Result<bool> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let sock = UnixDatagram::unbound()?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(target.as_os_str());
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(msg.as_bytes(), &addr)?;
    } else {
        sock.send_to(msg.as_bytes(), &target)?;
    }
    Ok(true)
}
