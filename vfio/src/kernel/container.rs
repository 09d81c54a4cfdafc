//! The legacy interface: a type1v2 container (`/dev/vfio/vfio`) holding a
//! group (`/dev/vfio/N`), or in no-IOMMU mode a `noiommu-N` group in a
//! container of type `VFIO_NOIOMMU_IOMMU`.
//!
//! The IOMMU's usable IOVA ranges come from `VFIO_IOMMU_GET_INFO`'s
//! `IOVA_RANGE` capability; the mappings left come from its `DMA_AVAIL`
//! capability (the `dma_entry_limit` module parameter of
//! vfio_iommu_type1).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd};

use vfio_bindings::bindings::vfio::{
    vfio_group_status, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, VFIO_TYPE1v2_IOMMU,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_GROUP_FLAGS_VIABLE, VFIO_IOMMU_INFO_CAPS,
    VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL, VFIO_NOIOMMU_IOMMU,
};

use super::ioctl::{self, AlignedBuf};
use super::{map_error, DmaAccess};
use crate::{Error, IovaRange, Result};

/// A container with one group attached.
#[derive(Debug)]
pub struct Container {
    // Field order is drop order: the group leaves the container before the
    // container closes.
    group: File,
    container: File,
    group_id: u32,
    noiommu: bool,
}

fn open_rw(path: &str, op: &'static str) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Error::Os { op, source: e })
}

impl Container {
    /// Opens group `group_id` (the `noiommu-N` node when `noiommu`) in a new
    /// container and sets the IOMMU type.
    pub(crate) fn open(group_id: u32, noiommu: bool) -> Result<Self> {
        let container = open_rw("/dev/vfio/vfio", "open /dev/vfio/vfio")?;
        let version = ioctl::ioctl_val(
            container.as_fd(),
            ioctl::VFIO_GET_API_VERSION,
            0,
            "VFIO_GET_API_VERSION",
        )?;
        if version != 0 {
            return Err(Error::Unsupported("VFIO API version other than 0"));
        }
        let kind = if noiommu {
            VFIO_NOIOMMU_IOMMU
        } else {
            VFIO_TYPE1v2_IOMMU
        };
        let has = ioctl::ioctl_val(
            container.as_fd(),
            ioctl::VFIO_CHECK_EXTENSION,
            kind.into(),
            "VFIO_CHECK_EXTENSION",
        )?;
        if has == 0 {
            return Err(Error::Unsupported(if noiommu {
                "no-IOMMU mode (load vfio with enable_unsafe_noiommu_mode=1)"
            } else {
                "the type1v2 IOMMU (modprobe vfio_iommu_type1)"
            }));
        }
        let path = if noiommu {
            format!("/dev/vfio/noiommu-{group_id}")
        } else {
            format!("/dev/vfio/{group_id}")
        };
        let group = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EBUSY) => Error::Setup {
                    device: path.clone(),
                    problem: "is already open (another process, or this one, owns the group)"
                        .into(),
                    fix: "close the other owner first (fuser -v <path> shows it)".into(),
                },
                _ => Error::Os {
                    op: "open VFIO group",
                    source: e,
                },
            })?;
        let mut status = vfio_group_status {
            argsz: ioctl::size_of_u32::<vfio_group_status>(),
            ..Default::default()
        };
        ioctl::ioctl_mut(
            group.as_fd(),
            ioctl::VFIO_GROUP_GET_STATUS,
            &mut status,
            "VFIO_GROUP_GET_STATUS",
        )?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            return Err(Error::Setup {
                device: path,
                problem: "is not viable: a device in it is bound to a host driver".into(),
                fix: format!(
                    "bind every device of /sys/kernel/iommu_groups/{group_id}/devices to \
                     vfio-pci or unbind it"
                ),
            });
        }
        let cfd: libc::c_int = container.as_raw_fd();
        // SAFETY: VFIO_GROUP_SET_CONTAINER reads one int (the container fd)
        // from the pointer, which points at a live local.
        let r = unsafe {
            libc::ioctl(
                group.as_raw_fd(),
                ioctl::VFIO_GROUP_SET_CONTAINER as _,
                &cfd as *const libc::c_int,
            )
        };
        if r < 0 {
            return Err(Error::os("VFIO_GROUP_SET_CONTAINER"));
        }
        ioctl::ioctl_val(
            container.as_fd(),
            ioctl::VFIO_SET_IOMMU,
            kind.into(),
            "VFIO_SET_IOMMU",
        )?;
        Ok(Container {
            group,
            container,
            group_id,
            noiommu,
        })
    }

    /// The group's number.
    pub fn group_id(&self) -> u32 {
        self.group_id
    }

    /// The group file (what a hot reset takes as proof of ownership).
    pub fn group_fd(&self) -> BorrowedFd<'_> {
        self.group.as_fd()
    }

    /// Opens the device `name` (its PCI address) of the group.
    pub(crate) fn device(&self, name: &str) -> Result<File> {
        let c = CString::new(name).map_err(|_| Error::Unsupported("device name with a NUL"))?;
        // SAFETY: VFIO_GROUP_GET_DEVICE_FD reads the NUL-terminated name the
        // pointer names (alive for the call) and returns a new descriptor.
        let fd = unsafe {
            libc::ioctl(
                self.group.as_raw_fd(),
                ioctl::VFIO_GROUP_GET_DEVICE_FD as _,
                c.as_ptr(),
            )
        };
        if fd < 0 {
            return Err(Error::os("VFIO_GROUP_GET_DEVICE_FD"));
        }
        // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// `VFIO_IOMMU_GET_INFO`: usable IOVA ranges and mappings left.
    pub(crate) fn iommu_info(&self) -> Result<(Vec<IovaRange>, Option<u32>)> {
        if self.noiommu {
            return Ok((Vec::new(), None));
        }
        const HEAD: usize = 24; // sizeof(struct vfio_iommu_type1_info)
        let mut buf = AlignedBuf::new(HEAD);
        let ask = |buf: &mut AlignedBuf| {
            buf.put_u32(0, buf.len() as u32);
            ioctl::ioctl_buf(
                self.container.as_fd(),
                ioctl::VFIO_IOMMU_GET_INFO,
                buf,
                "VFIO_IOMMU_GET_INFO",
            )
        };
        ask(&mut buf)?;
        let need = buf.get_u32(0) as usize;
        if need > HEAD && need <= 1 << 20 {
            buf = AlignedBuf::new(need);
            ask(&mut buf)?;
        }
        Ok(parse_iommu_info(&buf))
    }

    /// `VFIO_IOMMU_MAP_DMA` of `len` bytes at host address `vaddr` to `iova`.
    pub(crate) fn map(&self, iova: u64, vaddr: u64, len: u64, access: DmaAccess) -> Result<()> {
        let mut flags = 0;
        if access.read {
            flags |= VFIO_DMA_MAP_FLAG_READ;
        }
        if access.write {
            flags |= VFIO_DMA_MAP_FLAG_WRITE;
        }
        let mut m = vfio_iommu_type1_dma_map {
            argsz: ioctl::size_of_u32::<vfio_iommu_type1_dma_map>(),
            flags,
            vaddr,
            iova,
            size: len,
        };
        ioctl::ioctl_mut(
            self.container.as_fd(),
            ioctl::VFIO_IOMMU_MAP_DMA,
            &mut m,
            "VFIO_IOMMU_MAP_DMA",
        )
        .map(|_| ())
        .map_err(|e| map_error(e, iova, len, "vfio_iommu_type1.dma_entry_limit"))
    }

    /// `VFIO_IOMMU_UNMAP_DMA` of exactly the mapping at `iova`.
    pub(crate) fn unmap(&self, iova: u64, len: u64) -> Result<()> {
        let mut u = vfio_iommu_type1_dma_unmap {
            argsz: ioctl::size_of_u32::<vfio_iommu_type1_dma_unmap>(),
            flags: 0,
            iova,
            size: len,
            ..Default::default()
        };
        ioctl::ioctl_mut(
            self.container.as_fd(),
            ioctl::VFIO_IOMMU_UNMAP_DMA,
            &mut u,
            "VFIO_IOMMU_UNMAP_DMA",
        )?;
        if u.size != len {
            return Err(Error::Iova {
                iova,
                len,
                why: "the kernel unmapped a different length",
            });
        }
        Ok(())
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // The device file is closed by now (its owner drops it first).
        let cfd: libc::c_int = self.container.as_raw_fd();
        // SAFETY: VFIO_GROUP_UNSET_CONTAINER takes the container fd by
        // pointer (older kernels ignore it); the local lives for the call.
        let r = unsafe {
            libc::ioctl(
                self.group.as_raw_fd(),
                ioctl::VFIO_GROUP_UNSET_CONTAINER as _,
                &cfd as *const libc::c_int,
            )
        };
        if r < 0 {
            tracing::warn!(
                "VFIO_GROUP_UNSET_CONTAINER (group {}): {}",
                self.group_id,
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Parses a `struct vfio_iommu_type1_info` answer: the usable IOVA ranges
/// (`IOVA_RANGE`; x86's when the kernel predates it) and the mappings left
/// (`DMA_AVAIL`), bounds-checked.
fn parse_iommu_info(buf: &AlignedBuf) -> (Vec<IovaRange>, Option<u32>) {
    let mut ranges = Vec::new();
    let mut avail = None;
    if buf.get_u32(4) & VFIO_IOMMU_INFO_CAPS != 0 {
        for (id, _ver, at) in buf.caps(buf.get_u32(16)) {
            match u32::from(id) {
                VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE => {
                    let n = buf.get_u32(at + 8) as usize;
                    for i in 0..n.min(4096) {
                        let a = at + 16 + 16 * i;
                        if a + 16 > buf.len() {
                            break;
                        }
                        ranges.push(IovaRange {
                            start: buf.get_u64(a),
                            last: buf.get_u64(a + 8),
                        });
                    }
                }
                VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL => avail = Some(buf.get_u32(at + 8)),
                _ => {}
            }
        }
    }
    if ranges.is_empty() {
        // A kernel before 5.4 has no IOVA_RANGE: what x86 allows.
        ranges = vec![
            IovaRange {
                start: 0,
                last: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                last: (1 << 39) - 1,
            },
        ];
    }
    (ranges, avail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iova_ranges_and_mappings_left() {
        let mut b = AlignedBuf::new(128);
        b.put_u32(0, 128);
        b.put_u32(4, VFIO_IOMMU_INFO_CAPS | 1);
        b.put_u32(16, 24);
        // IOVA_RANGE at 24: header, nr_iovas, reserved, ranges; then DMA_AVAIL.
        b.put_u32(24, VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE | (1 << 16));
        b.put_u32(28, 72);
        b.put_u32(32, 2);
        b.put_u32(40, 0);
        b.put_u32(48, 0xfedf_ffff);
        b.put_u32(56, 0xfef0_0000);
        b.put_u32(64, 0xffff_ffff);
        b.put_u32(68, 0x7f);
        b.put_u32(72, VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL | (1 << 16));
        b.put_u32(80, 65535);
        let (ranges, avail) = parse_iommu_info(&b);
        assert_eq!(
            ranges,
            vec![
                IovaRange {
                    start: 0,
                    last: 0xfedf_ffff
                },
                IovaRange {
                    start: 0xfef0_0000,
                    last: 0x7f_ffff_ffff
                }
            ]
        );
        assert_eq!(avail, Some(65535));
        // A count larger than the answer stops at its end: (128 - 40) / 16 ranges.
        b.put_u32(32, 1000);
        assert_eq!(parse_iommu_info(&b).0.len(), 5);
        // No capabilities: x86's ranges.
        b.put_u32(4, 1);
        let (ranges, avail) = parse_iommu_info(&b);
        assert_eq!((ranges.len(), avail), (2, None));
    }
}
