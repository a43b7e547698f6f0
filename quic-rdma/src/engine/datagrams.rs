//! Unreliable datagrams (RFC 9221) on a connection.

use bytes::Bytes;
use quinn_proto::SendDatagramError;

use super::{ConnHandle, Engine, EngineError};
use crate::fabric::UdQueuePair;

impl<Q: UdQueuePair> Engine<Q> {
    /// Queue `data` as one datagram. `WouldBlock` when the send buffer is full
    /// (nothing is dropped: the caller decides what goes stale);
    /// [`Event::DatagramsWritable`](super::Event::DatagramsWritable) tells
    /// when there is room again.
    pub fn send_datagram(&mut self, conn: ConnHandle, data: &[u8]) -> Result<(), EngineError> {
        let c = self.conns.get(conn)?;
        c.check_open()?;
        match c
            .inner
            .datagrams()
            .send(Bytes::copy_from_slice(data), false)
        {
            Ok(()) => Ok(()),
            Err(SendDatagramError::TooLarge) => Err(EngineError::DatagramTooLarge {
                len: data.len(),
                max: c.inner.datagrams().max_size().unwrap_or(0),
            }),
            Err(SendDatagramError::UnsupportedByPeer | SendDatagramError::Disabled) => {
                Err(EngineError::DatagramsUnsupported)
            }
            Err(SendDatagramError::Blocked(_)) => Err(EngineError::WouldBlock),
        }
    }

    /// The largest datagram [`send_datagram`](Self::send_datagram) accepts now
    /// (`None` if the peer takes none).
    pub fn max_datagram_size(&mut self, conn: ConnHandle) -> Result<Option<usize>, EngineError> {
        Ok(self.conns.get(conn)?.inner.datagrams().max_size())
    }

    /// Take the next received datagram into `buf`; returns its length.
    /// `WouldBlock` when none is waiting; `BufferTooSmall { needed }` keeps the
    /// datagram for a call with a larger buffer.
    pub fn recv_datagram(
        &mut self,
        conn: ConnHandle,
        buf: &mut [u8],
    ) -> Result<usize, EngineError> {
        let c = self.conns.get(conn)?;
        let d = match c.stashed_datagram.take() {
            Some(d) => d,
            None => match c.inner.datagrams().recv() {
                Some(d) => d,
                None => {
                    c.check_open()?;
                    return Err(EngineError::WouldBlock);
                }
            },
        };
        if d.len() > buf.len() {
            let needed = d.len();
            c.stashed_datagram = Some(d);
            return Err(EngineError::BufferTooSmall { needed });
        }
        buf[..d.len()].copy_from_slice(&d);
        Ok(d.len())
    }
}
