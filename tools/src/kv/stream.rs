//! Frames over quinn streams: the thin IO layer around the sans-IO codec.

use bytes::{Bytes, BytesMut};

use super::error::ChannelError;
use super::frame::Frame;

/// Reads whole frames from a QUIC receive stream.
#[derive(Debug)]
pub struct FrameReader {
    recv: quinn::RecvStream,
    buf: BytesMut,
}

impl FrameReader {
    /// Read frames from `recv`.
    pub fn new(recv: quinn::RecvStream) -> FrameReader {
        FrameReader {
            recv,
            buf: BytesMut::with_capacity(64 << 10),
        }
    }

    /// The next frame; `Ok(None)` at a clean end of stream (between frames).
    pub async fn next(&mut self) -> Result<Option<Frame>, ChannelError> {
        loop {
            if let Some(f) = Frame::decode(&mut self.buf)? {
                return Ok(Some(f));
            }
            match self.recv.read_chunk(256 << 10, true).await? {
                Some(c) => self.buf.extend_from_slice(&c.bytes),
                None if self.buf.is_empty() => return Ok(None),
                None => return Err(ChannelError::Eof("inside a frame")),
            }
        }
    }

    /// The next frame, where the end of the stream is an error.
    pub async fn expect(&mut self, what: &'static str) -> Result<Frame, ChannelError> {
        self.next().await?.ok_or(ChannelError::Eof(what))
    }
}

/// Write one control frame.
pub async fn write_frame(send: &mut quinn::SendStream, f: &Frame) -> Result<(), ChannelError> {
    let mut b = BytesMut::new();
    f.encode(&mut b);
    send.write_all(&b).await?;
    Ok(())
}

/// Write a data chunk: the six header bytes, then the payload without a copy.
pub async fn write_data(send: &mut quinn::SendStream, data: Bytes) -> Result<(), ChannelError> {
    send.write_all(&Frame::data_header(data.len())).await?;
    send.write_chunk(data).await?;
    Ok(())
}
