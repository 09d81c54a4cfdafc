//! A ring of fixed-size entries inside a [`DmaBuffer`] (send queue basic
//! blocks, CQEs, a doorbell record), checked once when it is made.
//!
//! The data path touches one entry per work request: its index is masked
//! into the ring, and an access at a constant offset inside the entry needs
//! no bounds or alignment test at run time (the tests on the offset fold
//! away), so a 64-byte WQE is six or eight plain 64-bit stores and a CQE
//! field one load. A non-constant offset is still checked, against the
//! entry size.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crate::dma::DmaBuffer;
use crate::{Error, Result};

/// `2^k` entries of `S` bytes (a power of two) at some offset of a
/// [`DmaBuffer`], which it keeps mapped.
#[derive(Debug, Clone)]
pub struct DmaRing<const S: usize> {
    /// The first entry: inside `buf`'s mapping, aligned to `S.min(8)`.
    base: *mut u8,
    /// Entries - 1.
    mask: u32,
    buf: Arc<DmaBuffer>,
}

// SAFETY: the pointer is into `buf`'s mapping, which the ring keeps alive;
// every access through it is volatile or atomic (memory a device shares),
// so moving or sharing the ring between threads adds no data race that the
// device's concurrent access does not already rule out.
unsafe impl<const S: usize> Send for DmaRing<S> {}
// SAFETY: as above.
unsafe impl<const S: usize> Sync for DmaRing<S> {}

impl<const S: usize> DmaRing<S> {
    /// Alignment of the base: every access of up to 8 bytes at an offset
    /// that is a multiple of its size is then aligned.
    const ALIGN: usize = if S < 8 { S } else { 8 };

    /// `entries` (a power of two) entries from `offset` of `buf`, which must
    /// hold them all; `offset` aligned to `S` (at most 8).
    pub fn new(buf: Arc<DmaBuffer>, offset: usize, entries: u32) -> Result<Self> {
        const { assert!(S.is_power_of_two()) };
        let bytes = (entries as usize).checked_mul(S);
        let end = bytes.and_then(|b| offset.checked_add(b));
        if !entries.is_power_of_two()
            || offset % Self::ALIGN != 0
            || end.is_none_or(|e| e > buf.len())
        {
            return Err(Error::OutOfBounds {
                what: "DMA ring",
                offset: offset as u64,
                len: bytes.unwrap_or(usize::MAX) as u64,
                size: buf.len() as u64,
            });
        }
        // The mapping is page aligned, so `base` is aligned as `offset` is.
        let base = buf.as_ptr().wrapping_add(offset);
        Ok(Self {
            base,
            mask: entries - 1,
            buf,
        })
    }

    /// The number of entries.
    pub fn entries(&self) -> u32 {
        self.mask + 1
    }

    /// The slot index `idx` falls on (`idx` masked into the ring).
    #[inline(always)]
    pub fn slot(&self, idx: u32) -> u32 {
        idx & self.mask
    }

    /// The buffer the ring lies in.
    pub fn buffer(&self) -> &Arc<DmaBuffer> {
        &self.buf
    }

    /// Entry `idx` (masked into the ring).
    #[inline(always)]
    pub fn entry(&self, idx: u32) -> DmaEntry<'_, S> {
        DmaEntry {
            // Inside the ring: `(idx & mask) * S + S <= entries * S`.
            p: self.base.wrapping_add(self.slot(idx) as usize * S),
            _ring: std::marker::PhantomData,
        }
    }

    /// Stores `N` 64-bit words at `off` of entry `idx`: [`DmaEntry::store_words`].
    #[inline(always)]
    pub fn store_words<const N: usize>(
        &self,
        idx: u32,
        off: usize,
        words: &[u64; N],
    ) -> Result<()> {
        self.entry(idx).store_words(off, words)
    }

    /// Loads `N` 64-bit words at `off` of entry `idx`: [`DmaEntry::load_words`].
    #[inline(always)]
    pub fn load_words<const N: usize>(&self, idx: u32, off: usize) -> Result<[u64; N]> {
        self.entry(idx).load_words(off)
    }

    /// Stores a big-endian u32 at `off` of entry `idx`: a doorbell record.
    #[inline(always)]
    pub fn store_u32_be(&self, idx: u32, off: usize, value: u32) -> Result<()> {
        self.entry(idx).store_u32_be(off, value)
    }

    /// Stores `N` 64-bit words at the constant offset `OFF` of entry `idx`:
    /// [`DmaEntry::store_words_at`]. Cannot fail: checked when compiled.
    #[inline(always)]
    pub fn store_words_at<const OFF: usize, const N: usize>(&self, idx: u32, words: &[u64; N]) {
        self.entry(idx).store_words_at::<OFF, N>(words)
    }

    /// Loads `N` 64-bit words at the constant offset `OFF` of entry `idx`:
    /// [`DmaEntry::load_words_at`]. Cannot fail: checked when compiled.
    #[inline(always)]
    pub fn load_words_at<const OFF: usize, const N: usize>(&self, idx: u32) -> [u64; N] {
        self.entry(idx).load_words_at::<OFF, N>()
    }

    /// Stores a big-endian u32 at the constant offset `OFF` of entry `idx`
    /// (a doorbell record). Cannot fail: checked when compiled.
    #[inline(always)]
    pub fn store_u32_be_at<const OFF: usize>(&self, idx: u32, value: u32) {
        self.entry(idx).store_u32_be_at::<OFF>(value)
    }

    /// Stores a big-endian u16 at the constant offset `OFF` of entry `idx`
    /// (an SRQ WQE's `next_wqe_index`). Cannot fail: checked when compiled.
    #[inline(always)]
    pub fn store_u16_be_at<const OFF: usize>(&self, idx: u32, value: u16) {
        self.entry(idx).store_u16_be_at::<OFF>(value)
    }

    /// Loads a big-endian u16 at the constant offset `OFF` of entry `idx`.
    /// Cannot fail: checked when compiled.
    #[inline(always)]
    pub fn load_u16_be_at<const OFF: usize>(&self, idx: u32) -> u16 {
        self.entry(idx).load_u16_be_at::<OFF>()
    }
}

/// One entry of a [`DmaRing`]: its fields at offsets inside the entry,
/// each access one volatile (or atomic) load or store.
#[derive(Debug, Clone, Copy)]
pub struct DmaEntry<'a, const S: usize> {
    /// The entry's first byte: `S` bytes inside a live mapping, aligned to
    /// `S.min(8)`.
    p: *mut u8,
    _ring: std::marker::PhantomData<&'a DmaRing<S>>,
}

impl<const S: usize> DmaEntry<'_, S> {
    /// The address of `len` bytes at `off`, if they lie inside the entry
    /// and `off` is a multiple of `len` (a power of two up to 8, hence
    /// aligned). With constant `off` and `len` the test folds away.
    #[inline(always)]
    fn at(&self, off: usize, len: usize) -> Result<*mut u8> {
        if off % len != 0 || off.checked_add(len).is_none_or(|e| e > S) {
            return Err(oob(off, len, S));
        }
        Ok(self.p.wrapping_add(off))
    }

    /// Where `N` words at `off` lie, if inside the entry and 8-byte aligned.
    #[inline(always)]
    fn words_at<const N: usize>(&self, off: usize) -> Result<*mut u64> {
        if off % 8 != 0 || off.checked_add(N * 8).is_none_or(|e| e > S) {
            return Err(oob(off, N * 8, S));
        }
        Ok(self.p.wrapping_add(off).cast())
    }

    /// Stores `N` 64-bit words at `off` (8-byte aligned), each in one
    /// volatile store of its in-memory bytes: the segments of a WQE built
    /// in registers.
    #[inline(always)]
    pub fn store_words<const N: usize>(&self, off: usize, words: &[u64; N]) -> Result<()> {
        // `p .. p + 8N` lies inside the entry (checked by `words_at`), which
        // lies inside the live mapping (checked by `DmaRing::new`), and is
        // 8-byte aligned (the entry and `off` are); memory shared with a
        // device is only accessed volatile, so no reference aliases it.
        let p = self.words_at::<N>(off)?;
        for (i, w) in words.iter().enumerate() {
            // SAFETY: in bounds, aligned, volatile (see above).
            unsafe { p.wrapping_add(i).write_volatile(*w) };
        }
        Ok(())
    }

    // The `_at` accessors take a constant offset and assert when the caller
    // is compiled that it lies inside the entry and is aligned (a wrong
    // offset is a build error, not a run-time one), so the data path's
    // stores at fixed offsets return nothing to discard.

    /// Stores `N` 64-bit words at the constant offset `OFF` (8-byte
    /// aligned, inside the entry: checked when compiled).
    #[inline(always)]
    pub fn store_words_at<const OFF: usize, const N: usize>(&self, words: &[u64; N]) {
        const {
            assert!(
                OFF % 8 == 0 && OFF + 8 * N <= S,
                "outside the entry or misaligned"
            )
        };
        let p = self.p.wrapping_add(OFF).cast::<u64>();
        for (i, w) in words.iter().enumerate() {
            // SAFETY: `p .. p + 8N` is inside the entry and 8-byte aligned
            // (asserted at compile time just above), the entry inside the
            // live mapping (checked by `DmaRing::new`); volatile, as all
            // memory a device shares.
            unsafe { p.wrapping_add(i).write_volatile(*w) };
        }
    }

    /// Loads `N` 64-bit words at the constant offset `OFF` (in-memory byte
    /// order; inside the entry and aligned: checked when compiled).
    #[inline(always)]
    pub fn load_words_at<const OFF: usize, const N: usize>(&self) -> [u64; N] {
        const {
            assert!(
                OFF % 8 == 0 && OFF + 8 * N <= S,
                "outside the entry or misaligned"
            )
        };
        let p = self.p.wrapping_add(OFF).cast::<u64>();
        let mut out = [0u64; N];
        for (i, w) in out.iter_mut().enumerate() {
            // SAFETY: as in `store_words_at`: inside the entry, aligned, volatile.
            *w = unsafe { p.wrapping_add(i).read_volatile() };
        }
        out
    }

    /// Stores a big-endian u32 at the constant offset `OFF` (checked when
    /// compiled) in one volatile store.
    #[inline(always)]
    pub fn store_u32_be_at<const OFF: usize>(&self, value: u32) {
        const {
            assert!(
                OFF % 4 == 0 && OFF + 4 <= S,
                "outside the entry or misaligned"
            )
        };
        let p = self.p.wrapping_add(OFF).cast::<u32>();
        // SAFETY: inside the entry and the mapping, 4-byte aligned (asserted
        // at compile time just above); volatile.
        unsafe { p.write_volatile(value.to_be()) };
    }

    /// Stores a big-endian u16 at the constant offset `OFF` (checked when
    /// compiled) in one volatile store.
    #[inline(always)]
    pub fn store_u16_be_at<const OFF: usize>(&self, value: u16) {
        const {
            assert!(
                OFF % 2 == 0 && OFF + 2 <= S,
                "outside the entry or misaligned"
            )
        };
        let p = self.p.wrapping_add(OFF).cast::<u16>();
        // SAFETY: inside the entry and the mapping, 2-byte aligned (asserted
        // at compile time just above); volatile.
        unsafe { p.write_volatile(value.to_be()) };
    }

    /// Loads a big-endian u16 at the constant offset `OFF` (checked when
    /// compiled) in one volatile load.
    #[inline(always)]
    pub fn load_u16_be_at<const OFF: usize>(&self) -> u16 {
        const {
            assert!(
                OFF % 2 == 0 && OFF + 2 <= S,
                "outside the entry or misaligned"
            )
        };
        let p = self.p.wrapping_add(OFF).cast::<u16>();
        // SAFETY: inside the entry and the mapping, 2-byte aligned (asserted
        // at compile time just above); volatile.
        u16::from_be(unsafe { p.read_volatile() })
    }

    /// Loads `N` 64-bit words at `off` (8-byte aligned), each in one
    /// volatile load (in-memory byte order).
    #[inline(always)]
    pub fn load_words<const N: usize>(&self, off: usize) -> Result<[u64; N]> {
        let p = self.words_at::<N>(off)?;
        let mut out = [0u64; N];
        for (i, w) in out.iter_mut().enumerate() {
            // SAFETY: as in `store_words`: inside the entry, aligned, volatile.
            *w = unsafe { p.wrapping_add(i).read_volatile() };
        }
        Ok(out)
    }

    /// Stores a big-endian u32 at `off` (4-byte aligned) in one volatile
    /// store.
    #[inline(always)]
    pub fn store_u32_be(&self, off: usize, value: u32) -> Result<()> {
        let p = self.at(off, 4)?.cast::<u32>();
        // SAFETY: inside the entry and the mapping, 4-byte aligned (checked); volatile.
        unsafe { p.write_volatile(value.to_be()) };
        Ok(())
    }

    /// Loads the byte at `off` with acquire ordering (an ownership byte):
    /// what the device wrote before it is read after it.
    #[inline(always)]
    pub fn load_u8_acquire(&self, off: usize) -> Result<u8> {
        let p = self.at(off, 1)?;
        // SAFETY: `p` is inside the live mapping (checked); an AtomicU8 has
        // the size and alignment of u8, and this process accesses the byte
        // only atomically or volatile.
        let a = unsafe { AtomicU8::from_ptr(p) };
        Ok(a.load(Ordering::Acquire))
    }

    /// Loads the byte at `off` in one volatile load.
    #[inline(always)]
    pub fn load_u8(&self, off: usize) -> Result<u8> {
        let p = self.at(off, 1)?;
        // SAFETY: inside the entry and the mapping (checked); volatile.
        Ok(unsafe { p.read_volatile() })
    }

    /// Loads a big-endian u16 at `off` (2-byte aligned).
    #[inline(always)]
    pub fn load_u16_be(&self, off: usize) -> Result<u16> {
        let p = self.at(off, 2)?.cast::<u16>();
        // SAFETY: inside the entry and the mapping, 2-byte aligned (checked); volatile.
        Ok(u16::from_be(unsafe { p.read_volatile() }))
    }

    /// Loads a big-endian u32 at `off` (4-byte aligned).
    #[inline(always)]
    pub fn load_u32_be(&self, off: usize) -> Result<u32> {
        let p = self.at(off, 4)?.cast::<u32>();
        // SAFETY: inside the entry and the mapping, 4-byte aligned (checked); volatile.
        Ok(u32::from_be(unsafe { p.read_volatile() }))
    }

    /// Loads a big-endian u64 at `off` (8-byte aligned) with acquire
    /// ordering, in one load: 8 bytes with an ownership byte among them
    /// (a CQE's last 8), which the device writes after the bytes before
    /// it, so that the other 7 come from the same write.
    #[inline(always)]
    pub fn load_u64_be_acquire(&self, off: usize) -> Result<u64> {
        let p = self.at(off, 8)?.cast::<u64>();
        // SAFETY: `p` is inside the live mapping and 8-byte aligned
        // (checked); an AtomicU64 has the size and alignment of u64, and
        // this process accesses the word only atomically or volatile.
        let a = unsafe { AtomicU64::from_ptr(p) };
        Ok(u64::from_be(a.load(Ordering::Acquire)))
    }

    /// Loads a big-endian u64 at `off` (8-byte aligned).
    #[inline(always)]
    pub fn load_u64_be(&self, off: usize) -> Result<u64> {
        let p = self.at(off, 8)?.cast::<u64>();
        // SAFETY: inside the entry and the mapping, 8-byte aligned (checked); volatile.
        Ok(u64::from_be(unsafe { p.read_volatile() }))
    }
}

#[cold]
#[inline(never)]
fn oob(off: usize, len: usize, size: usize) -> Error {
    Error::OutOfBounds {
        what: "DMA ring entry",
        offset: off as u64,
        len: len as u64,
        size: size as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_wrap_and_accesses_stay_inside_them() {
        let b = DmaBuffer::new(8192).unwrap();
        let r = DmaRing::<64>::new(b.clone(), 4096, 64).unwrap();
        assert_eq!(r.entries(), 64);
        r.store_words(
            3,
            8,
            &[
                u64::from_ne_bytes(*b"abcdefgh"),
                u64::from_ne_bytes(*b"ijklmnop"),
            ],
        )
        .unwrap();
        let mut got = [0u8; 16];
        b.read(4096 + 3 * 64 + 8, &mut got).unwrap();
        assert_eq!(&got, b"abcdefghijklmnop");
        // Index 67 is entry 3 again.
        assert_eq!(r.slot(67), 3);
        let w: [u64; 2] = r.load_words(67, 8).unwrap();
        assert_eq!(w[0].to_ne_bytes(), *b"abcdefgh");
        let e = r.entry(3);
        assert_eq!(e.load_u64_be(8).unwrap(), u64::from_be_bytes(*b"abcdefgh"));
        assert_eq!(e.load_u32_be(12).unwrap(), u32::from_be_bytes(*b"efgh"));
        assert_eq!(e.load_u16_be(14).unwrap(), u16::from_be_bytes(*b"gh"));
        assert_eq!(e.load_u8(9).unwrap(), b'b');
        assert_eq!(e.load_u8_acquire(23).unwrap(), b'p');
        r.store_u32_be(63, 60, 0xa1b2_c3d4).unwrap();
        b.read(8188, &mut got[..4]).unwrap();
        assert_eq!(got[..4], [0xa1, 0xb2, 0xc3, 0xd4]);
        // Past the entry, or misaligned: refused, nothing touched.
        assert!(r.store_words(0, 56, &[0u64; 2]).is_err());
        assert!(r.load_words::<1>(0, 4).is_err());
        assert!(r.store_u32_be(0, 62, 1).is_err());
        let e = r.entry(0);
        assert!(e.load_u16_be(63).is_err());
        assert!(e.load_u8(64).is_err());
        assert!(e.load_u8_acquire(64).is_err());
        assert!(e.load_u64_be(60).is_err());
        assert!(e.load_u32_be(usize::MAX - 3).is_err());
    }

    #[test]
    fn a_ring_must_fit_its_buffer_and_be_aligned() {
        let b = DmaBuffer::new(4096).unwrap();
        assert!(DmaRing::<64>::new(b.clone(), 0, 64).is_ok());
        assert!(
            DmaRing::<64>::new(b.clone(), 64, 64).is_err(),
            "past the end"
        );
        assert!(
            DmaRing::<64>::new(b.clone(), 0, 48).is_err(),
            "not a power of two"
        );
        assert!(DmaRing::<64>::new(b.clone(), 4, 1).is_err(), "misaligned");
        assert!(DmaRing::<4>::new(b.clone(), 4, 1).is_ok());
        assert!(DmaRing::<4>::new(b.clone(), 2, 1).is_err(), "misaligned");
        assert!(DmaRing::<4>::new(b, 4094, 1).is_err(), "past the end");
    }
}
