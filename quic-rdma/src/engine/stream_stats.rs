//! Per-stream figures: what the engine saw of each stream (quinn-proto 0.11
//! keeps no per-stream counters an application can read).
//!
//! A stream's row lives while either of its halves is open, then moves to a
//! small ring of ended streams, so its final figures stay readable after the
//! last read or the acknowledgement of its end. Both are reserved when the
//! connection is made; a row is a hash-table slot, so counting a write or a
//! read costs a lookup and never allocates once the table has grown to the
//! connection's peak of live streams.

use std::collections::VecDeque;

use quinn_proto::{Dir, Side, StreamId};
use rustc_hash::FxHashMap;

/// How many ended streams keep their figures per connection.
pub const ENDED_KEPT: usize = 16;

/// Live rows reserved up front per connection (the table grows past it).
const LIVE_RESERVED: usize = 16;

/// What the engine counted on one stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// Bytes the stream took from [`Engine::write`](super::Engine::write) and
    /// [`Engine::write_chunk`](super::Engine::write_chunk).
    pub bytes_written: u64,
    /// Bytes [`Engine::read`](super::Engine::read) delivered.
    pub bytes_read: u64,
    /// Writes that took nothing: stream or connection flow control, or the
    /// send buffer full (the peer is not reading fast enough).
    pub writes_blocked: u64,
    /// Reads that found nothing buffered.
    pub reads_empty: u64,
    /// We marked the end of what we send ([`Engine::finish`](super::Engine::finish)).
    pub finish_sent: bool,
    /// The peer acknowledged everything we sent, the end included.
    pub finish_acked: bool,
    /// The peer's end of data was read.
    pub fin_read: bool,
    /// The peer reset its sending half with this code (RESET_STREAM, RFC 9000 §19.4).
    pub reset_received: Option<u64>,
    /// The peer asked us to stop sending with this code (STOP_SENDING, §19.5).
    pub stop_received: Option<u64>,
    /// Our sending half is open (not finished and acknowledged, reset or stopped).
    pub send_open: bool,
    /// Our receiving half is open (not read to its end or reset, nor stopped by us).
    pub recv_open: bool,
}

impl StreamStats {
    fn ended(&self) -> bool {
        !self.send_open && !self.recv_open
    }
}

/// The rows of one connection.
#[derive(Debug)]
pub(crate) struct StreamTable {
    live: FxHashMap<StreamId, StreamStats>,
    ended: VecDeque<(StreamId, StreamStats)>,
}

impl StreamTable {
    pub(crate) fn new() -> Self {
        let mut live = FxHashMap::default();
        live.reserve(LIVE_RESERVED);
        StreamTable {
            live,
            ended: VecDeque::with_capacity(ENDED_KEPT),
        }
    }

    /// Stream `id` was opened, by us or the peer (`side` is ours): a row with
    /// the halves it has (RFC 9000 §2.1: a unidirectional stream has only
    /// its opener's sending half).
    pub(crate) fn opened(&mut self, id: StreamId, side: Side) {
        let ours = id.initiator() == side;
        let bidi = id.dir() == Dir::Bi;
        self.live.entry(id).or_insert(StreamStats {
            send_open: bidi || ours,
            recv_open: bidi || !ours,
            ..StreamStats::default()
        });
    }

    /// Update `id`'s row, if it has one, and retire it once both halves ended.
    pub(crate) fn update(&mut self, id: StreamId, f: impl FnOnce(&mut StreamStats)) {
        let Some(s) = self.live.get_mut(&id) else {
            return;
        };
        f(s);
        if s.ended() {
            let s = *s;
            self.live.remove(&id);
            if self.ended.len() == ENDED_KEPT {
                self.ended.pop_front();
            }
            self.ended.push_back((id, s));
        }
    }

    /// `id`'s figures: live, or among the last [`ENDED_KEPT`] ended.
    pub(crate) fn get(&self, id: StreamId) -> Option<StreamStats> {
        self.live.get(&id).copied().or_else(|| {
            self.ended
                .iter()
                .rev()
                .find(|(i, _)| *i == id)
                .map(|(_, s)| *s)
        })
    }

    /// Live rows now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.live.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quinn_proto::VarInt;

    fn id(n: u64) -> StreamId {
        StreamId::from(VarInt::from_u32(n as u32))
    }

    #[test]
    fn a_bidi_stream_ends_when_both_halves_do_and_stays_readable() {
        let mut t = StreamTable::new();
        // Stream 0: client-initiated bidirectional (RFC 9000 §2.1).
        t.opened(id(0), Side::Client);
        t.update(id(0), |s| s.bytes_written += 5);
        t.update(id(0), |s| {
            s.finish_acked = true;
            s.send_open = false;
        });
        assert_eq!(t.live(), 1, "the receiving half is still open");
        t.update(id(0), |s| {
            s.fin_read = true;
            s.recv_open = false;
        });
        assert_eq!(t.live(), 0);
        let s = t.get(id(0)).unwrap();
        assert_eq!(
            (s.bytes_written, s.fin_read, s.finish_acked),
            (5, true, true)
        );
        // Updates after the end change nothing.
        t.update(id(0), |s| s.bytes_read += 1);
        assert_eq!(t.get(id(0)).unwrap().bytes_read, 0);
    }

    #[test]
    fn unidirectional_streams_have_one_half_and_ended_rows_are_bounded() {
        let mut t = StreamTable::new();
        // Stream 2: client-initiated unidirectional; 3: server-initiated.
        t.opened(id(2), Side::Client);
        let s = t.get(id(2)).unwrap();
        assert!(s.send_open && !s.recv_open);
        t.opened(id(3), Side::Client);
        let s = t.get(id(3)).unwrap();
        assert!(!s.send_open && s.recv_open);
        for n in 0..(ENDED_KEPT as u64 + 4) {
            let i = id(4 * n + 2);
            t.opened(i, Side::Client);
            t.update(i, |s| s.send_open = false);
        }
        assert!(t.get(id(2)).is_none(), "the oldest ended row was dropped");
        assert!(t.get(id(4 * (ENDED_KEPT as u64 + 3) + 2)).is_some());
        assert_eq!(t.live(), 1, "only stream 3 is live");
    }
}
