//! The one pair of bit helpers every PRM layout goes through.
//!
//! PRM layouts (`mlx5_ifc.h`) are big-endian bit strings: bit 0 is the most
//! significant bit of byte 0, and a field of `width` bits at bit offset `off`
//! occupies bits `off .. off + width`, most significant bit first. Linux reads
//! them with `MLX5_GET`, which loads the big-endian dword that holds the field
//! and shifts it out; for a field inside one dword (or a 64-bit aligned
//! 64-bit field) that is exactly the bit-string reading implemented here,
//! which also covers the rare fields that cross a dword boundary.

/// Reads `width` bits (1..=64) at big-endian bit offset `bit_off` of `buf`.
///
/// Bits beyond the end of `buf` read as zero, so a short buffer written by a
/// device can never make a reader panic.
///
/// # Panics
/// If `width` is 0 or greater than 64 (a programming error in a layout).
#[inline]
pub fn get_bits(buf: &[u8], bit_off: usize, width: usize) -> u64 {
    assert!(
        (1..=64).contains(&width),
        "field width {width} out of 1..=64"
    );
    // Fast path, as MLX5_GET: the field lies inside one big-endian dword.
    let dw = bit_off / 32 * 4;
    if bit_off % 32 + width <= 32 {
        if let Some(b) = buf.get(dw..dw + 4) {
            let v = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            let shift = 32 - bit_off % 32 - width;
            return u64::from(v >> shift) & (u64::MAX >> (64 - width));
        }
    }
    let first = bit_off / 8;
    let last = (bit_off + width - 1) / 8;
    let mut acc: u128 = 0;
    for i in first..=last {
        acc = (acc << 8) | u128::from(buf.get(i).copied().unwrap_or(0));
    }
    let nbits = (last - first + 1) * 8;
    let shift = nbits - (bit_off % 8) - width;
    ((acc >> shift) & mask(width)) as u64
}

/// Writes the low `width` bits (1..=64) of `value` at big-endian bit offset
/// `bit_off` of `buf`, leaving every other bit alone.
///
/// A value wider than the field is a caller bug: it is caught by a
/// `debug_assert!` and masked to the field's width in release builds (as
/// `MLX5_SET` does).
///
/// # Panics
/// If `width` is 0 or greater than 64, or the field does not lie inside `buf`
/// (the caller sized the buffer; emitting into a short one is a bug).
#[inline]
pub fn set_bits(buf: &mut [u8], bit_off: usize, width: usize, value: u64) {
    assert!(
        (1..=64).contains(&width),
        "field width {width} out of 1..=64"
    );
    debug_assert!(
        width == 64 || value >> width == 0,
        "value {value:#x} does not fit a {width}-bit field"
    );
    let first = bit_off / 8;
    let last = (bit_off + width - 1) / 8;
    assert!(
        last < buf.len(),
        "field at bit {bit_off} width {width} lies outside a {}-byte buffer",
        buf.len()
    );
    // Fast path, as MLX5_SET: the field lies inside one big-endian dword.
    let dw = bit_off / 32 * 4;
    if bit_off % 32 + width <= 32 && dw + 4 <= buf.len() {
        let d = &mut buf[dw..dw + 4];
        let shift = 32 - bit_off % 32 - width;
        let m = ((u64::MAX >> (64 - width)) as u32) << shift;
        let old = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
        let new = (old & !m) | (((value as u32) << shift) & m);
        d.copy_from_slice(&new.to_be_bytes());
        return;
    }
    let nbits = (last - first + 1) * 8;
    let shift = nbits - (bit_off % 8) - width;
    let m = mask(width) << shift;
    let mut acc: u128 = 0;
    for b in &buf[first..=last] {
        acc = (acc << 8) | u128::from(*b);
    }
    acc = (acc & !m) | ((u128::from(value) << shift) & m);
    for (i, b) in buf[first..=last].iter_mut().rev().enumerate() {
        *b = (acc >> (8 * i)) as u8;
    }
}

/// A field's place in a layout: bit offset and width, as in `mlx5_ifc.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BitField {
    /// Offset from the start of the layout, in bits (big-endian bit string).
    pub off: usize,
    /// Width in bits (1..=64 for fields read as numbers).
    pub width: usize,
}

impl BitField {
    /// A field of `width` bits at bit offset `off`.
    pub const fn new(off: usize, width: usize) -> Self {
        Self { off, width }
    }

    /// The same field inside a nested layout placed at bit `base`.
    pub const fn at(self, base: usize) -> Self {
        Self::new(base + self.off, self.width)
    }

    /// Reads the field from `buf` (bits beyond the buffer read as zero).
    pub fn get(self, buf: &[u8]) -> u64 {
        get_bits(buf, self.off, self.width)
    }

    /// Writes the field into `buf` (see [`set_bits`]).
    pub fn set(self, buf: &mut [u8], value: u64) {
        set_bits(buf, self.off, self.width, value)
    }
}

/// `buf[start .. start + len]`, clamped to what `buf` holds (possibly
/// empty), so that a view of a short buffer reads as zeros instead of
/// panicking.
#[inline]
pub fn sub(buf: &[u8], start: usize, len: usize) -> &[u8] {
    let s = start.min(buf.len());
    let e = start.saturating_add(len).min(buf.len());
    &buf[s..e]
}

/// Mutable `buf[start .. start + len]`, clamped like [`sub`].
#[inline]
pub fn sub_mut(buf: &mut [u8], start: usize, len: usize) -> &mut [u8] {
    let s = start.min(buf.len());
    let e = start.saturating_add(len).min(buf.len());
    &mut buf[s..e]
}

#[inline]
const fn mask(width: usize) -> u128 {
    (1u128 << width) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The naive reference: one bit at a time.
    fn get_naive(buf: &[u8], off: usize, width: usize) -> u64 {
        let mut v = 0u64;
        for i in 0..width {
            let bit = off + i;
            let b = buf.get(bit / 8).copied().unwrap_or(0);
            v = (v << 1) | u64::from((b >> (7 - bit % 8)) & 1);
        }
        v
    }

    fn set_naive(buf: &mut [u8], off: usize, width: usize, value: u64) {
        for i in 0..width {
            let bit = off + i;
            let v = (value >> (width - 1 - i)) & 1;
            let m = 1u8 << (7 - bit % 8);
            if v == 1 {
                buf[bit / 8] |= m;
            } else {
                buf[bit / 8] &= !m;
            }
        }
    }

    /// A small deterministic generator so the test needs no crate.
    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn every_offset_and_width_matches_the_naive_reference() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut buf = [0u8; 24];
        for b in buf.iter_mut() {
            *b = xorshift(&mut seed) as u8;
        }
        for width in 1..=64 {
            for off in 0..=(buf.len() * 8 - width) {
                assert_eq!(get_bits(&buf, off, width), get_naive(&buf, off, width));
                let value = xorshift(&mut seed) & (u64::MAX >> (64 - width));
                let mut a = buf;
                let mut b = buf;
                set_bits(&mut a, off, width, value);
                set_naive(&mut b, off, width, value);
                assert_eq!(a, b, "set off {off} width {width}");
                assert_eq!(get_bits(&a, off, width), value);
            }
        }
    }

    #[test]
    fn mlx5_get_semantics() {
        // create_cq_in: opcode is bits 0..16 of dword 0, big-endian.
        let buf = [0x04, 0x00, 0x12, 0x34, 0, 0, 0, 0];
        assert_eq!(get_bits(&buf, 0, 16), 0x400);
        assert_eq!(get_bits(&buf, 16, 16), 0x1234);
        // A 4-bit field at bit 4 of a dword.
        assert_eq!(get_bits(&[0xab, 0, 0, 0], 4, 4), 0xb);
    }

    #[test]
    fn short_buffers_read_as_zero() {
        assert_eq!(get_bits(&[0xff], 4, 8), 0xf0);
        assert_eq!(get_bits(&[], 100, 64), 0);
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn set_outside_the_buffer_panics() {
        set_bits(&mut [0u8; 4], 24, 16, 1);
    }
}
