//! A VFIO device file: regions (with their capabilities), config space,
//! BAR mapping, interrupts and reset. The same for the group path and the
//! cdev path; only how the file was obtained differs.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use vm_memory::mmap::MmapRegion;
use vm_memory::FileOffset;
use vmm_sys_util::eventfd::EventFd;

use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_irq_info, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD,
    VFIO_IRQ_INFO_NORESIZE, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_DATA_EVENTFD,
    VFIO_IRQ_SET_DATA_NONE, VFIO_REGION_INFO_CAP_MSIX_MAPPABLE, VFIO_REGION_INFO_CAP_SPARSE_MMAP,
    VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

use super::ioctl::{self, AlignedBuf};
use super::sysfs::PciAddress;
use crate::{Error, IrqKind, Mmio, RegionInfo, Result};

/// A region as the kernel describes it, with where it lives in the device file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRegion {
    /// What the [`crate::PciFunction`] interface reports.
    pub info: RegionInfo,
    /// Offset of the region in the device file.
    pub file_offset: u64,
    /// The region may be mapped (`VFIO_REGION_INFO_FLAG_MMAP`).
    pub mmap: bool,
    /// The sparse-mmap capability was present (only `info.mmap_areas` may be mapped).
    pub sparse: bool,
    /// The MSI-X table in this BAR may be mapped (`VFIO_REGION_INFO_CAP_MSIX_MAPPABLE`).
    pub msix_mappable: bool,
}

/// Interrupt index info (`VFIO_DEVICE_GET_IRQ_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrqInfo {
    /// Number of vectors.
    pub count: u32,
    /// Vectors can be signalled through eventfds.
    pub eventfd: bool,
    /// Vectors cannot be added once enabled (`NORESIZE`): attach all at once.
    pub noresize: bool,
}

/// A function a hot reset would also reset (`struct vfio_pci_dependent_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotResetDevice {
    /// Its address.
    pub address: PciAddress,
    /// Its IOMMU group (group path) or iommufd devid (cdev path).
    pub group_or_devid: u32,
}

/// `VFIO_DEVICE_GET_PCI_HOT_RESET_INFO`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotResetInfo {
    /// Every function the reset would reach, this one included.
    pub devices: Vec<HotResetDevice>,
    /// The kernel says this iommufd owns them all (cdev path).
    pub owned_all: bool,
}

/// An open VFIO device file.
#[derive(Debug)]
pub struct Device {
    file: Arc<File>,
    flags: u32,
    num_regions: u32,
    num_irqs: u32,
    regions: Vec<Option<KernelRegion>>,
}

impl Device {
    /// Wraps a device file and reads its regions.
    pub(crate) fn new(file: File) -> Result<Self> {
        let mut info = vfio_device_info {
            argsz: ioctl::size_of_u32::<vfio_device_info>(),
            ..Default::default()
        };
        ioctl::ioctl_mut(
            file.as_fd(),
            ioctl::VFIO_DEVICE_GET_INFO,
            &mut info,
            "VFIO_DEVICE_GET_INFO",
        )?;
        let mut d = Device {
            file: Arc::new(file),
            flags: info.flags,
            num_regions: info.num_regions,
            num_irqs: info.num_irqs,
            regions: Vec::new(),
        };
        d.regions = (0..d.num_regions.min(16))
            .map(|i| d.query_region(i))
            .collect::<Result<_>>()?;
        Ok(d)
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Whether `VFIO_DEVICE_RESET` is offered.
    pub fn can_reset(&self) -> bool {
        self.flags & VFIO_DEVICE_FLAGS_RESET != 0
    }

    /// How many interrupt indexes the device has.
    pub fn num_irqs(&self) -> u32 {
        self.num_irqs
    }

    fn query_region(&self, index: u32) -> Result<Option<KernelRegion>> {
        const HEAD: usize = 32; // sizeof(struct vfio_region_info)
        let mut buf = AlignedBuf::new(HEAD);
        let ask = |buf: &mut AlignedBuf| {
            buf.put_u32(0, buf.len() as u32);
            buf.put_u32(8, index);
            ioctl::ioctl_buf(
                self.fd(),
                ioctl::VFIO_DEVICE_GET_REGION_INFO,
                buf,
                "VFIO_DEVICE_GET_REGION_INFO",
            )
        };
        match ask(&mut buf) {
            Ok(_) => {}
            // vfio-pci refuses an index the device lacks (VGA on a non-VGA function).
            Err(Error::Os { ref source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
        let need = buf.get_u32(0) as usize;
        if need > HEAD && need <= 1 << 16 {
            // The capabilities did not fit: ask again with the room the kernel named.
            buf = AlignedBuf::new(need);
            ask(&mut buf)?;
        }
        Ok(parse_region_info(&buf, index))
    }

    /// Region `index` with everything the kernel said about it.
    pub fn region(&self, index: u32) -> Result<&KernelRegion> {
        self.regions
            .get(index as usize)
            .and_then(Option::as_ref)
            .ok_or(Error::NoRegion(index))
    }

    fn bounded(&self, index: u32, offset: u64, len: usize) -> Result<u64> {
        let r = self.region(index)?;
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > r.info.size)
        {
            return Err(Error::OutOfBounds {
                what: "region",
                offset,
                len: len as u64,
                size: r.info.size,
            });
        }
        Ok(r.file_offset + offset)
    }

    /// Reads region `index` at `offset` through the kernel (pread).
    pub fn read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.bounded(index, offset, buf.len())?;
        self.file.read_exact_at(buf, at).map_err(|e| Error::Os {
            op: "pread(VFIO region)",
            source: e,
        })
    }

    /// Writes region `index` at `offset` through the kernel (pwrite).
    pub fn write(&self, index: u32, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.bounded(index, offset, data.len())?;
        self.file.write_all_at(data, at).map_err(|e| Error::Os {
            op: "pwrite(VFIO region)",
            source: e,
        })
    }

    /// Maps BAR `index`: all of it, or with the sparse-mmap capability the
    /// area at its start (the kernel leaves the MSI-X table out when the
    /// platform cannot isolate it; the rest stays reachable by
    /// [`read`](Self::read)/[`write`](Self::write)).
    pub fn map(&self, index: u32) -> Result<Mmio> {
        let r = self.region(index)?;
        if !r.mmap {
            return Err(Error::NotMappable(index));
        }
        let len = if r.sparse {
            // The contiguous mappable prefix that starts at offset 0.
            let mut areas = r.info.mmap_areas.clone();
            areas.sort();
            let mut end = 0u64;
            for (off, len) in areas {
                if off > end {
                    break;
                }
                end = end.max(off + len);
            }
            if end < r.info.size {
                tracing::warn!(
                    "region {index}: only {end:#x} of {:#x} bytes are mappable from offset 0",
                    r.info.size
                );
            }
            end
        } else {
            r.info.size
        };
        if len == 0 {
            return Err(Error::NotMappable(index));
        }
        let size = usize::try_from(len).map_err(|_| Error::NotMappable(index))?;
        let region = MmapRegion::<()>::build(
            Some(FileOffset::from_arc(self.file.clone(), r.file_offset)),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(|e| Error::Os {
            op: "mmap(VFIO BAR)",
            source: std::io::Error::other(e.to_string()),
        })?;
        // vfio-pci maps every BAR uncached (`vfio_pci_core_mmap`:
        // `pgprot_noncached`); it offers no write-combining mapping.
        Ok(Mmio::with_type(region, 0, crate::MemType::Uncached))
    }

    /// `VFIO_DEVICE_GET_IRQ_INFO` for `kind`.
    pub fn irq_info(&self, kind: IrqKind) -> Result<IrqInfo> {
        if kind as u32 >= self.num_irqs {
            return Ok(IrqInfo {
                count: 0,
                eventfd: false,
                noresize: true,
            });
        }
        let mut info = vfio_irq_info {
            argsz: ioctl::size_of_u32::<vfio_irq_info>(),
            index: kind as u32,
            ..Default::default()
        };
        ioctl::ioctl_mut(
            self.fd(),
            ioctl::VFIO_DEVICE_GET_IRQ_INFO,
            &mut info,
            "VFIO_DEVICE_GET_IRQ_INFO",
        )?;
        Ok(IrqInfo {
            count: info.count,
            eventfd: info.flags & VFIO_IRQ_INFO_EVENTFD != 0,
            noresize: info.flags & VFIO_IRQ_INFO_NORESIZE != 0,
        })
    }

    /// Routes vectors `start ..` of `kind` to `fds` (`None` = detached); an
    /// empty `fds` disables the whole index.
    pub fn set_irqs(&self, kind: IrqKind, start: u32, fds: &[Option<&EventFd>]) -> Result<()> {
        let count = self.irq_info(kind)?.count;
        if !fds.is_empty() && u64::from(start) + fds.len() as u64 > u64::from(count) {
            return Err(Error::NoVector {
                kind,
                vector: start,
                count,
            });
        }
        const HEAD: usize = 20; // sizeof(struct vfio_irq_set)
        let mut buf = AlignedBuf::new(HEAD + 4 * fds.len());
        buf.put_u32(0, buf.len() as u32);
        let data = if fds.is_empty() {
            VFIO_IRQ_SET_DATA_NONE
        } else {
            VFIO_IRQ_SET_DATA_EVENTFD
        };
        buf.put_u32(4, data | VFIO_IRQ_SET_ACTION_TRIGGER);
        buf.put_u32(8, kind as u32);
        buf.put_u32(12, if fds.is_empty() { 0 } else { start });
        buf.put_u32(16, fds.len() as u32);
        for (i, fd) in fds.iter().enumerate() {
            buf.put_i32(HEAD + 4 * i, fd.map_or(-1, |f| f.as_raw_fd()));
        }
        ioctl::ioctl_buf(
            self.fd(),
            ioctl::VFIO_DEVICE_SET_IRQS,
            &mut buf,
            "VFIO_DEVICE_SET_IRQS",
        )?;
        Ok(())
    }

    /// Unmasks vector `vector` of `kind`. INTx is level-triggered: the
    /// kernel masks it when it fires, and the owner unmasks it once the
    /// device's interrupt status is acknowledged.
    pub fn unmask(&self, kind: IrqKind, vector: u32) -> Result<()> {
        let mut buf = AlignedBuf::new(20);
        buf.put_u32(0, 20);
        buf.put_u32(
            4,
            VFIO_IRQ_SET_DATA_NONE | vfio_bindings::bindings::vfio::VFIO_IRQ_SET_ACTION_UNMASK,
        );
        buf.put_u32(8, kind as u32);
        buf.put_u32(12, vector);
        buf.put_u32(16, 1);
        ioctl::ioctl_buf(
            self.fd(),
            ioctl::VFIO_DEVICE_SET_IRQS,
            &mut buf,
            "VFIO_DEVICE_SET_IRQS(unmask)",
        )?;
        Ok(())
    }

    /// `VFIO_DEVICE_RESET`: function-level (or the best the device offers) reset.
    pub fn reset(&self) -> Result<()> {
        if !self.can_reset() {
            return Err(Error::Unsupported(
                "function reset (the device offers no FLR, PM or slot reset)",
            ));
        }
        ioctl::ioctl_val(self.fd(), ioctl::VFIO_DEVICE_RESET, 0, "VFIO_DEVICE_RESET")?;
        Ok(())
    }

    /// The devices a hot (bus) reset would also reset, and whether the
    /// kernel says we own them all (cdev path only).
    pub fn hot_reset_info(&self) -> Result<HotResetInfo> {
        const HEAD: usize = 12;
        let mut buf = AlignedBuf::new(HEAD);
        buf.put_u32(0, HEAD as u32);
        let first = ioctl::ioctl_buf(
            self.fd(),
            ioctl::VFIO_DEVICE_GET_PCI_HOT_RESET_INFO,
            &mut buf,
            "VFIO_DEVICE_GET_PCI_HOT_RESET_INFO",
        );
        // ENOSPC: the count is filled in, ask again with room for it.
        match first {
            Ok(_) => {}
            Err(Error::Os { ref source, .. }) if source.raw_os_error() == Some(libc::ENOSPC) => {}
            Err(e) => return Err(e),
        }
        let count = (buf.get_u32(8) as usize).min(256);
        if count > 0 {
            buf = AlignedBuf::new(HEAD + 8 * count);
            buf.put_u32(0, buf.len() as u32);
            ioctl::ioctl_buf(
                self.fd(),
                ioctl::VFIO_DEVICE_GET_PCI_HOT_RESET_INFO,
                &mut buf,
                "VFIO_DEVICE_GET_PCI_HOT_RESET_INFO",
            )?;
        }
        let flags = buf.get_u32(4);
        let owned_all =
            flags & vfio_bindings::bindings::vfio::VFIO_PCI_HOT_RESET_FLAG_DEV_ID_OWNED != 0;
        let devs = (0..count.min(buf.get_u32(8) as usize))
            .map(|i| {
                let a = HEAD + 8 * i;
                let seg = buf.get_u16(a + 4);
                let bus = (buf.get_u16(a + 6) & 0xff) as u8;
                let devfn = (buf.get_u16(a + 6) >> 8) as u8;
                HotResetDevice {
                    address: PciAddress {
                        domain: seg,
                        bus,
                        device: devfn >> 3,
                        function: devfn & 7,
                    },
                    group_or_devid: buf.get_u32(a),
                }
            })
            .collect();
        Ok(HotResetInfo {
            devices: devs,
            owned_all,
        })
    }

    /// `VFIO_DEVICE_PCI_HOT_RESET` proving ownership with `group_fds` (the
    /// group path) or with none (the cdev path, where the iommufd proves it).
    pub fn hot_reset(&self, group_fds: &[BorrowedFd<'_>]) -> Result<()> {
        const HEAD: usize = 12;
        let mut buf = AlignedBuf::new(HEAD + 4 * group_fds.len());
        buf.put_u32(0, buf.len() as u32);
        buf.put_u32(8, group_fds.len() as u32);
        for (i, fd) in group_fds.iter().enumerate() {
            buf.put_i32(HEAD + 4 * i, fd.as_raw_fd());
        }
        ioctl::ioctl_buf(
            self.fd(),
            ioctl::VFIO_DEVICE_PCI_HOT_RESET,
            &mut buf,
            "VFIO_DEVICE_PCI_HOT_RESET",
        )?;
        Ok(())
    }
}

/// Parses a `struct vfio_region_info` answer with its capability chain
/// (`None`: the region does not exist). Bounds-checked: areas outside the
/// region or the buffer are dropped.
fn parse_region_info(buf: &AlignedBuf, index: u32) -> Option<KernelRegion> {
    let flags = buf.get_u32(4);
    let size = buf.get_u64(16);
    if size == 0 {
        return None;
    }
    let mut region = KernelRegion {
        info: RegionInfo {
            index,
            size,
            read: flags & VFIO_REGION_INFO_FLAG_READ != 0,
            write: flags & VFIO_REGION_INFO_FLAG_WRITE != 0,
            mmap_areas: Vec::new(),
        },
        file_offset: buf.get_u64(24),
        mmap: flags & VFIO_REGION_INFO_FLAG_MMAP != 0,
        sparse: false,
        msix_mappable: false,
    };
    if flags & VFIO_REGION_INFO_FLAG_CAPS != 0 {
        for (id, _ver, at) in buf.caps(buf.get_u32(12)) {
            match u32::from(id) {
                VFIO_REGION_INFO_CAP_SPARSE_MMAP => {
                    region.sparse = true;
                    let n = buf.get_u32(at + 8) as usize;
                    for i in 0..n.min(64) {
                        let a = at + 16 + i * 16;
                        if a + 16 > buf.len() {
                            break;
                        }
                        let (off, len) = (buf.get_u64(a), buf.get_u64(a + 8));
                        if len > 0 && off.checked_add(len).is_some_and(|e| e <= size) {
                            region.info.mmap_areas.push((off, len));
                        }
                    }
                }
                VFIO_REGION_INFO_CAP_MSIX_MAPPABLE => region.msix_mappable = true,
                _ => {}
            }
        }
    }
    if region.mmap && !region.sparse {
        region.info.mmap_areas.push((0, size));
    }
    if !region.mmap {
        region.info.mmap_areas.clear();
    }
    Some(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A region-info answer as vfio-pci writes it for a BAR whose MSI-X
    /// table may not be mapped: sparse areas around it, then MSIX_MAPPABLE.
    fn answer(flags: u32, areas: &[(u64, u64)], msix_mappable: bool) -> AlignedBuf {
        let mut b = AlignedBuf::new(256);
        b.put_u32(0, 256);
        b.put_u32(4, flags | VFIO_REGION_INFO_FLAG_CAPS);
        b.put_u32(8, 0);
        b.put_u32(12, 32);
        let put64 = |b: &mut AlignedBuf, at: usize, v: u64| {
            b.put_u32(at, v as u32);
            b.put_u32(at + 4, (v >> 32) as u32);
        };
        put64(&mut b, 16, 0x4_0000);
        put64(&mut b, 24, 0x1000_0000_0000);
        // Sparse mmap at 32: header, nr_areas, reserved, areas.
        b.put_u32(32, VFIO_REGION_INFO_CAP_SPARSE_MMAP | (1 << 16));
        let after = 48 + 16 * areas.len();
        b.put_u32(36, if msix_mappable { after as u32 } else { 0 });
        b.put_u32(40, areas.len() as u32);
        for (i, (off, len)) in areas.iter().enumerate() {
            put64(&mut b, 48 + 16 * i, *off);
            put64(&mut b, 56 + 16 * i, *len);
        }
        if msix_mappable {
            b.put_u32(after, VFIO_REGION_INFO_CAP_MSIX_MAPPABLE | (1 << 16));
        }
        b
    }

    #[test]
    fn sparse_mmap_and_msix_mappable_capabilities() {
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        let b = answer(
            rw | VFIO_REGION_INFO_FLAG_MMAP,
            &[(0, 0x2000), (0x3000, 0x1_d000)],
            true,
        );
        let r = parse_region_info(&b, 0).unwrap();
        assert!(r.sparse && r.msix_mappable && r.mmap);
        assert_eq!(r.info.mmap_areas, vec![(0, 0x2000), (0x3000, 0x1_d000)]);
        assert_eq!((r.info.size, r.file_offset), (0x4_0000, 0x1000_0000_0000));
        // An area reaching past the region is dropped; so are all areas of
        // a region that may not be mapped at all.
        let b = answer(
            rw | VFIO_REGION_INFO_FLAG_MMAP,
            &[(0x3_f000, 0x2000)],
            false,
        );
        let r = parse_region_info(&b, 0).unwrap();
        assert!(r.info.mmap_areas.is_empty() && !r.msix_mappable);
        let b = answer(rw, &[(0, 0x2000)], false);
        assert!(parse_region_info(&b, 0).unwrap().info.mmap_areas.is_empty());
    }

    #[test]
    fn a_region_without_sparse_areas_maps_whole() {
        let mut b = AlignedBuf::new(32);
        b.put_u32(4, VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_MMAP);
        b.put_u32(16, 0x10_0000);
        let r = parse_region_info(&b, 2).unwrap();
        assert_eq!(r.info.mmap_areas, vec![(0, 0x10_0000)]);
        assert!(!r.info.write);
        b.put_u32(16, 0);
        assert!(parse_region_info(&b, 2).is_none(), "size 0: no region");
    }
}
