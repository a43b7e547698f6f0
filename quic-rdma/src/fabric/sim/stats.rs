//! What the simulated fabric itself did to packets.

/// The "wire" counters of a simulated fabric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FabricStats {
    /// Packets put on the wire by `post_send` (before faults).
    pub sent: u64,
    /// Packets handed to a destination QP's receive queue.
    pub delivered: u64,
    /// Packets lost by fault injection (or [`SimFabric::lose_next`](super::SimFabric::lose_next)).
    pub lost: u64,
    /// Extra copies made by fault injection.
    pub duplicated: u64,
    /// Packets held back so later ones overtake them.
    pub reordered: u64,
    /// Packets with a byte flipped.
    pub corrupted: u64,
    /// Packets marked ECN CE.
    pub ce_marked: u64,
    /// Packets to a GID no port has.
    pub unreachable: u64,
    /// Attempts to destroy an AH with sends still in flight (a bug on hardware).
    pub ah_destroy_in_use: u64,
}
