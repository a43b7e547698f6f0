//! The bytes a UD SEND puts around its payload — BTH/DETH/ImmDt before it, pad
//! and ICRC after it — built without touching a copy of the payload, so a
//! sender can gather header, payload (straight from registered memory) and
//! trailer into one `sendmsg` instead of assembling the packet.

use super::header::{encode_head, pad_for, EncodeError, UdHeader, HEAD_MAX, ICRC_LEN};
use super::icrc::{start, IcrcContext};

/// Pad (at most 3 bytes, IBA §9.2.3) and ICRC.
const TAIL_MAX: usize = 3 + ICRC_LEN;

/// The header and trailer of one UD SEND; on the wire the packet is
/// [`head`](Frame::head), the payload, then [`tail`](Frame::tail).
#[derive(Clone, Copy, Debug, Default)]
pub struct Frame {
    head: [u8; HEAD_MAX],
    head_len: u8,
    tail: [u8; TAIL_MAX],
    tail_len: u8,
}

impl Frame {
    /// BTH, DETH and ImmDt (when present).
    pub fn head(&self) -> &[u8] {
        &self.head[..usize::from(self.head_len)]
    }

    /// Pad bytes (zero) and the ICRC, least-significant byte first.
    pub fn tail(&self) -> &[u8] {
        &self.tail[..usize::from(self.tail_len)]
    }
}

/// Frame `payload` as a UD SEND with `header`, its ICRC computed for an IP
/// header carrying identification `ipv4_id` (ignored for IPv6) and the
/// addresses and ports of `ctx`. The payload is read once, by the CRC.
pub fn encode_frame(
    header: &UdHeader,
    payload: &[u8],
    ctx: &IcrcContext,
    ipv4_id: u16,
) -> Result<Frame, EncodeError> {
    let mut f = Frame::default();
    let head_len = encode_head(header, payload.len(), &mut f.head)?;
    let pad = pad_for(payload.len());
    // ICRC input (IBA §7.8.1, Annex A17.4.5.3): the masked prefix and headers,
    // then payload and pad in wire order.
    let mut h = start(
        ctx,
        ipv4_id,
        head_len + payload.len() + pad,
        &f.head[..head_len],
    );
    h.update(payload);
    if pad > 0 {
        h.update(&f.tail[..pad]); // still zero: the pad bytes
    }
    f.tail[pad..pad + ICRC_LEN].copy_from_slice(&h.finalize().to_le_bytes());
    f.head_len = head_len as u8;
    f.tail_len = (pad + ICRC_LEN) as u8;
    Ok(f)
}
