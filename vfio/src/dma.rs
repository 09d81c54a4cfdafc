//! DMA memory: memfd-backed shared mappings.
//!
//! Every buffer a device may touch is a memfd mapped `MAP_SHARED`, so the same
//! pages can be handed to any backend: the kernel maps them by address, a
//! vfio-user server by file descriptor, an in-process device model by mapping
//! the file again. Buffers are zeroed when made and always accessed by
//! volatile copies (the device writes them concurrently).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use vm_memory::bitmap::BS;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, VolatileMemory, VolatileSlice};

use crate::{Error, Result};

/// Host page size this crate assumes for rounding (4 KiB on every target we run).
pub const PAGE_SIZE: usize = 4096;
const HUGE_2M: usize = 2 << 20;
const HUGE_1G: usize = 1 << 30;

/// A hugetlb page size to back a buffer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePage {
    /// 2 MiB pages.
    Size2M,
    /// 1 GiB pages.
    Size1G,
}

/// A zeroed, page-rounded, memfd-backed buffer that devices may DMA to.
#[derive(Debug)]
pub struct DmaBuffer {
    region: MmapRegion<()>,
    file: Arc<File>,
    len: usize,
    page_size: usize,
}

impl DmaBuffer {
    /// A new zeroed buffer of at least `len` bytes (rounded up to 4 KiB).
    pub fn new(len: usize) -> Result<Arc<Self>> {
        Self::with_hugepages(len, false)
    }

    /// A new buffer, backed by 2 MiB huge pages when `huge` is asked for, the
    /// length is a multiple of 2 MiB and the system has them (otherwise
    /// ordinary pages; [`is_huge`](Self::is_huge) tells which).
    pub fn with_hugepages(len: usize, huge: bool) -> Result<Arc<Self>> {
        if huge {
            Self::with_huge_page(len, HugePage::Size2M)
        } else {
            Self::make(len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE, PAGE_SIZE)
        }
    }

    /// A new buffer backed by `page` huge pages when the length is a
    /// multiple of that size and the system has them free, else by the next
    /// smaller size that fits (1 GiB, then 2 MiB, then 4 KiB);
    /// [`page_size`](Self::page_size) tells which.
    pub fn with_huge_page(len: usize, page: HugePage) -> Result<Arc<Self>> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let sizes: &[usize] = match page {
            HugePage::Size1G => &[HUGE_1G, HUGE_2M],
            HugePage::Size2M => &[HUGE_2M],
        };
        for &size in sizes {
            if len % size == 0 {
                if let Ok(b) = Self::make(len, size) {
                    return Ok(b);
                }
            }
        }
        Self::make(len, PAGE_SIZE)
    }

    fn make(len: usize, page_size: usize) -> Result<Arc<Self>> {
        let flags = libc::MFD_CLOEXEC
            | libc::MFD_ALLOW_SEALING
            | if page_size > PAGE_SIZE {
                // MFD_HUGE_2MB / MFD_HUGE_1GB: log2 of the size in the high bits.
                libc::MFD_HUGETLB | (page_size.trailing_zeros() << libc::MFD_HUGE_SHIFT)
            } else {
                0
            };
        // SAFETY: memfd_create reads the NUL-terminated name and returns a new
        // descriptor or -1; no memory of ours is written.
        let fd = unsafe { libc::memfd_create(c"mlx5-dma".as_ptr(), flags) };
        if fd < 0 {
            return Err(Error::os("memfd_create"));
        }
        // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64).map_err(|e| Error::Os {
            op: "ftruncate(memfd)",
            source: e,
        })?;
        // The size is final: sealed so that no process the file is shared
        // with (a vfio-user server, a vhost-user backend) can have pages cut
        // from under its mapping by a shrink.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns; no memory is passed.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(Error::os("fcntl(memfd, F_ADD_SEALS)"));
        }
        let file = Arc::new(file);
        // Without MAP_NORESERVE (which `MmapRegion::from_file` sets), a
        // hugetlb mapping reserves its pages now and fails with ENOMEM when
        // there are too few, instead of a SIGBUS at the first touch.
        let region = MmapRegion::build(
            Some(FileOffset::from_arc(file.clone(), 0)),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(|e| Error::Os {
            op: "mmap(memfd)",
            source: std::io::Error::other(e.to_string()),
        })?;
        Ok(Arc::new(Self {
            region,
            file,
            len,
            page_size,
        }))
    }

    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: buffers are at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether huge pages back the buffer.
    pub fn is_huge(&self) -> bool {
        self.page_size > PAGE_SIZE
    }

    /// The size of the pages backing the buffer (4 KiB, 2 MiB or 1 GiB).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The file behind the buffer, to share it with another mapping.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// The host address of the mapping (what the kernel's VFIO_IOMMU_MAP_DMA takes).
    pub fn host_addr(&self) -> u64 {
        self.region.as_ptr() as u64
    }

    /// The first byte of the mapping (for [`DmaRing`](crate::dma_ring::DmaRing)).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// A volatile view of the whole buffer.
    pub fn slice(&self) -> VolatileSlice<'_, BS<'_, ()>> {
        self.region.as_volatile_slice()
    }

    #[cold]
    fn oob(&self, offset: usize, len: u64) -> Error {
        Error::OutOfBounds {
            what: "DMA buffer",
            offset: offset as u64,
            len,
            size: self.len as u64,
        }
    }

    #[inline(always)]
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(self.oob(offset, len as u64));
        }
        Ok(())
    }

    /// Copies `buf.len()` bytes out of the buffer at `offset`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        self.slice()
            .read_slice(buf, offset)
            .map_err(|_| self.oob(offset, buf.len() as u64))
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        self.slice()
            .write_slice(data, offset)
            .map_err(|_| self.oob(offset, data.len() as u64))
    }

    /// Fills `len` bytes at `offset` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        self.check(offset, len)?;
        let chunk = [byte; 256];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len());
            self.write(offset + done, &chunk[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Reads the byte at `offset` with acquire ordering: whatever the device
    /// wrote before it (an ownership bit) is visible after it.
    pub fn load_u8_acquire(&self, offset: usize) -> Result<u8> {
        self.check(offset, 1)?;
        self.slice()
            .load::<u8>(offset, Ordering::Acquire)
            .map_err(|_| self.oob(offset, 1))
    }

    /// Writes the byte at `offset` with release ordering: everything written
    /// before it (a command, a WQE) is visible to whoever sees it.
    pub fn store_u8_release(&self, offset: usize, value: u8) -> Result<()> {
        self.check(offset, 1)?;
        self.slice()
            .store::<u8>(value, offset, Ordering::Release)
            .map_err(|_| self.oob(offset, 1))
    }

    /// Reads a big-endian u32 at `offset`.
    pub fn read_u32_be(&self, offset: usize) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(offset, &mut b)?;
        Ok(u32::from_be_bytes(b))
    }

    /// Writes a big-endian u32 at `offset`.
    pub fn write_u32_be(&self, offset: usize, value: u32) -> Result<()> {
        self.write(offset, &value.to_be_bytes())
    }

    /// Reads a big-endian u64 at `offset`.
    pub fn read_u64_be(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_be_bytes(b))
    }

    /// Writes a big-endian u64 at `offset`.
    pub fn write_u64_be(&self, offset: usize, value: u64) -> Result<()> {
        self.write(offset, &value.to_be_bytes())
    }

    // Fixed-size accessors for ring memory (WQEs, CQEs, doorbell records):
    // one bounds-and-alignment check, then plain volatile loads and stores
    // of whole aligned words, which is what the data path needs per entry.

    /// A pointer to `len` bytes at `offset`, `align`-aligned in memory.
    #[inline(always)]
    fn ring_ptr(&self, offset: usize, len: usize, align: usize) -> Result<*mut u8> {
        self.check(offset, len)?;
        let p = self.region.as_ptr().wrapping_add(offset);
        if (p as usize) % align != 0 {
            return Err(self.oob(offset, len as u64));
        }
        Ok(p)
    }

    /// Stores the 64-byte `block` at `offset` (8-byte aligned) in eight
    /// volatile 64-bit stores, byte order kept: a send WQE basic block.
    #[inline(always)]
    pub fn store_block64(&self, offset: usize, block: &[u8; 64]) -> Result<()> {
        let p = self.ring_ptr(offset, 64, 8)?.cast::<u64>();
        for i in 0..8 {
            let mut q = [0u8; 8];
            q.copy_from_slice(&block[i * 8..i * 8 + 8]);
            // SAFETY: `p .. p + 64` lies inside this live mapping and is
            // 8-byte aligned (checked by `ring_ptr`); memory shared with a
            // device is only ever accessed volatile, so no reference aliases it.
            unsafe { p.wrapping_add(i).write_volatile(u64::from_ne_bytes(q)) };
        }
        Ok(())
    }

    /// Stores `N` 64-bit words at `offset` (8-byte aligned), each in one
    /// volatile store of its in-memory bytes (`u64::from_ne_bytes`): the
    /// segments of a WQE built in registers.
    #[inline(always)]
    pub fn store_words<const N: usize>(&self, offset: usize, words: &[u64; N]) -> Result<()> {
        let p = self.ring_ptr(offset, N * 8, 8)?.cast::<u64>();
        for (i, w) in words.iter().enumerate() {
            // SAFETY: `p .. p + 8N` lies inside this live mapping and is
            // 8-byte aligned (checked by `ring_ptr`); volatile as all
            // device-shared memory.
            unsafe { p.wrapping_add(i).write_volatile(*w) };
        }
        Ok(())
    }

    /// Loads the 64 bytes at `offset` (8-byte aligned) in eight volatile
    /// 64-bit loads: a CQE.
    #[inline(always)]
    pub fn load_block64(&self, offset: usize) -> Result<[u8; 64]> {
        let p = self.ring_ptr(offset, 64, 8)?.cast::<u64>();
        let mut out = [0u8; 64];
        for i in 0..8 {
            // SAFETY: as in `store_block64`: inside the mapping, aligned,
            // volatile.
            let q = unsafe { p.wrapping_add(i).read_volatile() };
            out[i * 8..i * 8 + 8].copy_from_slice(&q.to_ne_bytes());
        }
        Ok(out)
    }

    /// Stores a big-endian u32 at `offset` (4-byte aligned) in one volatile
    /// store: a doorbell record.
    #[inline(always)]
    pub fn store_u32_be(&self, offset: usize, value: u32) -> Result<()> {
        let p = self.ring_ptr(offset, 4, 4)?.cast::<u32>();
        // SAFETY: inside the mapping and 4-byte aligned (checked); volatile.
        unsafe { p.write_volatile(value.to_be()) };
        Ok(())
    }

    /// Loads the byte at `offset` with acquire ordering (an ownership
    /// byte), without going through a volatile slice.
    #[inline(always)]
    pub fn load_u8_acquire_ring(&self, offset: usize) -> Result<u8> {
        let p = self.ring_ptr(offset, 1, 1)?;
        // SAFETY: `p` is inside the live mapping (checked); an AtomicU8 has
        // the size and alignment of u8, and the byte is only accessed
        // atomically or volatile by this process.
        let a = unsafe { std::sync::atomic::AtomicU8::from_ptr(p) };
        Ok(a.load(Ordering::Acquire))
    }

    /// Loads the byte at `offset` in one volatile load: one field of a
    /// CQE, read only when the completion needs it.
    #[inline(always)]
    pub fn load_u8_ring(&self, offset: usize) -> Result<u8> {
        let p = self.ring_ptr(offset, 1, 1)?;
        // SAFETY: inside the live mapping (checked); volatile.
        Ok(unsafe { p.read_volatile() })
    }

    /// Loads a big-endian u16 at `offset` (2-byte aligned) in one volatile load.
    #[inline(always)]
    pub fn load_u16_be_ring(&self, offset: usize) -> Result<u16> {
        let p = self.ring_ptr(offset, 2, 2)?.cast::<u16>();
        // SAFETY: inside the live mapping and 2-byte aligned (checked); volatile.
        Ok(u16::from_be(unsafe { p.read_volatile() }))
    }

    /// Loads a big-endian u32 at `offset` (4-byte aligned) in one volatile load.
    #[inline(always)]
    pub fn load_u32_be_ring(&self, offset: usize) -> Result<u32> {
        let p = self.ring_ptr(offset, 4, 4)?.cast::<u32>();
        // SAFETY: inside the live mapping and 4-byte aligned (checked); volatile.
        Ok(u32::from_be(unsafe { p.read_volatile() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_rounded_and_bounded() {
        let b = DmaBuffer::new(100).unwrap();
        assert_eq!(b.len(), 4096);
        let mut x = [1u8; 16];
        b.read(4080, &mut x).unwrap();
        assert_eq!(x, [0; 16]);
        b.write_u32_be(8, 0x0102_0304).unwrap();
        assert_eq!(b.read_u32_be(8).unwrap(), 0x0102_0304);
        assert!(matches!(
            b.read(4090, &mut x),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn huge_pages_when_there_are_some_else_the_next_size() {
        // Whatever this machine has reserved, the buffer is usable and says
        // what backs it; a length that is no multiple of the page falls back.
        for (len, page) in [
            (HUGE_2M, HugePage::Size2M),
            (HUGE_1G, HugePage::Size1G),
            (HUGE_2M + 4096, HugePage::Size2M),
        ] {
            let b = DmaBuffer::with_huge_page(len, page).unwrap();
            assert_eq!(b.len() % b.page_size(), 0);
            assert_eq!(b.is_huge(), b.page_size() > PAGE_SIZE);
            b.write(len - 4, &[1, 2, 3, 4]).unwrap();
        }
        let odd = DmaBuffer::with_huge_page(HUGE_2M + 4096, HugePage::Size2M).unwrap();
        assert_eq!(odd.page_size(), PAGE_SIZE);
        assert!(!DmaBuffer::with_hugepages(8192, false).unwrap().is_huge());
    }

    #[test]
    fn ring_accessors_store_and_load_whole_words() {
        let b = DmaBuffer::new(4096).unwrap();
        let mut blk = [0u8; 64];
        for (i, x) in blk.iter_mut().enumerate() {
            *x = i as u8 ^ 0x5a;
        }
        b.store_block64(4032, &blk).unwrap();
        let mut got = [0u8; 64];
        b.read(4032, &mut got).unwrap();
        assert_eq!(got, blk);
        assert_eq!(b.load_block64(4032).unwrap(), blk);
        b.store_u32_be(12, 0xa1b2_c3d4).unwrap();
        assert_eq!(
            b.read(12, &mut got[..4])
                .map(|_| got[..4].to_vec())
                .unwrap(),
            [0xa1, 0xb2, 0xc3, 0xd4]
        );
        assert_eq!(b.load_u8_acquire_ring(4032 + 63).unwrap(), 63 ^ 0x5a);
        b.store_words(
            64,
            &[
                u64::from_ne_bytes(*b"abcdefgh"),
                u64::from_ne_bytes(*b"ijklmnop"),
            ],
        )
        .unwrap();
        b.read(64, &mut got[..16]).unwrap();
        assert_eq!(&got[..16], b"abcdefghijklmnop");
        assert!(b.store_words(4088, &[0u64; 2]).is_err());
        // Bounds and alignment refused.
        assert!(matches!(
            b.store_block64(4040, &blk),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.store_block64(4, &blk),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.load_block64(4090),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.store_u32_be(2, 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.store_u32_be(4094, 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(b.load_u8_acquire_ring(4096).is_err());
        assert_eq!(b.load_u32_be_ring(12).unwrap(), 0xa1b2_c3d4);
        assert_eq!(b.load_u16_be_ring(14).unwrap(), 0xc3d4);
        assert_eq!(b.load_u8_ring(13).unwrap(), 0xb2);
        assert!(b.load_u32_be_ring(14).is_err());
        assert!(b.load_u16_be_ring(4095).is_err());
        assert!(b.load_u8_ring(4096).is_err());
    }

    #[test]
    fn a_second_mapping_of_the_file_sees_the_same_bytes() {
        let b = DmaBuffer::new(8192).unwrap();
        let other =
            MmapRegion::<()>::from_file(FileOffset::from_arc(b.file().clone(), 0), 8192).unwrap();
        b.write(5000, b"hello").unwrap();
        let mut got = [0u8; 5];
        other
            .as_volatile_slice()
            .read_slice(&mut got, 5000)
            .unwrap();
        assert_eq!(&got, b"hello");
    }
}
