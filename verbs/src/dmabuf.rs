//! DMA-BUF memory regions: `ibv_reg_dmabuf_mr(pd, offset, length, iova,
//! fd, access)` over a dma-buf another driver exported (udmabuf, a GPU),
//! in user space over VFIO.
//!
//! How a dma-buf reaches the function's IOMMU space from user space, by
//! kernel (read in Linux 6.12's sources):
//! - VFIO type1, `VFIO_IOMMU_MAP_DMA` of an `mmap` of the dma-buf: the
//!   exporter's mmap is `VM_PFNMAP` (udmabuf since 6.12 inserts PFNs on
//!   fault), so `vaddr_get_pfns` takes `follow_fault_pfn` and refuses any
//!   PFN that is ordinary RAM (`is_invalid_reserved_pfn` false: EFAULT).
//!   Only exporters of reserved/MMIO PFNs (a peer's BAR) map this way.
//! - iommufd `IOMMU_IOAS_MAP` of the mmap: `pin_user_pages` refuses
//!   `VM_PFNMAP` (EFAULT). `IOMMU_IOAS_MAP_FILE` (6.13+) takes memfd /
//!   shmem / hugetlbfs files only, not a dma-buf fd: the memfd behind a
//!   udmabuf (its creator holds it) maps that way, and `reg_mr_raw` of a
//!   `MAP_SHARED` mapping of that memfd already does so.
//! - Importing a dma-buf fd itself into an IOAS needs a newer kernel than
//!   6.13 (not available to test here).
//! - The in-process model and vfio-user: the mmap is process memory the
//!   backend maps by address (the model reads it through the mapping, which
//!   faults the PFNs in), so the MR works there.
//!
//! So this maps the dma-buf range into the process (`mmap` of the fd,
//! `MAP_SHARED`, placed so that its address agrees with `iova` modulo the
//! MTT page) and registers it as any process memory, the key's virtual
//! address being `iova`; where the backend cannot map it (the kernel
//! cases above) the refusal is `Error::NotSupported` naming why. The fd
//! must be a dma-buf (its `/proc/self/fdinfo` has `exp_name`, and `size`
//! bounds `offset + length`); a bad fd is `Error::Os` (EBADF).
#![allow(unsafe_code)] // mmap of the dma-buf and its munmap.

use std::os::fd::{OwnedFd, RawFd};
use std::sync::Arc;

use crate::mr::{check_access, Mapping, Mr};
use crate::pd::Pd;
use crate::{Error, Result};

const PAGE: u64 = 4096;

/// A dma-buf's facts from `/proc/self/fdinfo/<fd>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmaBufInfo {
    /// Bytes (`size:`).
    pub size: u64,
    /// The exporter (`exp_name:`, e.g. `udmabuf`).
    pub exporter: String,
}

/// What the kernel says of `fd`: its dma-buf facts, `Error::Os` (EBADF)
/// for a closed fd, `Error::Invalid` for an fd that is not a dma-buf.
pub fn dmabuf_info(fd: RawFd) -> Result<DmaBufInfo> {
    if fd < 0 {
        return Err(Error::Os {
            op: "dma-buf fd",
            source: std::io::Error::from_raw_os_error(libc::EBADF),
        });
    }
    let text =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).map_err(|e| Error::Os {
            op: "dma-buf fd",
            source: if e.kind() == std::io::ErrorKind::NotFound {
                std::io::Error::from_raw_os_error(libc::EBADF)
            } else {
                e
            },
        })?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let (Some(size), Some(exporter)) = (field("size:"), field("exp_name:")) else {
        return Err(Error::Invalid("the fd is not a dma-buf"));
    };
    let size = size
        .parse()
        .map_err(|_| Error::Invalid("dma-buf size unreadable"))?;
    Ok(DmaBufInfo { size, exporter })
}

/// `UDMABUF_CREATE` (`_IOW('u', 0x42, struct udmabuf_create)`, Linux's
/// `include/uapi/linux/udmabuf.h`).
const UDMABUF_CREATE: libc::c_ulong = 0x4018_7542;
/// `UDMABUF_FLAGS_CLOEXEC`.
const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;

/// `struct udmabuf_create`.
#[repr(C)]
struct UdmabufCreate {
    memfd: u32,
    flags: u32,
    offset: u64,
    size: u64,
}

/// A dma-buf over `size` bytes of `memfd` from `offset`, exported by
/// Linux's udmabuf (`/dev/udmabuf`): the stand-in for a GPU's buffer where
/// there is none, as tools and tests use it. The memfd must have been
/// created with `MFD_ALLOW_SEALING` (a [`vfio::DmaBuffer`]'s is); it is
/// sealed against shrinking here, as udmabuf requires. Without the
/// device (`CONFIG_UDMABUF`, `modprobe udmabuf`) the refusal is
/// `Error::NotSupported`.
pub fn udmabuf(memfd: std::os::fd::BorrowedFd<'_>, offset: u64, size: u64) -> Result<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let dev = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/udmabuf")
    {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::NotSupported(
                "no /dev/udmabuf (a kernel with CONFIG_UDMABUF; modprobe udmabuf)",
            ))
        }
        Err(e) => return Err(Error::os("open /dev/udmabuf", e)),
    };
    // A memfd sealed already (a DmaBuffer's: shrink, grow and the seal
    // itself) refuses more seals, and needs none.
    let raw = memfd.as_raw_fd();
    // SAFETY: F_GET_SEALS on a descriptor the caller lends; no memory.
    let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
    let mut sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
    if !sealed && seals >= 0 {
        // SAFETY: F_ADD_SEALS on the same descriptor; no memory.
        sealed = unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } == 0;
    }
    if !sealed {
        return Err(Error::os(
            "F_ADD_SEALS F_SEAL_SHRINK (udmabuf needs a sealed memfd)",
            std::io::Error::last_os_error(),
        ));
    }
    let c = UdmabufCreate {
        memfd: raw as u32,
        flags: UDMABUF_FLAGS_CLOEXEC,
        offset,
        size,
    };
    // SAFETY: the ioctl reads `c`, which lives across the call.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), UDMABUF_CREATE, &c) };
    if fd < 0 {
        return Err(Error::os("UDMABUF_CREATE", std::io::Error::last_os_error()));
    }
    // SAFETY: the ioctl returned a new descriptor, owned from here on.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A range of a dma-buf mapped into the process; unmapped on drop.
#[derive(Debug)]
pub(crate) struct DmaBufMap {
    addr: u64,
    len: u64,
}

impl Drop for DmaBufMap {
    fn drop(&mut self) {
        // SAFETY: `addr .. addr + len` is the reservation this object made
        // and owns (the dma-buf mapped over part of it); nothing refers to
        // it once the MR holding this is gone.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len as usize) };
    }
}

/// Maps `[file_off, file_off + len)` of dma-buf `fd` (page-aligned) at an
/// address congruent to `want` modulo `align` (a power of two): the
/// mapping and where the range starts.
fn map_aligned(fd: RawFd, file_off: u64, len: u64, want: u64, align: u64) -> Result<DmaBufMap> {
    let total = len + align;
    // SAFETY: a fresh anonymous reservation; no memory is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(Error::Os {
            op: "mmap (reservation for a dma-buf)",
            source: std::io::Error::last_os_error(),
        });
    }
    let reservation = DmaBufMap {
        addr: base as u64,
        len: total,
    };
    let b = base as u64;
    let at = b + (want.wrapping_sub(b) & (align - 1));
    // SAFETY: `at .. at + len` lies inside the reservation this function
    // owns (`at - b < align`), so MAP_FIXED replaces only its own pages.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            file_off as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::Os {
            op: "mmap of the dma-buf (its exporter may not allow it)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(reservation)
}

impl Pd {
    /// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`: `length`
    /// bytes of dma-buf `fd` from `offset`, addressed by work requests at
    /// `iova` (which must agree with `offset` modulo 4 KiB, as mlx5's
    /// page-based translation needs).
    pub fn reg_dmabuf_mr(
        &self,
        offset: u64,
        length: u64,
        iova: u64,
        fd: RawFd,
        acc: u32,
    ) -> Result<Mr> {
        check_access(acc)?;
        let info = dmabuf_info(fd)?;
        let end = offset.checked_add(length);
        if length == 0 || end.is_none_or(|e| e > info.size) {
            return Err(Error::Invalid("dma-buf range past its size"));
        }
        if (iova ^ offset) % PAGE != 0 {
            return Err(Error::Invalid("iova and offset differ within a page"));
        }
        let file_off = offset & !(PAGE - 1);
        let map_len = (offset + length).next_multiple_of(PAGE) - file_off;
        // The MTT page `Placement` will pick for this mapping.
        let wide = self
            .inner
            .ctx
            .hca
            .caps()
            .gen2()
            .is_some_and(|g| g.umr_log_entity_size_5());
        let max = mlx5_hw::wqe::mkc_max_log_page_size(wide);
        let align = map_len
            .checked_next_power_of_two()
            .map_or(1u64 << max, |p| p.min(1u64 << max));
        let want = iova - (offset - file_off);
        let map = Arc::new(map_aligned(fd, file_off, map_len, want, align)?);
        let start = map.addr + (want.wrapping_sub(map.addr) & (align - 1));
        let m = Mapping::of_dmabuf(start, map_len, map);
        let host = start + (offset - file_off);
        let at = match crate::mr::Placement::map(&self.inner.ctx, host, length, &m) {
            Ok(at) => at,
            Err(Error::Vfio(e)) => {
                tracing::warn!(exporter = %info.exporter, "dma-buf not mappable for DMA: {e}");
                return Err(Error::NotSupported(
                    "this backend cannot map the dma-buf's pages for DMA (kernel VFIO type1 and \
                     iommufd refuse VM_PFNMAP RAM: map its memfd instead)",
                ));
            }
            Err(e) => return Err(e),
        };
        Mr::with_placement(&self.inner, iova, length, acc, at, m)
    }
}
