//! Mapped BAR access and the barriers that order it.
//!
//! A BAR mapped into the process is device memory: every access is a
//! volatile load or store of the width the device expects, and mlx5's
//! registers are big-endian. [`Mmio`] is the only type that touches such a
//! mapping; it is a concrete type so the doorbell path stays monomorphic.

use vm_memory::mmap::MmapRegion;

use crate::{Error, Result};

// The barriers, named and chosen as Linux's: `arch/x86/include/asm/barrier.h`
// and `arch/arm64/include/asm/barrier.h`. On x86-64 stores are not reordered
// with earlier stores, nor loads with earlier loads, also against uncached
// device memory, so the DMA barriers only stop the compiler (`barrier()`),
// and `wmb()` is `sfence` for write-combining (BlueFlame) stores. On arm64 a
// plain Rust fence is `dmb ish`, which orders only within the inner
// shareable domain (the CPUs), not against a device: the DMA barriers use
// the outer shareable domain and `wmb()`/`mb()` a `dsb`, which also waits for
// MMIO stores. Each barrier is one `cfg` block per architecture; any other
// architecture gets the strongest portable fence and a note that it is
// untested there.

/// Orders DMA-memory writes (a WQE, a command entry) before a later write
/// to DMA memory that tells the device to look (a doorbell record, an
/// ownership bit). Linux `dma_wmb()`.
#[inline(always)]
pub fn dma_wmb() {
    // x86: `#define __dma_wmb() barrier()`.
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    // arm64: `#define __dma_wmb() dmb(oshst)`.
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction: touches no register, stack or flag; it
    // only orders memory accesses, which `asm!` without `nomem` also tells
    // the compiler.
    unsafe {
        core::arch::asm!("dmb oshst", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Orders a DMA-memory read that saw the device's signal (an owner bit)
/// before the reads of what it guards (the CQE, the command output). Linux
/// `dma_rmb()`.
#[inline(always)]
pub fn dma_rmb() {
    // x86: `#define __dma_rmb() barrier()`.
    #[cfg(target_arch = "x86_64")]
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    // arm64: `#define __dma_rmb() dmb(oshld)`.
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction, as in `dma_wmb`.
    unsafe {
        core::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Orders every earlier store, to DMA memory or (write-combining) MMIO,
/// before the next MMIO store: before a doorbell (PRM "Send Doorbell" step
/// 4, the command doorbell, the CQ arm). Linux `wmb()`.
#[inline(always)]
pub fn wmb() {
    // x86: `#define wmb() asm volatile("sfence" ::: "memory")`.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a barrier instruction (SSE, part of x86-64's baseline): touches
    // no register, stack or flag; `asm!` without `nomem` is also a compiler
    // barrier.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags))
    };
    // arm64: `#define __wmb() dsb(st)`.
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction, as in `dma_wmb`.
    unsafe {
        core::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Orders every earlier load and store before every later one, MMIO
/// included: EQEs read before the EQ doorbell lets the device reuse them.
/// Linux `mb()`.
#[inline(always)]
pub fn mb() {
    // x86: `#define mb() asm volatile("mfence" ::: "memory")`.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a barrier instruction (SSE2, part of x86-64's baseline), as in
    // `wmb`.
    unsafe {
        core::arch::asm!("mfence", options(nostack, preserves_flags))
    };
    // arm64: `#define __mb() dsb(sy)`.
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction, as in `dma_wmb`.
    unsafe {
        core::arch::asm!("dsb sy", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// Orders write-combining MMIO stores (a BlueFlame copy, a doorbell through
/// a write-combining mapping) out of the CPU's write-combining buffers,
/// before anything later: rdma-core's `mmio_flush_writes()`
/// (`util/udma_barrier.h`), which `providers/mlx5/qp.c` issues after every
/// BlueFlame copy or doorbell, and which also serves as its
/// `mmio_wc_start()` before one. Not needed after a store to an uncached
/// mapping, which leaves the CPU in program order (Linux's mlx5e and
/// mlx5_ib ring uncached doorbells with a `wmb()` before, nothing after).
#[inline(always)]
pub fn mmio_flush_writes() {
    // x86-64: `#define mmio_flush_writes() asm volatile("sfence" ::: "memory")`.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a barrier instruction, as in `wmb`.
    unsafe {
        core::arch::asm!("sfence", options(nostack, preserves_flags))
    };
    // arm64: `#define mmio_flush_writes() asm volatile("dsb st" ::: "memory")`.
    #[cfg(target_arch = "aarch64")]
    // SAFETY: a barrier instruction, as in `dma_wmb`.
    unsafe {
        core::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// The memory type a backend mapped a BAR with: what a store to it does on
/// the way to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemType {
    /// Uncached (x86 UC, arm64 Device-nGnRnE/nGnRE): every store is one bus
    /// write, in program order. What kernel VFIO gives for every BAR
    /// (`vfio_pci_core_mmap` maps with `pgprot_noncached`; upstream vfio-pci
    /// has no write-combining mapping) and what a vfio-user server's
    /// region file descriptor stands for (the spec leaves the type to the
    /// server; assume the strict one). The default when a backend cannot
    /// tell.
    Uncached,
    /// Write-combining (x86 WC, arm64 Normal-NC): stores to a 64-byte line
    /// may merge into one burst and leave the CPU late and out of order
    /// unless flushed ([`mmio_flush_writes`]). What mlx5_ib gives
    /// rdma-core's UAR pages (`MLX5_MMAP_GET_REGULAR_PAGES_CMD`), and the
    /// mapping BlueFlame is meant for.
    WriteCombining,
    /// Ordinary cacheable memory: the in-process model's BAR, a memfd the
    /// model scans. Stores need no flush to be seen by the model's thread.
    WriteBack,
}

impl MemType {
    /// Whether a BlueFlame copy (a whole WQE written to the UAR) pays: only
    /// over write-combining, where the 64 bytes leave as one burst. Over an
    /// uncached mapping the copy is eight separate bus writes, and rdma-core
    /// then maps the UAR non-cached and skips BlueFlame (`MLX5_SHUT_UP_BF`:
    /// `MLX5_UAR_TYPE_NC`, `!ctx->shut_up_bf` in `_mlx5_post_send`); over
    /// ordinary memory (the model) the copy is wasted work.
    pub fn blueflame(self) -> bool {
        self == Self::WriteCombining
    }

    /// Whether stores through this mapping must be flushed with
    /// [`mmio_flush_writes`] after a doorbell or BlueFlame copy.
    pub fn needs_flush(self) -> bool {
        self == Self::WriteCombining
    }
}

/// One mapped region of a BAR: `len` bytes starting at BAR offset
/// `bar_offset`, mapped as `mem_type`.
#[derive(Debug)]
pub struct Mmio {
    region: MmapRegion<()>,
    bar_offset: u64,
    mem_type: MemType,
}

// SAFETY: `Mmio` only hands out volatile accesses to the mapping, which the
// device reads and writes concurrently anyway; there is no interior state to
// race on, so moving it to another thread or sharing it is sound.
unsafe impl Send for Mmio {}
// SAFETY: as above: every access is a volatile load or store.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// Wraps a mapping of a BAR area that starts at `bar_offset` in the BAR,
    /// of unknown type: taken as [`MemType::Uncached`], the strict one.
    pub fn new(region: MmapRegion<()>, bar_offset: u64) -> Self {
        Self::with_type(region, bar_offset, MemType::Uncached)
    }

    /// Wraps a mapping the backend made as `mem_type`.
    pub fn with_type(region: MmapRegion<()>, bar_offset: u64, mem_type: MemType) -> Self {
        Self {
            region,
            bar_offset,
            mem_type,
        }
    }

    /// The memory type of the mapping.
    pub fn mem_type(&self) -> MemType {
        self.mem_type
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

    /// The address of `len` bytes at `offset` in the mapping, for a
    /// program that does its own MMIO there (a DevX UAR page handed to C:
    /// `mlx5dv_devx_uar.base_addr`); out of the mapping is an error.
    pub fn addr_of(&self, offset: usize, len: usize) -> Result<*mut u8> {
        if offset.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(self.oob(offset, len));
        }
        Ok(self.region.as_ptr().wrapping_add(offset))
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

/// `2^k` registers of `S` bytes (a power of two, at least 64) at some
/// offset of a mapped BAR, checked once: the BlueFlame buffers of a UAR,
/// which a send queue rings in turn. A write at a constant offset inside a
/// register then needs no bounds test at run time.
#[derive(Debug, Clone)]
pub struct MmioRing<const S: usize> {
    /// The first register: inside `mmio`'s mapping, `S`-aligned in it.
    base: *mut u8,
    mask: u32,
    mmio: std::sync::Arc<Mmio>,
}

// SAFETY: the pointer is into `mmio`'s mapping, which the ring keeps alive;
// every access through it is a volatile store, as `Mmio`'s own (which is
// Send and Sync for the same reason).
unsafe impl<const S: usize> Send for MmioRing<S> {}
// SAFETY: as above.
unsafe impl<const S: usize> Sync for MmioRing<S> {}

impl<const S: usize> MmioRing<S> {
    /// `entries` (a power of two) registers from `offset` (a multiple of
    /// `S`) of `mmio`, which must hold them all.
    pub fn new(mmio: std::sync::Arc<Mmio>, offset: usize, entries: u32) -> Result<Self> {
        const { assert!(S.is_power_of_two() && S >= 64) };
        let bytes = (entries as usize).checked_mul(S);
        let end = bytes.and_then(|b| offset.checked_add(b));
        if !entries.is_power_of_two() || offset % S != 0 || end.is_none_or(|e| e > mmio.len()) {
            return Err(mmio.oob(offset, bytes.unwrap_or(usize::MAX)));
        }
        // The mapping is page aligned, so `base` is aligned as `offset` is.
        let base = mmio.region.as_ptr().wrapping_add(offset);
        Ok(Self {
            base,
            mask: entries - 1,
            mmio,
        })
    }

    /// The mapping the registers are in.
    pub fn mmio(&self) -> &std::sync::Arc<Mmio> {
        &self.mmio
    }

    /// Where `N` qwords at `off` of register `idx` (masked) lie, if inside
    /// the register and `off` is a multiple of their size (hence aligned).
    #[inline(always)]
    fn at<const N: usize>(&self, idx: u32, off: usize) -> Result<*mut u64> {
        if off % (8 * N) != 0 || off.checked_add(8 * N).is_none_or(|e| e > S) {
            return Err(self.mmio.oob(off, 8 * N));
        }
        Ok(self
            .base
            .wrapping_add((idx & self.mask) as usize * S + off)
            .cast())
    }

    /// Writes 8 bytes at `off` (8-byte aligned) of register `idx` as one
    /// 64-bit store: a send doorbell.
    #[inline(always)]
    pub fn write64_raw(&self, idx: u32, off: usize, bytes: [u8; 8]) -> Result<()> {
        let p = self.at::<1>(idx, off)?;
        // SAFETY: `p` is inside register `idx` (checked above), which is
        // inside the live mapping (checked by `new`), and 8-byte aligned;
        // one volatile 64-bit store keeps the doorbell atomic.
        unsafe { p.write_volatile(u64::from_ne_bytes(bytes)) };
        Ok(())
    }

    /// Writes the 64 bytes `words` (in-memory byte order) at `off` (64-byte
    /// aligned) of register `idx` as eight 64-bit stores: the BlueFlame copy
    /// of a one-block WQE.
    #[inline(always)]
    pub fn write_block64(&self, idx: u32, off: usize, words: &[u64; 8]) -> Result<()> {
        let p = self.at::<8>(idx, off)?;
        for (i, w) in words.iter().enumerate() {
            // SAFETY: `p .. p + 64` is inside register `idx` and the live
            // mapping (checked), 64-byte aligned; each qword one volatile store.
            unsafe { p.wrapping_add(i).write_volatile(*w) };
        }
        Ok(())
    }

    /// Writes 8 bytes at the constant offset `OFF` of register `idx` as one
    /// 64-bit store: a send doorbell. `OFF` is 8-byte aligned and inside the
    /// register, asserted when compiled, so the store cannot fail.
    #[inline(always)]
    pub fn write64_at<const OFF: usize>(&self, idx: u32, bytes: [u8; 8]) {
        const {
            assert!(
                OFF % 8 == 0 && OFF + 8 <= S,
                "outside the register or misaligned"
            )
        };
        let p = self
            .base
            .wrapping_add((idx & self.mask) as usize * S + OFF)
            .cast::<u64>();
        // SAFETY: `p` is inside register `idx` (masked) and 8-byte aligned
        // (asserted just above), the register inside the live mapping
        // (checked by `new`); one volatile 64-bit store keeps the doorbell
        // atomic.
        unsafe { p.write_volatile(u64::from_ne_bytes(bytes)) };
    }

    /// Writes the 64 bytes `words` (in-memory byte order) at the constant
    /// offset `OFF` of register `idx` as eight 64-bit stores: the BlueFlame
    /// copy of a one-block WQE. `OFF` is 64-byte aligned and the block
    /// inside the register, asserted when compiled, so it cannot fail.
    #[inline(always)]
    pub fn write_block64_at<const OFF: usize>(&self, idx: u32, words: &[u64; 8]) {
        const {
            assert!(
                OFF % 64 == 0 && OFF + 64 <= S,
                "outside the register or misaligned"
            )
        };
        let p = self
            .base
            .wrapping_add((idx & self.mask) as usize * S + OFF)
            .cast::<u64>();
        for (i, w) in words.iter().enumerate() {
            // SAFETY: `p .. p + 64` is inside register `idx` and the live
            // mapping, 64-byte aligned (asserted above, checked by `new`);
            // each qword one volatile store.
            unsafe { p.wrapping_add(i).write_volatile(*w) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn registers_of_a_ring_take_whole_qwords_and_stay_inside() {
        let m = Arc::new(Mmio::new(MmapRegion::<()>::new(4096).unwrap(), 0));
        let bf = MmioRing::<256>::new(m.clone(), 0x800, 2).unwrap();
        bf.write64_raw(0, 0, *b"abcdefgh").unwrap();
        bf.write64_raw(3, 8, *b"ijklmnop").unwrap();
        let w: [u64; 8] = std::array::from_fn(|i| u64::from_ne_bytes([i as u8; 8]));
        bf.write_block64(0, 64, &w).unwrap();
        let be = |o: usize| m.read32_be(o).unwrap().to_be_bytes();
        assert_eq!([be(0x800), be(0x804)].concat(), b"abcdefgh");
        assert_eq!(
            [be(0x908), be(0x90c)].concat(),
            b"ijklmnop",
            "index 3 is register 1"
        );
        assert_eq!(be(0x840 + 7 * 8), [7; 4]);
        // Outside a register, misaligned, or a ring past the mapping: refused.
        assert!(bf.write64_raw(0, 256, [0; 8]).is_err());
        assert!(bf.write64_raw(0, 4, [0; 8]).is_err());
        assert!(bf.write_block64(0, 8, &w).is_err());
        assert!(bf.write_block64(0, 224, &w).is_err());
        assert!(MmioRing::<256>::new(m.clone(), 0xf00, 2).is_err());
        assert!(MmioRing::<256>::new(m.clone(), 0x880, 1).is_err());
        assert!(MmioRing::<256>::new(m, 0x800, 3).is_err());
    }
}
