//! The record a discovery service publishes ([`PeerInfo`]) and its one-line
//! text form: the reply of the protocol described in [`crate::discovery`].

use std::io;
use std::net::IpAddr;

use crate::fabric::addr::MAX_QPN;
use crate::fabric::soft::{SoftPort, SoftQp};
use crate::fabric::{Gid, Mtu, UdAddr, UdQueuePair};
use crate::socket::UdSocket;

/// The request line.
pub const REQUEST: &str = "QRDMA-SOFT-BOOTSTRAP 1\n";
/// Longest line either side sends.
pub const MAX_LINE: usize = 512;
pub(super) const REPLY_TAG: &str = "QRDMA-SOFT";
pub(super) const VERSION: &str = "1";

/// What a server publishes: how to reach its QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// GID, QPN and Q_Key of the server's QP.
    pub addr: UdAddr,
    /// UDP port of the server's `soft` socket (4791 unless configured otherwise).
    pub udp_port: u16,
    /// The server port's active MTU.
    pub mtu: Mtu,
    /// Whether the server's socket reassembles segmented datagrams (`seg=1`;
    /// docs/architecture.md §6, "Segmented datagrams"). Servers before
    /// segmentation do not publish it.
    pub reassembles: bool,
}

/// Why a bootstrap exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// Connecting, reading or writing failed (including timeouts). The I/O error
    /// is in the message and deliberately not also a `source()`: error reporters
    /// that print the chain would show it twice.
    #[error("bootstrap I/O: {0}")]
    Io(io::Error),
    /// The peer answered something that is not a version-1 reply.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// The server answered `ERR`.
    #[error("bootstrap server refused: {0}")]
    Refused(String),
    /// The peer does not reassemble segmented datagrams, which the path's MTU
    /// needs ([`PeerInfo::check_segmentation`]).
    #[error(
        "the peer at {gid} does not reassemble segmented datagrams (no seg=1 in its \
         bootstrap reply), which a path MTU of {mtu} needs for QUIC's 1200-byte \
         datagrams (RFC 9000 §14): upgrade the peer, or enable jumbo frames on both \
         links (RoCE MTU 2048 or more)"
    )]
    CannotReassemble {
        /// The peer's GID.
        gid: Gid,
        /// The path MTU in bytes.
        mtu: usize,
    },
}

impl From<io::Error> for BootstrapError {
    fn from(e: io::Error) -> Self {
        BootstrapError::Io(e)
    }
}

impl PeerInfo {
    /// What to publish for `socket`, whose RoCEv2 packets arrive on UDP port
    /// `udp_port` (4791 for `verbs` devices and kernel rxe): its UD address,
    /// its active MTU (not the datagram size: parts are the socket's
    /// business) and whether it reassembles segmented datagrams.
    pub fn of_socket<Q: UdQueuePair>(socket: &UdSocket<Q>, udp_port: u16) -> PeerInfo {
        PeerInfo {
            addr: socket.local_addr(),
            udp_port,
            mtu: socket.active_mtu(),
            reassembles: socket.config().segmentation,
        }
    }

    /// What to publish for `qp`, whose socket reassembles (the socket's
    /// default; clear `reassembles` for one configured without segmentation).
    pub fn of(qp: &SoftQp) -> PeerInfo {
        let a = qp.attr();
        PeerInfo {
            addr: UdAddr::new(a.gid, a.qpn, a.qkey),
            udp_port: qp.port().local_addr().port(),
            mtu: a.active_mtu,
            reassembles: true,
        }
    }

    /// Refuse to talk to this peer over a path of `mtu` (the smaller of both
    /// ends' active MTUs) when datagrams would have to go as parts — below
    /// 2048 — and the peer does not reassemble: every part would be dropped
    /// on arrival, and the handshake time out with nothing said.
    pub fn check_segmentation(&self, mtu: Mtu) -> Result<(), BootstrapError> {
        if mtu.bytes() >= 2048 || self.reassembles {
            return Ok(());
        }
        Err(BootstrapError::CannotReassemble {
            gid: self.addr.gid,
            mtu: mtu.bytes(),
        })
    }

    /// The reply line (with trailing newline).
    pub fn to_line(&self) -> String {
        format!(
            "{REPLY_TAG} {VERSION} gid={} qpn={} qkey={} udp_port={} mtu={}{}\n",
            self.addr.gid,
            self.addr.qpn,
            self.addr.qkey,
            self.udp_port,
            self.mtu.bytes(),
            if self.reassembles { " seg=1" } else { "" }
        )
    }

    /// Parse a reply line (trailing newline optional).
    pub fn parse(line: &str) -> Result<PeerInfo, BootstrapError> {
        let line = line.trim_end_matches(['\n', '\r']);
        if let Some(reason) = line.strip_prefix("ERR ") {
            return Err(BootstrapError::Refused(reason.to_string()));
        }
        let bad = |what: &str| BootstrapError::Protocol(format!("{what} in {line:?}"));
        let mut words = line.split(' ');
        if words.next() != Some(REPLY_TAG) || words.next() != Some(VERSION) {
            return Err(bad("not a version-1 reply"));
        }
        let (mut gid, mut qpn, mut qkey, mut udp_port, mut mtu) = (None, None, None, None, None);
        let mut reassembles = false;
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                return Err(bad("field without '='"));
            };
            match k {
                "gid" => {
                    gid = Some(Gid::from(
                        v.parse::<std::net::Ipv6Addr>()
                            .map_err(|_| bad("bad gid"))?,
                    ))
                }
                "qpn" => qpn = Some(v.parse::<u32>().map_err(|_| bad("bad qpn"))?),
                "qkey" => qkey = Some(v.parse::<u32>().map_err(|_| bad("bad qkey"))?),
                "udp_port" => udp_port = Some(v.parse::<u16>().map_err(|_| bad("bad udp_port"))?),
                "mtu" => {
                    let n = v.parse::<usize>().map_err(|_| bad("bad mtu"))?;
                    mtu = Some(Mtu::from_bytes(n).ok_or_else(|| bad("mtu not an IB MTU"))?)
                }
                // Any other value is a capability we do not know: not ours.
                "seg" => reassembles = v == "1",
                _ => {} // forward compatible: ignore what we do not know
            }
        }
        let (Some(gid), Some(qpn), Some(qkey), Some(udp_port), Some(mtu)) =
            (gid, qpn, qkey, udp_port, mtu)
        else {
            return Err(bad("missing field"));
        };
        if qpn > MAX_QPN {
            return Err(bad("qpn above 24 bits"));
        }
        if udp_port == 0 {
            return Err(bad("udp_port 0"));
        }
        Ok(PeerInfo {
            addr: UdAddr::new(gid, qpn, qkey),
            udp_port,
            mtu,
            reassembles,
        })
    }

    /// Point `port`'s sends to this peer at its UDP port (call before `create_ah`).
    pub fn apply(&self, port: &SoftPort) {
        port.set_peer_port(self.addr.gid, self.udp_port);
    }
}

/// The IP a bootstrap answer's GID stands for, for the QUIC-level server name
/// check or logging.
pub fn peer_ip(info: &PeerInfo) -> IpAddr {
    info.addr.gid.to_ip()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::fabric::DEFAULT_QKEY;
    use proptest::prelude::*;

    /// A record to publish in tests.
    pub(crate) fn sample() -> PeerInfo {
        PeerInfo {
            addr: UdAddr::new(
                Gid::from(std::net::Ipv4Addr::new(10, 1, 2, 3)),
                0x11,
                DEFAULT_QKEY,
            ),
            udp_port: 4791,
            mtu: Mtu::M4096,
            reassembles: true,
        }
    }

    #[test]
    fn line_round_trip_and_format() {
        let i = sample();
        let l = i.to_line();
        assert_eq!(
            l,
            "QRDMA-SOFT 1 gid=::ffff:10.1.2.3 qpn=17 qkey=285282561 udp_port=4791 mtu=4096 seg=1\n"
        );
        assert_eq!(PeerInfo::parse(&l).unwrap(), i);
        // Unknown fields are ignored.
        let extended = l.trim_end().to_string() + " future=1\n";
        assert_eq!(PeerInfo::parse(&extended).unwrap(), i);
    }

    #[test]
    fn a_peer_without_seg_is_never_sent_parts() {
        // A reply from before segmentation: no seg field.
        let old = PeerInfo::parse(
            "QRDMA-SOFT 1 gid=::ffff:10.1.2.3 qpn=17 qkey=285282561 udp_port=4791 mtu=4096",
        )
        .unwrap();
        assert!(!old.reassembles);
        assert!(
            old.check_segmentation(Mtu::M2048).is_ok(),
            "no parts at 2048"
        );
        let err = old.check_segmentation(Mtu::M1024).unwrap_err();
        assert!(matches!(
            err,
            BootstrapError::CannotReassemble { mtu: 1024, .. }
        ));
        assert!(err.to_string().contains("seg=1"), "{err}");
        assert!(sample().check_segmentation(Mtu::M1024).is_ok());
        let unknown = PeerInfo::parse(&sample().to_line().replace("seg=1", "seg=2")).unwrap();
        assert!(
            !unknown.reassembles,
            "an unknown capability value is not ours"
        );
    }

    #[test]
    fn rejects_bad_replies() {
        for l in [
            "",
            "QRDMA-SOFT 2 gid=::1 qpn=1 qkey=1 udp_port=1 mtu=4096",
            "QRDMA-SOFT 1 gid=::1 qpn=1 qkey=1 udp_port=1",
            "QRDMA-SOFT 1 gid=::1 qpn=16777216 qkey=1 udp_port=1 mtu=4096",
            "QRDMA-SOFT 1 gid=::1 qpn=1 qkey=1 udp_port=1 mtu=1500",
            "QRDMA-SOFT 1 gid=x qpn=1 qkey=1 udp_port=1 mtu=4096",
            "QRDMA-SOFT 1 gid",
        ] {
            assert!(
                matches!(PeerInfo::parse(l), Err(BootstrapError::Protocol(_))),
                "{l:?}"
            );
        }
        assert!(matches!(
            PeerInfo::parse("ERR busy\n"),
            Err(BootstrapError::Refused(r)) if r == "busy"
        ));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,200}") {
            let _ = PeerInfo::parse(&s);
        }
    }
}
