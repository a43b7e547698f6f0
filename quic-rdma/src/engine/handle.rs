//! Copy handles for connections, streams and undecided incoming connections.

use std::fmt;

/// A connection of an [`Engine`](super::Engine): a slot index plus a generation,
/// so a handle kept after its connection was freed never reaches a newer one.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

impl ConnHandle {
    /// The handle as one integer (for FFI and logs): generation in the high half.
    pub fn to_bits(self) -> u64 {
        u64::from(self.gen) << 32 | u64::from(self.index)
    }

    /// The inverse of [`ConnHandle::to_bits`]. Any value is accepted; the engine
    /// rejects handles that name no live connection.
    pub fn from_bits(bits: u64) -> Self {
        ConnHandle {
            index: bits as u32,
            gen: (bits >> 32) as u32,
        }
    }
}

impl fmt::Debug for ConnHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}.{}", self.index, self.gen)
    }
}

/// A connection attempt waiting for the application's decision
/// (with [`AcceptPolicy::Manual`](super::AcceptPolicy::Manual)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct IncomingId(pub(crate) u32, pub(crate) u32);

impl IncomingId {
    /// The id as one integer (for FFI): generation in the high half.
    pub fn to_bits(self) -> u64 {
        u64::from(self.1) << 32 | u64::from(self.0)
    }

    /// The inverse of [`IncomingId::to_bits`].
    pub fn from_bits(bits: u64) -> Self {
        IncomingId(bits as u32, (bits >> 32) as u32)
    }
}
