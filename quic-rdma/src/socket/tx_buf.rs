//! Zero-copy transmit buffers (docs/architecture.md §4): registered `Vec<u8>`s
//! lent to whoever builds a datagram by appending to a `Vec` — quinn-proto's
//! `Connection::poll_transmit` — whose send WRs then point straight at what
//! was written.
//!
//! Each buffer is a `Vec`-backed [`Region`] of `max_segments() × MTU` bytes
//! plus [`TX_BUF_OVERRUN`], registered once over its whole capacity. quinn-proto
//! reserves `max_datagrams × segment_size` only when the capacity is short
//! (quinn-proto 0.11 `Connection::poll_transmit`), and it writes an ACK frame
//! whole before checking that it fits, truncating it again when it does not
//! (`try_populate_acks`): without the overrun room, an ACK tried at the end of
//! a full batch's last datagram grew the `Vec` (seen under load with loss and
//! reordering, where ACKs carry many ranges). So such a `Vec` is never grown
//! and its memory never moves. Should it move anyway — a reallocation frees the memory
//! the device was given — the buffer is not posted from: the transmit goes
//! through the copying path, the buffer's region is deregistered and replaced
//! by a fresh one, and [`SocketStats::tx_buf_reallocations`](super::SocketStats::tx_buf_reallocations) counts it.
//!
//! Lifecycle: free → lent ([`UdSocket::take_tx_buf`]) → in flight (its WRs
//! posted by [`UdSocket::send_tx_buf`]) → free again when the completion
//! covering its last WR is reaped (selective signaling: a signaled completion
//! retires every earlier WR), or when a recovery of the queue pair takes every
//! send back. A refused send (`WouldBlock`) hands the buffer, bytes intact,
//! back to the caller for a retry. Buffers are created on first need, up to
//! [`SocketConfig::tx_bufs`](super::SocketConfig::tx_bufs), so a socket that
//! never sends this way (the quinn adapter's) registers none.

use std::sync::atomic::{AtomicU64, Ordering};

use super::send::Payload;
use super::{SocketError, UdSocket};
use crate::fabric::{Region, UdAddr, UdQueuePair};

/// Room past a full batch for what quinn-proto writes and then takes back:
/// an ACK frame of at most 64 ranges (quinn-proto 0.11 `MAX_ACK_BLOCKS`) is
/// under 1.1 KB (RFC 9000 §19.3: five varints of up to 8 bytes, two per
/// range, three ECN counts).
pub const TX_BUF_OVERRUN: usize = 2048;

/// Identity of each socket, so a buffer is never used on a socket that did not lend it.
static NEXT_SOCKET_ID: AtomicU64 = AtomicU64::new(1);

/// A new socket identity for [`TxPool::new`].
fn next_socket_id() -> u64 {
    NEXT_SOCKET_ID.fetch_add(1, Ordering::Relaxed)
}

/// A transmit buffer lent by [`UdSocket::take_tx_buf`]: write into
/// [`UdSocket::tx_vec`], then post it with [`UdSocket::send_tx_buf`] or hand it
/// back with [`UdSocket::return_tx_buf`]. Not `Clone`: whoever holds it is the
/// only writer, and a buffer posted from is out of the caller's hands until its
/// sends complete. Dropping it instead of returning it loses it to the pool.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a transmit buffer goes back with send_tx_buf or return_tx_buf"]
pub struct TxBuf {
    socket: u64,
    index: u32,
}

/// Why [`UdSocket::send_tx_buf`] did not post a transmit.
#[derive(Debug)]
pub enum TxSendError {
    /// No send-queue room now; nothing was posted. The buffer comes back with
    /// its bytes: retry after completions (as [`SocketError::WouldBlock`]).
    WouldBlock(TxBuf),
    /// Refused or failed as [`UdSocket::send_with_imm`] would; the socket took
    /// the buffer back (after the completion of any WR a
    /// [`SocketError::PartiallyPosted`] left in flight).
    Failed(SocketError),
}

impl std::fmt::Display for TxSendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TxSendError::WouldBlock(_) => SocketError::WouldBlock.fmt(f),
            TxSendError::Failed(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for TxSendError {}

/// Where a transmit buffer is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxState {
    /// In the free list.
    Free,
    /// Held by a caller (a [`TxBuf`] exists).
    Lent,
    /// WRs posted from it are in flight.
    InFlight,
    /// Its region could not be replaced after a reallocation: never lent again.
    Dead,
}

/// The transmit buffers of one socket.
#[derive(Debug)]
pub(crate) struct TxPool {
    socket: u64,
    /// Region index (in the socket's `Memory`) of each buffer.
    regions: Vec<u32>,
    state: Vec<TxState>,
    free: Vec<u32>,
    /// Buffers alive (created and not dead).
    live: usize,
    /// Most buffers alive at once.
    max: usize,
    /// Capacity of each buffer: the socket's `max_segments() × MTU` + [`TX_BUF_OVERRUN`].
    capacity: usize,
}

impl TxPool {
    pub(crate) fn new(max: usize, capacity: usize) -> Self {
        TxPool {
            socket: next_socket_id(),
            regions: Vec::new(),
            state: Vec::new(),
            free: Vec::new(),
            live: 0,
            max,
            capacity,
        }
    }

    /// Buffers that could be lent now or created on demand.
    pub(crate) fn available(&self) -> usize {
        self.free.len() + (self.max - self.live)
    }

    /// A buffer's WRs completed (or were taken back by a recovery).
    pub(crate) fn release(&mut self, index: u32) {
        debug_assert_eq!(self.state[index as usize], TxState::InFlight);
        self.state[index as usize] = TxState::Free;
        self.free.push(index);
    }

    fn give_back(&mut self, index: u32) {
        debug_assert_eq!(self.state[index as usize], TxState::Lent);
        self.state[index as usize] = TxState::Free;
        self.free.push(index);
    }
}

impl<Q: UdQueuePair> UdSocket<Q> {
    /// Lend a transmit buffer: an empty `Vec<u8>` (see [`UdSocket::tx_vec`])
    /// of capacity [`tx_buf_capacity`](Self::tx_buf_capacity), whose memory is
    /// registered. `None` when every buffer is held or in flight after reaping
    /// completions (treat it as [`SocketError::WouldBlock`]), or when a new one
    /// could not be registered.
    pub fn take_tx_buf(&mut self) -> Option<TxBuf> {
        if self.tx_pool.free.is_empty() {
            self.reap_sends();
        }
        let index = match self.tx_pool.free.pop() {
            Some(i) => i,
            None if self.tx_pool.live < self.tx_pool.max => self.create_tx_buf()?,
            None => {
                self.stats.tx_bufs_exhausted += 1;
                return None;
            }
        };
        self.tx_pool.state[index as usize] = TxState::Lent;
        self.tx_vec_at(index).clear();
        Some(TxBuf {
            socket: self.tx_pool.socket,
            index,
        })
    }

    /// Register one more buffer; its index.
    fn create_tx_buf(&mut self) -> Option<u32> {
        let mut r = Region::new_vec(self.tx_pool.capacity);
        if let Err(e) = self.qp.register(&mut r) {
            tracing::warn!(%e, "registering a transmit buffer failed");
            self.stats.tx_buf_failures += 1;
            return None;
        }
        let region = self.mem.push(r);
        let index = self.tx_pool.regions.len() as u32;
        self.tx_pool.regions.push(region);
        self.tx_pool.state.push(TxState::Free);
        self.tx_pool.live += 1;
        self.stats.tx_bufs_created += 1;
        Some(index)
    }

    /// Transmit buffers (lent, in flight) now: diagnostics and tests.
    pub fn tx_buf_counts(&self) -> (usize, usize) {
        let count = |st| self.tx_pool.state.iter().filter(|s| **s == st).count();
        (count(TxState::Lent), count(TxState::InFlight))
    }

    /// Capacity in bytes of every transmit buffer: [`max_segments`](Self::max_segments)
    /// × [`mtu`](Self::mtu), what quinn-proto needs for a full GSO batch.
    pub fn tx_buf_capacity(&self) -> usize {
        self.tx_pool.capacity
    }

    /// The `Vec` of a lent buffer, to write a transmit into. Growing it past
    /// its capacity is allowed but costs the zero copy: the reallocation frees
    /// the registered memory, so [`send_tx_buf`](Self::send_tx_buf) then copies.
    ///
    /// # Panics
    /// If `buf` was lent by another socket.
    pub fn tx_vec(&mut self, buf: &TxBuf) -> &mut Vec<u8> {
        self.check_owner(buf);
        self.tx_vec_at(buf.index)
    }

    /// What a lent buffer holds.
    ///
    /// # Panics
    /// If `buf` was lent by another socket.
    pub fn tx_bytes(&self, buf: &TxBuf) -> &[u8] {
        self.check_owner(buf);
        self.mem
            .region(self.tx_pool.regions[buf.index as usize])
            .and_then(|r| r.slice(0, r.written()))
            .unwrap_or(&[])
    }

    /// Hand a lent buffer back unsent.
    ///
    /// # Panics
    /// If `buf` was lent by another socket.
    pub fn return_tx_buf(&mut self, buf: TxBuf) {
        self.check_owner(&buf);
        self.tx_pool.give_back(buf.index);
    }

    /// [`send_with_imm`](Self::send_with_imm) of the first `len` bytes of a lent
    /// buffer, without copying them: each segment's WR points into the buffer,
    /// which returns to the pool once the completion covering its last WR is
    /// reaped. All or nothing, like `send_with_imm`: on
    /// [`TxSendError::WouldBlock`] nothing was posted and the buffer comes back
    /// with its bytes for a retry. Segments at or under the inline threshold
    /// are sent inline (the provider copies them at post time).
    ///
    /// If the buffer's `Vec` reallocated while it was lent, its registered
    /// memory is gone: the transmit is sent through the copying path instead,
    /// the buffer is given fresh registered memory, and
    /// [`SocketStats::tx_buf_reallocations`](super::SocketStats::tx_buf_reallocations) counts it.
    ///
    /// # Panics
    /// If `buf` was lent by another socket.
    pub fn send_tx_buf(
        &mut self,
        buf: TxBuf,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        len: usize,
        segment_size: Option<usize>,
    ) -> Result<(), TxSendError> {
        self.check_owner(&buf);
        let index = buf.index;
        let region = self.tx_pool.regions[index as usize];
        let r = self
            .mem
            .region(region)
            .expect("transmit buffers are regions");
        if !r.intact() {
            return self.send_reallocated(buf, dest, ecn, imm, len, segment_size);
        }
        let written = r.written();
        if len > written {
            self.tx_pool.give_back(index);
            return Err(TxSendError::Failed(SocketError::Config(format!(
                "send of {len} bytes from a transmit buffer holding {written}"
            ))));
        }
        if len == 0 {
            // `send_with_imm` posts nothing for an empty datagram either.
            self.tx_pool.give_back(index);
            return Ok(());
        }
        let payload = Payload::Registered {
            region,
            lkey: r.lkey().unwrap_or(0),
            len,
        };
        match self.post_datagram(dest, ecn, imm, payload, segment_size) {
            Ok(()) => {
                self.stats.tx_buf_sends += 1;
                self.hold_until_completed(index);
                Ok(())
            }
            Err(SocketError::WouldBlock) => Err(TxSendError::WouldBlock(buf)),
            Err(e @ SocketError::PartiallyPosted { .. }) => {
                self.hold_until_completed(index);
                Err(TxSendError::Failed(e))
            }
            Err(e) => {
                self.tx_pool.give_back(index);
                Err(TxSendError::Failed(e))
            }
        }
    }

    /// The WRs just posted from buffer `index` are the newest in flight: the
    /// last of them gives the buffer back when it is retired (a completion
    /// retires every earlier WR too, so none still points into it then).
    fn hold_until_completed(&mut self, index: u32) {
        let last = self
            .inflight
            .back_mut()
            .expect("a post from the buffer left a WR in flight");
        debug_assert!(last.tx_buf.is_none());
        last.tx_buf = Some(index);
        self.tx_pool.state[index as usize] = TxState::InFlight;
    }

    /// [`send_tx_buf`](Self::send_tx_buf) of a buffer whose `Vec` moved: never
    /// post from it. Copy the transmit out through the copying path, and give
    /// the buffer fresh registered memory, deregistering the old region first
    /// so no memory registration is left over memory the allocator freed.
    fn send_reallocated(
        &mut self,
        buf: TxBuf,
        dest: UdAddr,
        ecn: u8,
        imm: Option<u32>,
        len: usize,
        segment_size: Option<usize>,
    ) -> Result<(), TxSendError> {
        let index = buf.index;
        self.stats.tx_buf_reallocations += 1;
        tracing::warn!(
            capacity = self.tx_pool.capacity,
            "a transmit buffer reallocated while lent; sending by copy and replacing it"
        );
        let region = self.tx_pool.regions[index as usize];
        let stale = self
            .mem
            .region_mut(region)
            .and_then(Region::take_vec)
            .unwrap_or_default();
        let renewed = self.renew_tx_region(index);
        let Some(data) = stale.get(..len) else {
            if renewed {
                self.tx_pool.give_back(index);
            }
            return Err(TxSendError::Failed(SocketError::Config(format!(
                "send of {len} bytes from a transmit buffer holding {}",
                stale.len()
            ))));
        };
        match self.send_with_imm(dest, ecn, imm, data, segment_size) {
            // Keep the bytes for the retry, in the buffer's new memory (a copy
            // the copying path would have made anyway).
            Err(SocketError::WouldBlock) if renewed => {
                self.tx_vec_at(index).extend_from_slice(data);
                Err(TxSendError::WouldBlock(buf))
            }
            r => {
                if renewed {
                    self.tx_pool.give_back(index);
                }
                r.map_err(TxSendError::Failed)
            }
        }
    }

    /// Replace buffer `index`'s region (whose memory moved) by a freshly
    /// registered one at the same index of `mem`, deregistering the old one.
    /// `false` if no new region could be registered: the old one is then
    /// deregistered in place (its lkey resolves nowhere) and the buffer is dead
    /// from then on; a later [`take_tx_buf`](Self::take_tx_buf) may create
    /// another in its place.
    fn renew_tx_region(&mut self, index: u32) -> bool {
        let region = self.tx_pool.regions[index as usize];
        let mut fresh = Region::new_vec(self.tx_pool.capacity);
        let renewed = match self.qp.register(&mut fresh) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%e, "registering a replacement transmit buffer failed");
                false
            }
        };
        let deregistered = if renewed {
            let mut old = self
                .mem
                .replace(region, fresh)
                .expect("transmit buffers are regions");
            self.qp.deregister(&mut old)
        } else {
            match self.mem.region_mut(region) {
                Some(old) => self.qp.deregister(old),
                None => Ok(()),
            }
        };
        if let Err(e) = deregistered {
            tracing::warn!(%e, "deregistering a moved transmit buffer failed");
        }
        if !renewed {
            self.tx_pool.state[index as usize] = TxState::Dead;
            self.tx_pool.live -= 1;
            self.stats.tx_buf_failures += 1;
        }
        renewed
    }

    fn tx_vec_at(&mut self, index: u32) -> &mut Vec<u8> {
        self.mem
            .region_mut(self.tx_pool.regions[index as usize])
            .and_then(Region::vec_mut)
            .expect("transmit buffers are Vec-backed regions")
    }

    fn check_owner(&self, buf: &TxBuf) {
        assert_eq!(
            buf.socket, self.tx_pool.socket,
            "a transmit buffer is used on a socket that did not lend it"
        );
    }
}
