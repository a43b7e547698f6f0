//! Choosing the source GID of a QP from its port's GID table.

use super::device::{GidEntry, GidKind};
use crate::fabric::Gid;

/// The GID to use: `want` if it is a RoCE v2 entry; else the first RoCE v2 GID,
/// IPv4-mapped first (RoCEv2 over IPv4 is what most fabrics route), then global
/// IPv6, then link-local.
pub fn select_gid(table: &[GidEntry], want: Option<Gid>) -> Option<GidEntry> {
    let v2 = table.iter().filter(|e| e.kind == GidKind::RoceV2);
    if let Some(w) = want {
        return v2.clone().find(|e| e.gid == w).copied();
    }
    let rank = |e: &&GidEntry| {
        if e.gid.is_ipv4() {
            0
        } else if e.gid.0[0] == 0xfe && e.gid.0[1] & 0xc0 == 0x80 {
            2
        } else {
            1
        }
    };
    v2.min_by_key(|e| (rank(e), e.index)).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: &str, kind: GidKind) -> GidEntry {
        GidEntry {
            index,
            gid: gid.parse::<std::net::Ipv6Addr>().unwrap().into(),
            kind,
        }
    }

    #[test]
    fn gid_selection_prefers_v2_ipv4_mapped() {
        let t = [
            entry(0, "fe80::200:ff:fe00:0", GidKind::RoceV2),
            entry(1, "::ffff:127.0.0.1", GidKind::RoceV1OrIb),
            entry(2, "::ffff:127.0.0.1", GidKind::RoceV2),
            entry(3, "::1", GidKind::RoceV2),
        ];
        assert_eq!(select_gid(&t, None).unwrap().index, 2);
        assert_eq!(select_gid(&t[..1], None).unwrap().index, 0);
        assert_eq!(select_gid(&[t[0], t[3]], None).unwrap().index, 3);
        let want = "::1".parse::<std::net::Ipv6Addr>().unwrap().into();
        assert_eq!(select_gid(&t, Some(want)).unwrap().index, 3);
        assert!(select_gid(&t[..2], Some(want)).is_none());
    }
}
