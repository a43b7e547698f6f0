//! The receiver's key checks, written once for every provider.
//!
//! A UD packet reaches a receive queue only if its destination QP exists, its
//! BTH P_Key is in the QP's partition and its DETH Q_Key is the QP's Q_Key
//! (IBA 9.6.1.2 / 10.9.3 / 10.2.4). Hardware (`verbs`) applies these rules
//! itself and reports them in its port counters; `sim` and `soft` apply them in
//! software by calling `accept` (which runs [`check_keys`] and counts a drop on
//! the receiving QP), so every provider accepts the same packets and counts the
//! same drops ([`ProviderDrops::count`]).

use super::addr::QKEY_PRIVILEGED_BIT;
use super::recv_queue::RecvQueue;
use super::{FabricError, ProviderDrops, Qpn};

/// The membership bit of a P_Key: set for a full member, clear for a limited one
/// (IBA 10.9.1).
pub(crate) const PKEY_FULL_MEMBER: u16 = 0x8000;

/// The partition number: the low 15 bits of a P_Key.
const PKEY_BASE_MASK: u16 = 0x7FFF;

/// The key fields of a received packet: BTH P_Key and DestQP, DETH Q_Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PacketKeys {
    /// BTH P_Key.
    pub pkey: u16,
    /// BTH destination QP (24 bits).
    pub dest_qp: Qpn,
    /// DETH Q_Key.
    pub qkey: u32,
}

/// What the destination QP accepts: its P_Key and Q_Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QpKeys {
    /// The P_Key of the QP's partition.
    pub pkey: u16,
    /// The QP's Q_Key.
    pub qkey: u32,
}

/// Why the key checks dropped a packet: one [`ProviderDrops`] counter each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum KeyDrop {
    /// No QP with the destination QPN exists on the port (`unknown_qpn`).
    UnknownQpn,
    /// The P_Keys are not in one partition, or either is invalid (`bad_pkey`).
    BadPkey,
    /// The Q_Key is not the QP's, or is privileged (`bad_qkey`).
    BadQkey,
}

/// IBA 10.9.3: two P_Keys match when their partition numbers (low 15 bits) are
/// equal and at least one of them is a full member; a limited member cannot talk
/// to another limited member. 0x0000 and 0x8000 are invalid and match nothing.
pub(crate) fn pkey_matches(pkt: u16, ours: u16) -> bool {
    let base = pkt & PKEY_BASE_MASK;
    base != 0 && base == ours & PKEY_BASE_MASK && (pkt | ours) & PKEY_FULL_MEMBER != 0
}

/// Check a P_Key is usable for a QP (not one of the invalid 0x0000 / 0x8000).
pub fn check_pkey(pkey: u16) -> Result<u16, FabricError> {
    if pkey & PKEY_BASE_MASK == 0 {
        Err(FabricError::InvalidPkey(pkey))
    } else {
        Ok(pkey)
    }
}

/// The receiver's checks, in the order a HCA applies them (IBA 9.6.1: QPN, then
/// P_Key, then Q_Key). `qp` is what the port found for `pkt.dest_qp` (`None`: no
/// such QP).
///
/// The Q_Key rule is strict equality with the QP's Q_Key. A privileged Q_Key
/// (top bit set, IBA 10.2.4) in the DETH is refused outright: only the kernel's
/// QPs may receive with one and ours are never privileged ([`super::check_qkey`]).
/// Hardware counts both in one Q_Key violation counter, and so do we.
pub(crate) fn check_keys(pkt: PacketKeys, qp: Option<QpKeys>) -> Result<(), KeyDrop> {
    let Some(qp) = qp else {
        return Err(KeyDrop::UnknownQpn);
    };
    if !pkey_matches(pkt.pkey, qp.pkey) {
        return Err(KeyDrop::BadPkey);
    }
    if pkt.qkey & QKEY_PRIVILEGED_BIT != 0 || pkt.qkey != qp.qkey {
        return Err(KeyDrop::BadQkey);
    }
    Ok(())
}

/// The receive-side acceptance of a software provider (`sim`, `soft`): the
/// checks of [`check_keys`] against the receive queue the port found for the
/// destination QPN, a P_Key or Q_Key drop counted on that QP's counters.
/// `Err(KeyDrop::UnknownQpn)` is left to the caller to count on its port: a
/// packet for no QP belongs to none.
pub(crate) fn accept<B: AsRef<[u8]>>(
    pkt: PacketKeys,
    qp: Option<&mut RecvQueue<B>>,
) -> Result<&mut RecvQueue<B>, KeyDrop> {
    let Some(qp) = qp else {
        return Err(KeyDrop::UnknownQpn);
    };
    match check_keys(pkt, Some(qp.keys())) {
        Ok(()) => Ok(qp),
        Err(cause) => {
            qp.drops.count(cause);
            Err(cause)
        }
    }
}

/// The Q_Key a send puts in its DETH (IBA 10.2.4 / 11.4.1.1): the work
/// request's, unless that has the top bit set, which means "use the sending
/// QP's own Q_Key" (hardware does this; `sim` and `soft` call this).
pub(crate) fn send_qkey(wr_qkey: u32, qp_qkey: u32) -> u32 {
    if wr_qkey & QKEY_PRIVILEGED_BIT != 0 {
        qp_qkey
    } else {
        wr_qkey
    }
}

impl ProviderDrops {
    /// Count one packet dropped by the key checks.
    pub(crate) fn count(&mut self, cause: KeyDrop) {
        match cause {
            KeyDrop::UnknownQpn => self.unknown_qpn += 1,
            KeyDrop::BadPkey => self.bad_pkey += 1,
            KeyDrop::BadQkey => self.bad_qkey += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::{DEFAULT_PKEY, DEFAULT_QKEY};

    const FULL: u16 = 0xFFFF;
    const LIMITED: u16 = 0x7FFF;

    /// A case name, the packet, what the port found for its QPN, the verdict.
    type Row = (
        &'static str,
        PacketKeys,
        Option<QpKeys>,
        Result<(), KeyDrop>,
    );

    #[test]
    fn the_rule_table() {
        let q = DEFAULT_QKEY;
        let qp = |pkey, qkey| Some(QpKeys { pkey, qkey });
        let pkt = |pkey, qkey| PacketKeys {
            pkey,
            dest_qp: 0x11,
            qkey,
        };
        #[rustfmt::skip]
        let table: &[Row] = &[
            ("full/full",                pkt(FULL, q),    qp(FULL, q),    Ok(())),
            ("limited sender, full QP",  pkt(LIMITED, q), qp(FULL, q),    Ok(())),
            ("full sender, limited QP",  pkt(FULL, q),    qp(LIMITED, q), Ok(())),
            ("limited/limited",          pkt(LIMITED, q), qp(LIMITED, q), Err(KeyDrop::BadPkey)),
            ("other partition",          pkt(0x8001, q),  qp(FULL, q),    Err(KeyDrop::BadPkey)),
            ("same non-default part.",   pkt(0x8123, q),  qp(0x0123, q),  Ok(())),
            ("invalid 0x8000 both",      pkt(0x8000, q),  qp(0x8000, q),  Err(KeyDrop::BadPkey)),
            ("invalid 0x0000 both",      pkt(0x0000, q),  qp(0x0000, q),  Err(KeyDrop::BadPkey)),
            ("invalid 0x0000 vs 0x8000", pkt(0x0000, q),  qp(0x8000, q),  Err(KeyDrop::BadPkey)),
            ("wrong Q_Key",              pkt(FULL, q ^ 1), qp(FULL, q),   Err(KeyDrop::BadQkey)),
            ("privileged Q_Key",         pkt(FULL, 0x8001_0000), qp(FULL, q), Err(KeyDrop::BadQkey)),
            ("P_Key checked before Q_Key", pkt(0x8001, q ^ 1), qp(FULL, q), Err(KeyDrop::BadPkey)),
            ("no such QP",               pkt(0x8001, q ^ 1), None,        Err(KeyDrop::UnknownQpn)),
        ];
        for (name, p, ours, want) in table {
            assert_eq!(check_keys(*p, *ours), *want, "{name}");
        }
    }

    #[test]
    fn a_privileged_wr_qkey_sends_the_qps_own() {
        assert_eq!(send_qkey(0x8000_0000, DEFAULT_QKEY), DEFAULT_QKEY);
        assert_eq!(send_qkey(0xFFFF_FFFF, DEFAULT_QKEY), DEFAULT_QKEY);
        assert_eq!(send_qkey(0x1234, DEFAULT_QKEY), 0x1234);
    }

    #[test]
    fn each_cause_has_its_counter() {
        let mut d = ProviderDrops::default();
        d.count(KeyDrop::UnknownQpn);
        d.count(KeyDrop::BadPkey);
        d.count(KeyDrop::BadPkey);
        d.count(KeyDrop::BadQkey);
        d.count(KeyDrop::BadQkey);
        d.count(KeyDrop::BadQkey);
        assert_eq!((d.unknown_qpn, d.bad_pkey, d.bad_qkey), (1, 2, 3));
    }

    #[test]
    fn invalid_pkeys_are_refused_at_configuration() {
        assert!(check_pkey(0x0000).is_err());
        let msg = check_pkey(0x8000).unwrap_err().to_string();
        assert!(msg.contains("0x8000") && msg.contains("0xffff"), "{msg}");
        assert_eq!(check_pkey(DEFAULT_PKEY).unwrap(), DEFAULT_PKEY);
        assert_eq!(check_pkey(LIMITED).unwrap(), LIMITED);
    }
}
