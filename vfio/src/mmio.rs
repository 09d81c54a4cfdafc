//! Mapped BAR access and the barriers that order it.
//!
//! A BAR mapped into the process is device memory: every access is a
//! volatile load or store of the width the device expects, and mlx5's
//! registers are big-endian. [`Mmio`] is the only type that touches such a
//! mapping; it is a concrete type so the doorbell path stays monomorphic.

use std::sync::atomic::{fence, Ordering};

use vm_memory::mmap::MmapRegion;

use crate::{Error, Result};

/// Orders DMA-memory writes (a WQE, a command entry) before a later write
/// that tells the device to look (a doorbell record, an ownership bit).
#[inline(always)]
pub fn dma_wmb() {
    fence(Ordering::Release);
}

/// Orders a DMA-memory read that saw the device's signal (an owner bit)
/// before the reads of what it guards (the CQE, the command output).
#[inline(always)]
pub fn dma_rmb() {
    fence(Ordering::Acquire);
}

/// Orders every earlier store, to memory or write-combining MMIO, before the
/// next MMIO store (the kernel's `wmb()` before a doorbell).
#[inline(always)]
pub fn mmio_wmb() {
    fence(Ordering::SeqCst);
}

/// One mapped region of a BAR: `len` bytes starting at BAR offset `bar_offset`.
#[derive(Debug)]
pub struct Mmio {
    region: MmapRegion<()>,
    bar_offset: u64,
}

// SAFETY: `Mmio` only hands out volatile accesses to the mapping, which the
// device reads and writes concurrently anyway; there is no interior state to
// race on, so moving it to another thread or sharing it is sound.
unsafe impl Send for Mmio {}
// SAFETY: as above: every access is a volatile load or store.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// Wraps a mapping of a BAR area that starts at `bar_offset` in the BAR.
    pub fn new(region: MmapRegion<()>, bar_offset: u64) -> Self {
        Self { region, bar_offset }
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.region.size()
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.region.size() == 0
    }

    /// Where the mapping starts in the BAR.
    pub fn bar_offset(&self) -> u64 {
        self.bar_offset
    }

    #[inline(always)]
    fn ptr<T>(&self, offset: usize) -> Result<*mut T> {
        let size = std::mem::size_of::<T>();
        if offset % size != 0 || offset.checked_add(size).is_none_or(|e| e > self.len()) {
            return Err(self.oob(offset, size));
        }
        // The pointer stays inside the mapping: checked just above.
        Ok(self.region.as_ptr().wrapping_add(offset).cast())
    }

    #[cold]
    #[inline(never)]
    fn oob(&self, offset: usize, size: usize) -> Error {
        Error::OutOfBounds {
            what: "mapped BAR",
            offset: offset as u64,
            len: size as u64,
            size: self.len() as u64,
        }
    }

    /// Reads the big-endian 32-bit register at `offset` (4-byte aligned).
    #[inline]
    pub fn read32_be(&self, offset: usize) -> Result<u32> {
        let p = self.ptr::<u32>(offset)?;
        // SAFETY: `p` is aligned and inside the live mapping (checked by
        // `ptr`); a volatile read is how device memory must be read.
        Ok(u32::from_be(unsafe { p.read_volatile() }))
    }

    /// Writes the big-endian 32-bit register at `offset` (4-byte aligned).
    #[inline]
    pub fn write32_be(&self, offset: usize, value: u32) -> Result<()> {
        let p = self.ptr::<u32>(offset)?;
        // SAFETY: `p` is aligned and inside the live mapping (checked by
        // `ptr`); a volatile write is how device memory must be written.
        unsafe { p.write_volatile(value.to_be()) };
        Ok(())
    }

    /// Writes 8 bytes at `offset` (8-byte aligned) as one 64-bit store, as
    /// the device requires for UAR doorbells.
    #[inline]
    pub fn write64_raw(&self, offset: usize, bytes: [u8; 8]) -> Result<()> {
        let p = self.ptr::<u64>(offset)?;
        // SAFETY: `p` is aligned and inside the live mapping (checked by
        // `ptr`); one volatile 64-bit store keeps the doorbell atomic.
        unsafe { p.write_volatile(u64::from_ne_bytes(bytes)) };
        Ok(())
    }

    /// Writes the 64 bytes `words` (in-memory byte order) at `offset`
    /// (64-byte aligned, as BlueFlame buffers are) as eight 64-bit stores, checked once: the BlueFlame
    /// copy of a one-block WQE.
    #[inline]
    pub fn write_block64(&self, offset: usize, words: &[u64; 8]) -> Result<()> {
        let p = self.ptr::<[u64; 8]>(offset)?.cast::<u64>();
        for (i, w) in words.iter().enumerate() {
            // SAFETY: `p .. p + 64` is inside the live mapping and 8-byte
            // aligned (`ptr` checked the 64 bytes at `offset`, a multiple
            // of 64); each qword is one volatile 64-bit store.
            unsafe { p.wrapping_add(i).write_volatile(*w) };
        }
        Ok(())
    }

    /// Copies `data` (a multiple of 8 bytes) to `offset` (8-byte aligned) in
    /// 64-bit stores: a BlueFlame write.
    #[inline]
    pub fn write_blueflame(&self, offset: usize, data: &[u8]) -> Result<()> {
        if data.len() % 8 != 0 {
            return Err(Error::OutOfBounds {
                what: "BlueFlame copy (not whole qwords)",
                offset: offset as u64,
                len: data.len() as u64,
                size: self.len() as u64,
            });
        }
        for (i, q) in data.chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(q);
            self.write64_raw(offset + i * 8, b)?;
        }
        Ok(())
    }
}
