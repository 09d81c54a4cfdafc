//! The one home of the kernel backend's system calls: ioctl numbers (our
//! own, from `include/uapi/linux/vfio.h` and `iommufd.h` of Linux 6.12),
//! the argument structures `vfio-bindings` lacks, and thin wrappers that
//! turn a return code into a typed error.
//!
//! Variable-length answers (region info with capabilities, IOMMU info, hot
//! reset info) are read into 8-byte aligned byte buffers and parsed with
//! bounds checks, so nothing the kernel writes can make us read past them.

use std::os::fd::{AsRawFd, BorrowedFd};

use crate::{Error, Result};

/// `_IO(type, nr)`: VFIO and iommufd encode neither size nor direction.
const fn io(ty: u8, nr: u32) -> libc::c_ulong {
    ((ty as libc::c_ulong) << 8) | nr as libc::c_ulong
}

/// VFIO's ioctl type, `';'`.
const VFIO_TYPE: u8 = b';';
const VFIO_BASE: u32 = 100;
/// iommufd's ioctl type (also `';'`, numbers from 0x80).
const IOMMUFD_TYPE: u8 = b';';

pub(crate) const VFIO_GET_API_VERSION: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE);
pub(crate) const VFIO_CHECK_EXTENSION: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 1);
pub(crate) const VFIO_SET_IOMMU: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 2);
pub(crate) const VFIO_GROUP_GET_STATUS: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 3);
pub(crate) const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 4);
pub(crate) const VFIO_GROUP_UNSET_CONTAINER: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 5);
pub(crate) const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 6);
pub(crate) const VFIO_DEVICE_GET_INFO: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 7);
pub(crate) const VFIO_DEVICE_GET_REGION_INFO: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 8);
pub(crate) const VFIO_DEVICE_GET_IRQ_INFO: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 9);
pub(crate) const VFIO_DEVICE_SET_IRQS: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 10);
pub(crate) const VFIO_DEVICE_RESET: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 11);
pub(crate) const VFIO_DEVICE_GET_PCI_HOT_RESET_INFO: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 12);
pub(crate) const VFIO_DEVICE_PCI_HOT_RESET: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 13);
pub(crate) const VFIO_DEVICE_BIND_IOMMUFD: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 18);
pub(crate) const VFIO_DEVICE_ATTACH_IOMMUFD_PT: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 19);
pub(crate) const VFIO_IOMMU_GET_INFO: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 12);
pub(crate) const VFIO_IOMMU_MAP_DMA: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 13);
pub(crate) const VFIO_IOMMU_UNMAP_DMA: libc::c_ulong = io(VFIO_TYPE, VFIO_BASE + 14);

pub(crate) const IOMMU_DESTROY: libc::c_ulong = io(IOMMUFD_TYPE, 0x80);
pub(crate) const IOMMU_IOAS_ALLOC: libc::c_ulong = io(IOMMUFD_TYPE, 0x81);
pub(crate) const IOMMU_IOAS_IOVA_RANGES: libc::c_ulong = io(IOMMUFD_TYPE, 0x84);
pub(crate) const IOMMU_IOAS_MAP: libc::c_ulong = io(IOMMUFD_TYPE, 0x85);
pub(crate) const IOMMU_IOAS_UNMAP: libc::c_ulong = io(IOMMUFD_TYPE, 0x86);
/// Linux 6.13 and later; older kernels answer ENOTTY.
pub(crate) const IOMMU_IOAS_MAP_FILE: libc::c_ulong = io(IOMMUFD_TYPE, 0x8f);

/// `struct iommu_destroy`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct IommuDestroy {
    pub size: u32,
    pub id: u32,
}

/// `struct iommu_ioas_alloc`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct IommuIoasAlloc {
    pub size: u32,
    pub flags: u32,
    pub out_ioas_id: u32,
}

/// `struct iommu_iova_range`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IommuIovaRange {
    pub start: u64,
    pub last: u64,
}

/// `struct iommu_ioas_iova_ranges`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct IommuIoasIovaRanges {
    pub size: u32,
    pub ioas_id: u32,
    pub num_iovas: u32,
    pub reserved: u32,
    pub allowed_iovas: u64,
    pub out_iova_alignment: u64,
}

/// `IOMMU_IOAS_MAP_FIXED_IOVA`.
pub(crate) const IOMMU_IOAS_MAP_FIXED_IOVA: u32 = 1 << 0;
/// `IOMMU_IOAS_MAP_WRITEABLE`.
pub(crate) const IOMMU_IOAS_MAP_WRITEABLE: u32 = 1 << 1;
/// `IOMMU_IOAS_MAP_READABLE`.
pub(crate) const IOMMU_IOAS_MAP_READABLE: u32 = 1 << 2;

/// `struct iommu_ioas_map`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct IommuIoasMap {
    pub size: u32,
    pub flags: u32,
    pub ioas_id: u32,
    pub reserved: u32,
    pub user_va: u64,
    pub length: u64,
    pub iova: u64,
}

/// `struct iommu_ioas_map_file` (Linux 6.13): map pages of a memfd by
/// file offset, not by address.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct IommuIoasMapFile {
    pub size: u32,
    pub flags: u32,
    pub ioas_id: u32,
    pub fd: i32,
    pub start: u64,
    pub length: u64,
    pub iova: u64,
}

/// `struct iommu_ioas_unmap`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct IommuIoasUnmap {
    pub size: u32,
    pub ioas_id: u32,
    pub iova: u64,
    pub length: u64,
}

/// `struct vfio_device_bind_iommufd` as Linux 6.12 has it (later kernels
/// append a token pointer, which `vfio-bindings` 0.7 carries).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct VfioDeviceBindIommufd {
    pub argsz: u32,
    pub flags: u32,
    pub iommufd: i32,
    pub out_devid: u32,
}

/// `struct vfio_device_attach_iommufd_pt`.
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct VfioDeviceAttachIommufdPt {
    pub argsz: u32,
    pub flags: u32,
    pub pt_id: u32,
}

/// `sizeof` as the `u32` the kernel's `argsz`/`size` fields take.
pub(crate) fn size_of_u32<T>() -> u32 {
    std::mem::size_of::<T>() as u32
}

/// `ioctl(fd, req, arg)` where `arg` is an integer (or nothing).
pub(crate) fn ioctl_val(
    fd: BorrowedFd<'_>,
    req: libc::c_ulong,
    arg: libc::c_ulong,
    op: &'static str,
) -> Result<libc::c_int> {
    // SAFETY: these requests take their argument by value (an extension
    // number, an IOMMU type, or nothing); no memory is passed.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        return Err(Error::os(op));
    }
    Ok(r)
}

/// `ioctl(fd, req, &mut *arg)` for a fixed-size argument structure.
pub(crate) fn ioctl_mut<T>(
    fd: BorrowedFd<'_>,
    req: libc::c_ulong,
    arg: &mut T,
    op: &'static str,
) -> Result<libc::c_int> {
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` structure of
    // the size its `argsz`/`size` field (set by the caller) announces; the
    // kernel reads and writes at most that many bytes.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        return Err(Error::os(op));
    }
    Ok(r)
}

/// `ioctl(fd, req, buf)` for a variable-length argument whose first `u32`
/// is its `argsz` (the caller wrote it, no larger than `buf`).
pub(crate) fn ioctl_buf(
    fd: BorrowedFd<'_>,
    req: libc::c_ulong,
    buf: &mut AlignedBuf,
    op: &'static str,
) -> Result<libc::c_int> {
    if (buf.get_u32(0) as usize) > buf.len() {
        return Err(Error::Unsupported("argsz larger than its buffer"));
    }
    // SAFETY: `buf` is 8-byte aligned, exclusively borrowed and at least
    // `argsz` bytes long (checked above); the kernel touches at most `argsz`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, buf.as_mut_ptr()) };
    if r < 0 {
        return Err(Error::os(op));
    }
    Ok(r)
}

/// A zeroed, 8-byte aligned byte buffer for variable-length ioctl
/// arguments, read with bounds checks.
#[derive(Debug, Clone)]
pub(crate) struct AlignedBuf {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes.
    pub(crate) fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(8)],
            len,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast()
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `words` owns at least `len` initialised bytes (`len.div_ceil(8)`
        // words), and u8 has no alignment or validity requirements.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }

    /// The `u32` at `off`, or 0 past the end (a short answer reads as zeros).
    pub(crate) fn get_u32(&self, off: usize) -> u32 {
        self.bytes()
            .get(off..off.saturating_add(4))
            .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The `u16` at `off`, or 0 past the end.
    pub(crate) fn get_u16(&self, off: usize) -> u16 {
        self.bytes()
            .get(off..off.saturating_add(2))
            .map_or(0, |b| u16::from_ne_bytes([b[0], b[1]]))
    }

    /// The `u64` at `off`, or 0 past the end.
    pub(crate) fn get_u64(&self, off: usize) -> u64 {
        self.bytes().get(off..off.saturating_add(8)).map_or(0, |b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_ne_bytes(a)
        })
    }

    /// Writes `v` at `off` (ignored past the end).
    pub(crate) fn put_u32(&mut self, off: usize, v: u32) {
        if let Some(b) = self.bytes_mut().get_mut(off..off.saturating_add(4)) {
            b.copy_from_slice(&v.to_ne_bytes());
        }
    }

    /// Writes `v` at `off` (ignored past the end).
    pub(crate) fn put_i32(&mut self, off: usize, v: i32) {
        self.put_u32(off, v as u32);
    }

    /// The capability chain starting at `first` (an offset from the start
    /// of the buffer, 0 = none): `(id, version, offset)` of each, stopping
    /// at a loop or an offset outside the buffer.
    pub(crate) fn caps(&self, first: u32) -> Vec<(u16, u16, usize)> {
        let mut out = Vec::new();
        let mut at = first as usize;
        while at != 0 && at + 8 <= self.len && out.len() < 64 {
            out.push((self.get_u16(at), self.get_u16(at + 2), at));
            let next = self.get_u32(at + 4) as usize;
            if next <= at {
                break;
            }
            at = next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // _IO(';', 100 + n) as in include/uapi/linux/vfio.h.
        assert_eq!(VFIO_GET_API_VERSION, 0x3b64);
        assert_eq!(VFIO_GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(VFIO_DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_DEVICE_BIND_IOMMUFD, 0x3b76);
        assert_eq!(IOMMU_IOAS_MAP, 0x3b85);
        assert_eq!(std::mem::size_of::<IommuIoasMap>(), 40);
        assert_eq!(IOMMU_IOAS_MAP_FILE, 0x3b8f);
        assert_eq!(std::mem::size_of::<IommuIoasMapFile>(), 40);
        assert_eq!(std::mem::size_of::<IommuIoasIovaRanges>(), 32);
        assert_eq!(std::mem::size_of::<IommuIoasUnmap>(), 24);
    }

    #[test]
    fn capability_chains_stop_at_loops_and_the_end() {
        let mut b = AlignedBuf::new(64);
        // cap at 16 -> 32 -> back to 16 (a loop the kernel would never write).
        b.put_u32(16, 0x0001_0003);
        b.put_u32(20, 32);
        b.put_u32(32, 0x0001_0001);
        b.put_u32(36, 16);
        let caps = b.caps(16);
        assert_eq!(caps, vec![(3, 1, 16), (1, 1, 32)]);
        // A next pointer past the end ends the chain.
        b.put_u32(36, 4096);
        assert_eq!(b.caps(16).len(), 2);
        assert_eq!(b.get_u64(60), 0, "reads past the end give zeros");
    }
}
