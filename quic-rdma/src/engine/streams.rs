//! Streams: open, write, read into the caller's buffer, finish, reset, stop, priority.

use quinn_proto::{
    ClosedStream, Dir, FinishError, ReadError, ReadableError, StreamId, VarInt, WriteError,
};

use bytes::Bytes;

use super::connection::Conn;
use super::{ConnHandle, Engine, EngineError, StreamStats};
use crate::fabric::UdQueuePair;

/// The outcome of a successful [`Engine::read`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamRead {
    /// Bytes copied into the caller's buffer.
    pub len: usize,
    /// The peer finished the stream and every byte has now been read.
    pub fin: bool,
}

fn code(c: u64) -> Result<VarInt, EngineError> {
    VarInt::from_u64(c).map_err(|_| EngineError::InvalidArgument("error code above 2^62"))
}

fn closed(_: ClosedStream) -> EngineError {
    EngineError::ClosedStream
}

fn write_error(e: WriteError) -> EngineError {
    match e {
        WriteError::Blocked => EngineError::WouldBlock,
        WriteError::Stopped(code) => EngineError::StreamStopped(code.into_inner()),
        WriteError::ClosedStream => EngineError::ClosedStream,
    }
}

/// Count a write's outcome in the stream's figures.
fn count_write(
    c: &mut Conn,
    stream: StreamId,
    r: Result<usize, WriteError>,
) -> Result<usize, EngineError> {
    c.stream_stats.update(stream, |s| match &r {
        Ok(n) => s.bytes_written += *n as u64,
        Err(WriteError::Blocked) => s.writes_blocked += 1,
        Err(WriteError::Stopped(code)) => s.stop_received = Some(code.into_inner()),
        Err(WriteError::ClosedStream) => {}
    });
    r.map_err(write_error)
}

/// The open connection `conn`, if `stream` has a side we may use: quinn-proto
/// asserts (panics) on a receive half of our own unidirectional stream and on
/// a send half of the peer's, so those are refused here as closed streams.
fn usable<Q: UdQueuePair>(
    e: &mut Engine<Q>,
    conn: ConnHandle,
    stream: StreamId,
    send: bool,
) -> Result<&mut Conn, EngineError> {
    let c = e.conns.get(conn)?;
    let ours = stream.initiator() == c.inner.side();
    if stream.dir() == Dir::Uni && ours != send {
        return Err(EngineError::ClosedStream);
    }
    if !c.stream_exists(stream) {
        return Err(EngineError::ClosedStream);
    }
    Ok(c)
}

impl<Q: UdQueuePair> Engine<Q> {
    /// Open a bidirectional stream. `WouldBlock` when the peer's stream limit is
    /// reached ([`Event::StreamsAvailable`](super::Event::StreamsAvailable) tells when to retry).
    pub fn open_bi(&mut self, conn: ConnHandle) -> Result<StreamId, EngineError> {
        self.open(conn, Dir::Bi)
    }

    /// Open a unidirectional (send-only) stream; see [`Engine::open_bi`].
    pub fn open_uni(&mut self, conn: ConnHandle) -> Result<StreamId, EngineError> {
        self.open(conn, Dir::Uni)
    }

    fn open(&mut self, conn: ConnHandle, dir: Dir) -> Result<StreamId, EngineError> {
        let c = self.conns.get(conn)?;
        c.check_open()?;
        let s = c.inner.streams().open(dir).ok_or(EngineError::WouldBlock)?;
        c.note_opened(s);
        Ok(s)
    }

    /// Write as much of `data` as flow control allows; returns the bytes taken
    /// (possibly fewer than offered). `WouldBlock` when none fit
    /// ([`Event::StreamWritable`](super::Event::StreamWritable) tells when to retry);
    /// `StreamStopped` when the peer asked us to stop.
    pub fn write(
        &mut self,
        conn: ConnHandle,
        stream: StreamId,
        data: &[u8],
    ) -> Result<usize, EngineError> {
        // What flow control does not take of a small copy is dropped with it;
        // the chunk is reclaimed once nothing in it is held.
        let small = self.small_copy(data);
        let c = usable(self, conn, stream, true)?;
        c.check_open()?;
        let mut send = c.inner.send_stream(stream);
        let r = match small {
            Some(copy) => send.write_chunks(&mut [copy]).map(|w| w.bytes),
            // Large: quinn-proto copies only the part flow control takes.
            None => send.write(data),
        };
        count_write(c, stream, r)
    }

    /// Like [`Engine::write`] without the copy: quinn-proto keeps a reference
    /// to `data`'s buffer (until the bytes are acknowledged) instead of copying
    /// them. `data` is advanced past what was taken; returns how many bytes that was.
    pub fn write_chunk(
        &mut self,
        conn: ConnHandle,
        stream: StreamId,
        data: &mut Bytes,
    ) -> Result<usize, EngineError> {
        let c = usable(self, conn, stream, true)?;
        c.check_open()?;
        // quinn-proto leaves a partly written chunk advanced in place and a fully
        // written one empty.
        let mut chunks = [std::mem::take(data)];
        let r = c.inner.send_stream(stream).write_chunks(&mut chunks);
        let [rest] = chunks;
        *data = rest;
        count_write(c, stream, r.map(|w| w.bytes))
    }

    /// Mark the end of what we send on `stream`;
    /// [`Event::StreamFinished`](super::Event::StreamFinished) follows once the peer acknowledged all.
    pub fn finish(&mut self, conn: ConnHandle, stream: StreamId) -> Result<(), EngineError> {
        let c = usable(self, conn, stream, true)?;
        c.check_open()?;
        match c.inner.send_stream(stream).finish() {
            Ok(()) => {
                c.stream_stats.update(stream, |s| s.finish_sent = true);
                Ok(())
            }
            Err(FinishError::Stopped(code)) => Err(EngineError::StreamStopped(code.into_inner())),
            Err(FinishError::ClosedStream) => Err(EngineError::ClosedStream),
        }
    }

    /// Abandon sending on `stream` (RESET_STREAM with `error_code`).
    pub fn reset(
        &mut self,
        conn: ConnHandle,
        stream: StreamId,
        error_code: u64,
    ) -> Result<(), EngineError> {
        let code = code(error_code)?;
        let c = usable(self, conn, stream, true)?;
        c.check_open()?;
        c.inner.send_stream(stream).reset(code).map_err(closed)?;
        c.stream_stats.update(stream, |s| s.send_open = false);
        Ok(())
    }

    /// Ask the peer to stop sending on `stream` (STOP_SENDING); unread data is discarded.
    pub fn stop(
        &mut self,
        conn: ConnHandle,
        stream: StreamId,
        error_code: u64,
    ) -> Result<(), EngineError> {
        let code = code(error_code)?;
        let c = usable(self, conn, stream, false)?;
        c.check_open()?;
        c.inner.recv_stream(stream).stop(code).map_err(closed)?;
        c.stream_stats.update(stream, |s| s.recv_open = false);
        Ok(())
    }

    /// Set the send priority of `stream`: higher goes first; equal shares round robin.
    pub fn set_priority(
        &mut self,
        conn: ConnHandle,
        stream: StreamId,
        priority: i32,
    ) -> Result<(), EngineError> {
        let c = usable(self, conn, stream, true)?;
        c.check_open()?;
        c.inner
            .send_stream(stream)
            .set_priority(priority)
            .map_err(closed)
    }

    /// Read in order into `buf`, as much as is there (up to `buf.len()`).
    ///
    /// `Ok { len, fin: true }` once the stream's end was reached (`len` may be 0);
    /// `WouldBlock` when nothing is buffered yet; `StreamReset(code)` if the peer
    /// reset it; `ClosedStream` after the end was read or for a send-only stream.
    pub fn read(
        &mut self,
        conn: ConnHandle,
        stream: StreamId,
        buf: &mut [u8],
    ) -> Result<StreamRead, EngineError> {
        let c = usable(self, conn, stream, false)?;
        let mut rs = c.inner.recv_stream(stream);
        let mut chunks = match rs.read(true) {
            Ok(ch) => ch,
            Err(ReadableError::ClosedStream) => return Err(EngineError::ClosedStream),
            Err(ReadableError::IllegalOrderedRead) => {
                return Err(EngineError::InvalidArgument("ordered read after unordered"))
            }
        };
        let mut len = 0;
        let mut outcome = Ok(false);
        while len < buf.len() {
            match chunks.next(buf.len() - len) {
                Ok(Some(chunk)) => {
                    // The chunk shares the received packet's buffer; copying it out and
                    // dropping it here lets the receive staging buffer be reclaimed.
                    buf[len..len + chunk.bytes.len()].copy_from_slice(&chunk.bytes);
                    len += chunk.bytes.len();
                }
                Ok(None) => {
                    outcome = Ok(true);
                    break;
                }
                Err(ReadError::Blocked) => break,
                Err(ReadError::Reset(code)) => {
                    outcome = Err(code.into_inner());
                    break;
                }
            }
        }
        // Flow-control credit (MAX_STREAM_DATA/MAX_DATA) is queued here and sent
        // on the next flush.
        let _ = chunks.finalize();
        let empty = matches!(outcome, Ok(false)) && len == 0 && !buf.is_empty();
        c.stream_stats.update(stream, |s| {
            s.bytes_read += len as u64;
            match outcome {
                Err(code) => {
                    s.reset_received = Some(code);
                    s.recv_open = false;
                }
                Ok(true) => {
                    s.fin_read = true;
                    s.recv_open = false;
                }
                Ok(false) => s.reads_empty += u64::from(empty),
            }
        });
        match outcome {
            Err(code) => Err(EngineError::StreamReset(code)),
            Ok(_) if empty => {
                c.check_open()?;
                Err(EngineError::WouldBlock)
            }
            Ok(fin) => Ok(StreamRead { len, fin }),
        }
    }

    /// What the engine counted on `stream`: while either half is open, and
    /// for the last [`ENDED_KEPT`](super::ENDED_KEPT) streams of the
    /// connection that ended (`ClosedStream` for others and for ids never opened).
    pub fn stream_stats(
        &self,
        conn: ConnHandle,
        stream: StreamId,
    ) -> Result<StreamStats, EngineError> {
        let c = self.conns.get_ref(conn)?;
        c.stream_stats.get(stream).ok_or(EngineError::ClosedStream)
    }
}
