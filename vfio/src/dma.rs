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

/// A zeroed, page-rounded, memfd-backed buffer that devices may DMA to.
#[derive(Debug)]
pub struct DmaBuffer {
    region: MmapRegion<()>,
    file: Arc<File>,
    len: usize,
    huge: bool,
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
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        if huge && len % HUGE_2M == 0 {
            if let Ok(b) = Self::make(len, true) {
                return Ok(b);
            }
        }
        Self::make(len, false)
    }

    fn make(len: usize, huge: bool) -> Result<Arc<Self>> {
        let flags = libc::MFD_CLOEXEC
            | libc::MFD_ALLOW_SEALING
            | if huge {
                libc::MFD_HUGETLB | (21 << libc::MFD_HUGE_SHIFT)
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
        let region =
            MmapRegion::from_file(FileOffset::from_arc(file.clone(), 0), len).map_err(|e| {
                Error::Os {
                    op: "mmap(memfd)",
                    source: std::io::Error::other(e.to_string()),
                }
            })?;
        Ok(Arc::new(Self {
            region,
            file,
            len,
            huge,
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
        self.huge
    }

    /// The file behind the buffer, to share it with another mapping.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// The host address of the mapping (what the kernel's VFIO_IOMMU_MAP_DMA takes).
    pub fn host_addr(&self) -> u64 {
        self.region.as_ptr() as u64
    }

    /// A volatile view of the whole buffer.
    pub fn slice(&self) -> VolatileSlice<'_, BS<'_, ()>> {
        self.region.as_volatile_slice()
    }

    fn oob(&self, offset: usize, len: u64) -> Error {
        Error::OutOfBounds {
            what: "DMA buffer",
            offset: offset as u64,
            len,
            size: self.len as u64,
        }
    }

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
