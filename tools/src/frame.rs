//! Length-prefixed frames and their fields, the one codec under both
//! channels' protocols (`image::wire`'s `qr-image/1`, `kv::frame`): a 4-byte
//! big-endian length, then the message; inside it, integers big-endian and
//! strings as a length field then UTF-8. What differs between the protocols
//! is a parameter here — the frame length's bounds and each string's length
//! width and limit ([`StrField`]) — so each keeps its exact bytes.
//!
//! Decoding never panics and never trusts a length before checking it: a
//! frame longer than its protocol allows is refused from its 4-byte prefix,
//! before its bytes are waited for.

use std::ops::RangeInclusive;

use bytes::BufMut;

/// Bytes of a frame's length prefix.
pub const PREFIX: usize = 4;

/// The width of a string's length field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StrWidth {
    /// One byte: strings of at most 255 bytes.
    U8,
    /// Two bytes, big-endian: strings of at most 65 535 bytes.
    U16,
}

impl StrWidth {
    /// The longest string the width can state.
    pub const fn max(self) -> usize {
        match self {
            StrWidth::U8 => u8::MAX as usize,
            StrWidth::U16 => u16::MAX as usize,
        }
    }
}

/// How a protocol writes one kind of string field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StrField {
    /// Width of the length field.
    pub width: StrWidth,
    /// Longest string in bytes (at most `width.max()`): longer ones are cut
    /// when written and refused when read.
    pub max: usize,
}

impl StrField {
    /// Strings of up to `max` bytes (capped at what `width` can state).
    pub const fn new(width: StrWidth, max: usize) -> StrField {
        let cap = width.max();
        StrField {
            width,
            max: if max < cap { max } else { cap },
        }
    }
}

/// Why a message's fields do not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// The message ended before a field did.
    #[error("truncated message")]
    Truncated,
    /// Bytes after the last field.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A string's length field states more than its [`StrField::max`].
    #[error("string of {len} bytes exceeds the {max}-byte limit")]
    TooLong {
        /// The stated length.
        len: usize,
        /// The field's limit.
        max: usize,
    },
    /// A string field that is not UTF-8.
    #[error("a string field is not UTF-8")]
    Utf8,
}

/// The message length the frame at the front of `b` states: `Ok(None)` until
/// its prefix is there; `Err(len)` when the length is outside `bounds`.
pub fn declared_len(b: &[u8], bounds: RangeInclusive<usize>) -> Result<Option<usize>, usize> {
    let Some(p) = b.first_chunk::<PREFIX>() else {
        return Ok(None);
    };
    let n = u32::from_be_bytes(*p) as usize;
    if !bounds.contains(&n) {
        return Err(n);
    }
    Ok(Some(n))
}

/// Split one frame off the front of `b`: `Ok(None)` while more bytes are
/// needed, else its message and the bytes it took (prefix included);
/// `Err(len)` as [`declared_len`].
pub fn split(b: &[u8], bounds: RangeInclusive<usize>) -> Result<Option<(&[u8], usize)>, usize> {
    let Some(n) = declared_len(b, bounds)? else {
        return Ok(None);
    };
    Ok(b.get(PREFIX..PREFIX + n).map(|m| (m, PREFIX + n)))
}

/// The length prefix of a message of `len` bytes (`len` fits 32 bits: every
/// protocol's limit is far below).
pub fn prefix(len: usize) -> [u8; PREFIX] {
    debug_assert!(u32::try_from(len).is_ok());
    (len as u32).to_be_bytes()
}

/// Append one frame to `out`: a prefix, what `message` appends, then the
/// prefix set to the message's length.
pub fn write<B: BufMut + AsMut<[u8]>>(out: &mut B, message: impl FnOnce(&mut B)) {
    let start = out.as_mut().len();
    out.put_slice(&[0; PREFIX]);
    message(out);
    let len = out.as_mut().len() - start - PREFIX;
    out.as_mut()[start..start + PREFIX].copy_from_slice(&prefix(len));
}

/// Append `s` as a string field: cut to `field.max` bytes at a character
/// boundary rather than refused (names, ids and messages; never over-long
/// on the wire).
pub fn put_str<B: BufMut>(out: &mut B, s: &str, field: StrField) {
    let mut end = s.len().min(field.max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    match field.width {
        StrWidth::U8 => out.put_u8(end as u8),
        StrWidth::U16 => out.put_u16(end as u16),
    }
    out.put_slice(&s.as_bytes()[..end]);
}

/// Reads a message's fields front to back.
#[derive(Clone, Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A reader of `message`.
    pub fn new(message: &'a [u8]) -> Reader<'a> {
        Reader(message)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FieldError> {
        if self.0.len() < n {
            return Err(FieldError::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], FieldError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, FieldError> {
        Ok(self.take(1)?[0])
    }

    /// A big-endian `u64`.
    pub fn u64(&mut self) -> Result<u64, FieldError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A string field written by [`put_str`] with the same `field`.
    pub fn str(&mut self, field: StrField) -> Result<String, FieldError> {
        let len = match field.width {
            StrWidth::U8 => usize::from(self.u8()?),
            StrWidth::U16 => usize::from(u16::from_be_bytes(self.array()?)),
        };
        if len > field.max {
            return Err(FieldError::TooLong {
                len,
                max: field.max,
            });
        }
        let b = self.take(len)?;
        String::from_utf8(b.to_vec()).map_err(|_| FieldError::Utf8)
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        self.0
    }

    /// The message is over: `Trailing` if bytes are left.
    pub fn end(self) -> Result<(), FieldError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(FieldError::Trailing(n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BOUNDS: RangeInclusive<usize> = 0..=300;

    fn field() -> impl Strategy<Value = StrField> {
        (any::<bool>(), 0usize..300).prop_map(|(wide, max)| {
            StrField::new(if wide { StrWidth::U16 } else { StrWidth::U8 }, max)
        })
    }

    proptest! {
        /// Frames of fields, cut into arbitrary pieces, split and read back:
        /// numbers exactly, strings as their longest prefix within the field's
        /// limit that ends on a character boundary.
        #[test]
        fn frames_of_fields_round_trip_in_pieces(
            msgs in proptest::collection::vec((any::<u64>(), ".{0,80}", field()), 1..6),
            cut in 1usize..50,
        ) {
            let mut wire = Vec::new();
            for (n, s, f) in &msgs {
                write(&mut wire, |o| {
                    o.put_u64(*n);
                    put_str(o, s, *f);
                });
            }
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                buf.extend_from_slice(piece);
                while let Some((m, used)) = split(&buf, 0..=usize::MAX).unwrap() {
                    got.push(m.to_vec());
                    buf.drain(..used);
                }
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got.len(), msgs.len());
            for (m, (n, s, f)) in got.iter().zip(&msgs) {
                let mut r = Reader::new(m);
                prop_assert_eq!(r.u64().unwrap(), *n);
                let back = r.str(*f).unwrap();
                prop_assert!(back.len() <= f.max && s.starts_with(&back));
                prop_assert!(back.len() == s.len() || back.len() + 4 > f.max);
                prop_assert_eq!(r.end(), Ok(()));
            }
        }

        /// Arbitrary bytes: no panic, a split never passes the input, a
        /// length outside the bounds is refused from the prefix alone.
        #[test]
        fn garbage_is_refused_never_panics(b in proptest::collection::vec(any::<u8>(), 0..400), f in field()) {
            match split(&b, BOUNDS) {
                Ok(Some((m, used))) => {
                    prop_assert_eq!(used, m.len() + PREFIX);
                    prop_assert!(used <= b.len());
                }
                Ok(None) => prop_assert!(b.len() < PREFIX || b.len() < PREFIX + declared_len(&b, BOUNDS).unwrap().unwrap()),
                Err(n) => {
                    prop_assert!(n > *BOUNDS.end());
                    prop_assert_eq!(declared_len(&b[..PREFIX], BOUNDS), Err(n));
                }
            }
            let mut r = Reader::new(&b);
            while r.str(f).is_ok() {}
        }
    }

    #[test]
    fn the_two_widths_bytes() {
        let mut a = Vec::new();
        put_str(&mut a, "héllo", StrField::new(StrWidth::U8, 255));
        assert_eq!(a, b"\x06h\xc3\xa9llo");
        let mut b = Vec::new();
        put_str(&mut b, "héllo", StrField::new(StrWidth::U16, 2));
        // Cut at 2 would split "é": cut at 1.
        assert_eq!(b, b"\x00\x01h");
        let mut r = Reader::new(b"\x03abc");
        assert_eq!(
            r.str(StrField::new(StrWidth::U8, 2)),
            Err(FieldError::TooLong { len: 3, max: 2 })
        );
        let mut f = Vec::new();
        write(&mut f, |o| o.put_slice(b"abc"));
        assert_eq!(f, b"\0\0\0\x03abc");
        assert_eq!(split(&f, 0..=2), Err(3));
        assert_eq!(split(&f[..5], 0..=3), Ok(None));
        assert_eq!(split(&f, 3..=3), Ok(Some((&b"abc"[..], 7))));
    }
}
