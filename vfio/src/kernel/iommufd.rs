//! The iommufd interface: the device cdev (`/dev/vfio/devices/vfioN`)
//! bound to an iommufd (`/dev/iommu`) and attached to an IO address space
//! (IOAS) into which we map at fixed IOVAs.
//!
//! Order, as the kernel requires: open the cdev, `VFIO_DEVICE_BIND_IOMMUFD`
//! (nothing else is allowed on the cdev before it), `IOMMU_IOAS_ALLOC`,
//! `VFIO_DEVICE_ATTACH_IOMMUFD_PT`, then `IOMMU_IOAS_IOVA_RANGES` (the
//! ranges narrow when a device attaches, so they are read after it).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::ioctl::{self, IommuDestroy, IommuIoasAlloc, IommuIoasIovaRanges, IommuIovaRange};
use super::ioctl::{
    IommuIoasMap, IommuIoasMapFile, IommuIoasUnmap, VfioDeviceAttachIommufdPt,
    VfioDeviceBindIommufd,
};
use super::{map_error, DmaAccess};
use crate::{Error, IovaRange, Result};

/// An iommufd with one IOAS.
#[derive(Debug)]
pub struct Iommufd {
    iommufd: File,
    ioas: u32,
    /// The kernel answered IOMMU_IOAS_MAP_FILE with ENOTTY/EOPNOTSUPP
    /// (before 6.13, or a file it cannot map): map by address from then on.
    no_map_file: AtomicBool,
    /// Mappings made by `IOMMU_IOAS_MAP_FILE`, and by address after the
    /// kernel refused it.
    by_file: AtomicU64,
    fell_back: AtomicU64,
}

impl Iommufd {
    /// Opens `/dev/iommu`, binds the cdev `device` to it and attaches it to
    /// a new IOAS. `device` may be used for everything else afterwards.
    pub(crate) fn bind(device: &File) -> Result<Self> {
        let iommufd = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/iommu")
            .map_err(|e| Error::Os {
                op: "open /dev/iommu",
                source: e,
            })?;
        let mut bind = VfioDeviceBindIommufd {
            argsz: ioctl::size_of_u32::<VfioDeviceBindIommufd>(),
            flags: 0,
            iommufd: iommufd.as_raw_fd(),
            out_devid: 0,
        };
        ioctl::ioctl_mut(
            device.as_fd(),
            ioctl::VFIO_DEVICE_BIND_IOMMUFD,
            &mut bind,
            "VFIO_DEVICE_BIND_IOMMUFD",
        )?;
        let mut alloc = IommuIoasAlloc {
            size: ioctl::size_of_u32::<IommuIoasAlloc>(),
            ..Default::default()
        };
        ioctl::ioctl_mut(
            iommufd.as_fd(),
            ioctl::IOMMU_IOAS_ALLOC,
            &mut alloc,
            "IOMMU_IOAS_ALLOC",
        )?;
        let me = Iommufd {
            iommufd,
            ioas: alloc.out_ioas_id,
            no_map_file: AtomicBool::new(false),
            by_file: AtomicU64::new(0),
            fell_back: AtomicU64::new(0),
        };
        let mut attach = VfioDeviceAttachIommufdPt {
            argsz: ioctl::size_of_u32::<VfioDeviceAttachIommufdPt>(),
            flags: 0,
            pt_id: me.ioas,
        };
        ioctl::ioctl_mut(
            device.as_fd(),
            ioctl::VFIO_DEVICE_ATTACH_IOMMUFD_PT,
            &mut attach,
            "VFIO_DEVICE_ATTACH_IOMMUFD_PT",
        )?;
        Ok(me)
    }

    /// `IOMMU_IOAS_IOVA_RANGES`: where mappings may go, and the IOVA alignment.
    pub(crate) fn iova_ranges(&self) -> Result<(Vec<IovaRange>, u64)> {
        let mut ranges: Vec<IommuIovaRange> = Vec::new();
        for _ in 0..4 {
            let mut q = IommuIoasIovaRanges {
                size: ioctl::size_of_u32::<IommuIoasIovaRanges>(),
                ioas_id: self.ioas,
                num_iovas: ranges.len() as u32,
                allowed_iovas: ranges.as_mut_ptr() as u64,
                ..Default::default()
            };
            match ioctl::ioctl_mut(
                self.iommufd.as_fd(),
                ioctl::IOMMU_IOAS_IOVA_RANGES,
                &mut q,
                "IOMMU_IOAS_IOVA_RANGES",
            ) {
                Ok(_) => {
                    let n = (q.num_iovas as usize).min(ranges.len());
                    let out = ranges[..n]
                        .iter()
                        .map(|r| IovaRange {
                            start: r.start,
                            last: r.last,
                        })
                        .collect();
                    return Ok((out, q.out_iova_alignment.max(1)));
                }
                // EMSGSIZE: num_iovas now says how many there are.
                Err(Error::Os { ref source, .. })
                    if source.raw_os_error() == Some(libc::EMSGSIZE) =>
                {
                    ranges = vec![IommuIovaRange::default(); (q.num_iovas as usize).min(4096)];
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Unsupported("IOVA ranges that keep changing"))
    }

    fn map_flags(access: DmaAccess) -> u32 {
        let mut flags = ioctl::IOMMU_IOAS_MAP_FIXED_IOVA;
        if access.read {
            flags |= ioctl::IOMMU_IOAS_MAP_READABLE;
        }
        if access.write {
            flags |= ioctl::IOMMU_IOAS_MAP_WRITEABLE;
        }
        flags
    }

    /// `IOMMU_IOAS_MAP_FILE` of `len` bytes of `file` from `offset` to the
    /// fixed `iova` (the kernel pins the file's pages, whatever maps them);
    /// `Ok(false)` when this kernel cannot (before 6.13: ENOTTY; a file
    /// that is not a memfd: EOPNOTSUPP/EINVAL) and the caller maps by
    /// address instead.
    pub(crate) fn map_file(
        &self,
        iova: u64,
        file: &File,
        offset: u64,
        len: u64,
        access: DmaAccess,
    ) -> Result<bool> {
        if self.no_map_file.load(Ordering::Relaxed) {
            self.fell_back.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let mut m = IommuIoasMapFile {
            size: ioctl::size_of_u32::<IommuIoasMapFile>(),
            flags: Self::map_flags(access),
            ioas_id: self.ioas,
            fd: file.as_raw_fd(),
            start: offset,
            length: len,
            iova,
        };
        match ioctl::ioctl_mut(
            self.iommufd.as_fd(),
            ioctl::IOMMU_IOAS_MAP_FILE,
            &mut m,
            "IOMMU_IOAS_MAP_FILE",
        ) {
            Ok(_) => {
                self.by_file.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(Error::Os { ref source, .. })
                if matches!(
                    source.raw_os_error(),
                    Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL)
                ) =>
            {
                if source.raw_os_error() == Some(libc::ENOTTY) {
                    self.no_map_file.store(true, Ordering::Relaxed);
                }
                tracing::debug!("IOMMU_IOAS_MAP_FILE: {source}; mapping by address");
                self.fell_back.fetch_add(1, Ordering::Relaxed);
                Ok(false)
            }
            Err(e) => Err(map_error(e, iova, len, "the IOAS")),
        }
    }

    /// (mappings made by `IOMMU_IOAS_MAP_FILE`, file-backed mappings made
    /// by address because the kernel refused it, whether it answered
    /// ENOTTY: a kernel before 6.13).
    pub(crate) fn map_file_stats(&self) -> (u64, u64, bool) {
        (
            self.by_file.load(Ordering::Relaxed),
            self.fell_back.load(Ordering::Relaxed),
            self.no_map_file.load(Ordering::Relaxed),
        )
    }

    /// `IOMMU_IOAS_MAP` of `len` bytes at `vaddr` to the fixed `iova`.
    pub(crate) fn map(&self, iova: u64, vaddr: u64, len: u64, access: DmaAccess) -> Result<()> {
        let flags = Self::map_flags(access);
        let mut m = IommuIoasMap {
            size: ioctl::size_of_u32::<IommuIoasMap>(),
            flags,
            ioas_id: self.ioas,
            reserved: 0,
            user_va: vaddr,
            length: len,
            iova,
        };
        ioctl::ioctl_mut(
            self.iommufd.as_fd(),
            ioctl::IOMMU_IOAS_MAP,
            &mut m,
            "IOMMU_IOAS_MAP",
        )
        .map(|_| ())
        .map_err(|e| map_error(e, iova, len, "the IOAS"))
    }

    /// `IOMMU_IOAS_UNMAP` of exactly the mapping at `iova`.
    pub(crate) fn unmap(&self, iova: u64, len: u64) -> Result<()> {
        let mut u = IommuIoasUnmap {
            size: ioctl::size_of_u32::<IommuIoasUnmap>(),
            ioas_id: self.ioas,
            iova,
            length: len,
        };
        ioctl::ioctl_mut(
            self.iommufd.as_fd(),
            ioctl::IOMMU_IOAS_UNMAP,
            &mut u,
            "IOMMU_IOAS_UNMAP",
        )?;
        if u.length != len {
            return Err(Error::Iova {
                iova,
                len,
                why: "the kernel unmapped a different length",
            });
        }
        Ok(())
    }
}

impl Drop for Iommufd {
    fn drop(&mut self) {
        // The device (and with it the attachment) is gone by now; the IOAS
        // would also go with the iommufd, but say so explicitly.
        let mut d = IommuDestroy {
            size: ioctl::size_of_u32::<IommuDestroy>(),
            id: self.ioas,
        };
        if let Err(e) = ioctl::ioctl_mut(
            self.iommufd.as_fd(),
            ioctl::IOMMU_DESTROY,
            &mut d,
            "IOMMU_DESTROY",
        ) {
            tracing::warn!("IOMMU_DESTROY of IOAS {}: {e}", self.ioas);
        }
    }
}
