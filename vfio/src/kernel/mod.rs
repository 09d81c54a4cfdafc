//! The kernel backend: a PCI function owned through Linux's VFIO.
//!
//! The kernel offers two ways in, and [`open`] takes either:
//!
//! - **group** ([`container`]): the function's IOMMU group `/dev/vfio/N` is
//!   put in a type1v2 container `/dev/vfio/vfio`, which owns the IOMMU page
//!   tables; the device file comes from the group;
//! - **cdev** ([`iommufd`]): the device's own node `/dev/vfio/devices/vfioN`
//!   is bound to an iommufd `/dev/iommu` and attached to an IO address
//!   space there (Linux 6.6+ with `CONFIG_IOMMUFD` and
//!   `CONFIG_VFIO_DEVICE_CDEV`).
//!
//! [`Interface::Auto`] takes the cdev when the kernel has one for the
//! function. Without an IOMMU, **no-IOMMU mode** (`/dev/vfio/noiommu-N`)
//! gives the device physical addresses and no protection at all: it is
//! refused unless [`OpenOptions::noiommu`] asks for it, and then logged as
//! a warning.
//!
//! Before anything is opened, [`sysfs`] checks the function (IDs, driver,
//! IOMMU group and the group's other devices) and says what to do when it
//! is not ready. Both interfaces end in the same [`device::Device`]
//! (regions, config space, BAR mapping, interrupts, reset), and
//! [`KernelFunction`] presents it as a [`PciFunction`], the interface the
//! driver uses for every backend.
//!
//! DMA: the kernel pins the pages of a buffer while it is mapped; the
//! backend holds the [`DmaBuffer`] until it is unmapped, and checks IOVAs
//! against the usable ranges and its own mappings before the kernel sees
//! them. A mapping refused for `RLIMIT_MEMLOCK` or for the mapping-count
//! limit says so by name ([`Error::MemlockLimit`], [`Error::MappingLimit`]).

pub mod container;
pub mod device;
mod ioctl;
pub mod iommufd;
pub mod sysfs;

use std::collections::BTreeMap;
use std::fs::OpenOptions as FsOpenOptions;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use crate::function::CONFIG_REGION;
use crate::{DmaBuffer, Error, Iova, IovaRange, IrqKind, Mmio, PciFunction, RegionInfo, Result};

pub use container::Container;
pub use device::{Device, HotResetDevice, HotResetInfo, IrqInfo, KernelRegion};
pub use iommufd::Iommufd;
pub use sysfs::{PciAddress, PciDeviceInfo, Sysfs};

/// Which kernel interface to own the function through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Interface {
    /// The cdev when the kernel offers one for the function, else the group.
    #[default]
    Auto,
    /// The type1v2 container and the group.
    Group,
    /// iommufd and the device cdev.
    Cdev,
}

/// How to open a function.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The interface ([`Interface::Auto`] by default).
    pub interface: Interface,
    /// Accept no-IOMMU mode (unprotected DMA to physical addresses).
    pub noiommu: bool,
    /// Refuse a function whose (vendor, device) is not this.
    pub expect_id: Option<(u16, u16)>,
    /// Where sysfs is (`/sys` when `None`).
    pub sysfs_root: Option<std::path::PathBuf>,
    /// Refuse a function this says no to, by (vendor, device), before
    /// anything else is checked or suggested (binding a disk to vfio-pci
    /// is never the fix). `what` names the functions accepted.
    pub accept: Option<Accept>,
}

/// Which functions a program drives (see [`OpenOptions::accept`]).
#[derive(Debug, Clone, Copy)]
pub struct Accept {
    /// Whether (vendor, device) is one.
    pub id: fn(u16, u16) -> bool,
    /// What they are, for the refusal ("a Mellanox ConnectX function").
    pub what: &'static str,
}

/// Read and write permissions of a DMA mapping, as the device sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaAccess {
    /// The device may read the memory.
    pub read: bool,
    /// The device may write the memory.
    pub write: bool,
}

impl DmaAccess {
    /// Both directions.
    pub const READ_WRITE: DmaAccess = DmaAccess {
        read: true,
        write: true,
    };
}

/// Who owns the IOMMU side.
#[derive(Debug)]
enum Iommu {
    Container(Container),
    Iommufd(Iommufd),
}

/// Turns a refused mapping into the limit that refused it.
pub(crate) fn map_error(e: Error, iova: u64, len: u64, count_limit: &'static str) -> Error {
    let Error::Os { ref source, .. } = e else {
        return e;
    };
    match source.raw_os_error() {
        Some(libc::ENOMEM) => Error::MemlockLimit {
            len,
            limit: memlock_limit(),
        },
        Some(libc::ENOSPC) => Error::MappingLimit { limit: count_limit },
        Some(libc::EEXIST) => Error::Iova {
            iova,
            len,
            why: "overlaps an existing mapping",
        },
        _ => e,
    }
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited).
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// A PCI function owned through the kernel's VFIO.
#[derive(Debug)]
pub struct KernelFunction {
    name: String,
    info: PciDeviceInfo,
    interface: Interface,
    noiommu: bool,
    // Drop order: the device file closes first (the kernel disables its
    // interrupts and DMA), then the IOMMU side (unmapping everything), and
    // only then are the buffers that were mapped released.
    device: Device,
    iommu: Iommu,
    ranges: Vec<IovaRange>,
    /// Mappings by IOVA: length, and the buffer kept alive (`None`: process
    /// memory the caller keeps, `dma_map_host`).
    maps: Mutex<Mappings>,
}

/// IOVA -> (length, the buffer kept alive; `None` for process memory).
type Mappings = BTreeMap<u64, (u64, Option<Arc<DmaBuffer>>)>;

/// Opens the function at `addr` through VFIO (see the [module docs](self)).
pub fn open(addr: PciAddress, opts: &OpenOptions) -> Result<KernelFunction> {
    KernelFunction::open(addr, opts)
}

impl KernelFunction {
    /// Opens the function at `addr` through VFIO (see the [module docs](self)).
    pub fn open(addr: PciAddress, opts: &OpenOptions) -> Result<Self> {
        let sysfs = opts
            .sysfs_root
            .as_ref()
            .map_or_else(Sysfs::default, Sysfs::new);
        if let Some(a) = opts.accept {
            let info = sysfs.describe(addr)?;
            if !(a.id)(info.vendor, info.device) {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: format!(
                        "is {:04x}:{:04x} (class {:06x}, driver {}), not {}",
                        info.vendor,
                        info.device,
                        info.class,
                        info.driver.as_deref().unwrap_or("none"),
                        a.what
                    ),
                    fix: "check the address; leave this device to its driver".into(),
                });
            }
        }
        let info = sysfs.check_for_vfio(addr, opts.expect_id)?;
        let group = info
            .iommu_group
            .ok_or(Error::Unsupported("no IOMMU group"))?;
        let noiommu_node = Path::new(&format!("/dev/vfio/noiommu-{group}")).exists();
        let group_node = Path::new(&format!("/dev/vfio/{group}")).exists();
        if noiommu_node && !group_node {
            if !opts.noiommu {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: format!(
                        "is in no-IOMMU group noiommu-{group}: the device would DMA to \
                         physical memory with no protection"
                    ),
                    fix: "use a machine with its IOMMU on, or ask for no-IOMMU mode \
                          explicitly (OpenOptions::noiommu, `--noiommu`)"
                        .into(),
                });
            }
            tracing::warn!(
                "{addr}: NO-IOMMU MODE: the device can read and write ALL physical memory; \
                 DMA addresses are physical, nothing isolates this device"
            );
        } else if opts.noiommu {
            tracing::warn!("{addr}: no-IOMMU mode asked for, but the function has an IOMMU group");
        }
        let noiommu = noiommu_node && !group_node;
        let cdev = if noiommu {
            None
        } else {
            sysfs
                .cdev_name(addr)
                .map(|n| format!("/dev/vfio/devices/{n}"))
                .filter(|p| Path::new(p).exists() && Path::new("/dev/iommu").exists())
        };
        let interface = match (opts.interface, &cdev) {
            (Interface::Cdev, None) => {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: "has no VFIO device cdev (or there is no /dev/iommu)".into(),
                    fix: "use a kernel with CONFIG_IOMMUFD and CONFIG_VFIO_DEVICE_CDEV \
                          (modprobe iommufd), or the group interface"
                        .into(),
                })
            }
            (Interface::Cdev, Some(_)) | (Interface::Auto, Some(_)) => Interface::Cdev,
            _ => Interface::Group,
        };
        let (device, iommu, ranges) = if interface == Interface::Cdev {
            let path = cdev.unwrap_or_default();
            let file = FsOpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| Error::Os {
                    op: "open VFIO device cdev",
                    source: e,
                })?;
            let fd = Iommufd::bind(&file)?;
            let (ranges, _align) = fd.iova_ranges()?;
            (Device::new(file)?, Iommu::Iommufd(fd), ranges)
        } else {
            let c = Container::open(group, noiommu)?;
            let file = c.device(&addr.to_string())?;
            let (ranges, _avail) = c.iommu_info()?;
            (Device::new(file)?, Iommu::Container(c), ranges)
        };
        tracing::debug!(
            "{addr}: opened through {interface:?}, IOVA ranges {:x?}",
            ranges
        );
        Ok(KernelFunction {
            name: addr.to_string(),
            info,
            interface,
            noiommu,
            device,
            iommu,
            ranges,
            maps: Mutex::default(),
        })
    }

    /// What sysfs said about the function when it was opened.
    pub fn info(&self) -> &PciDeviceInfo {
        &self.info
    }

    /// The interface it was opened through ([`Interface::Group`] or [`Interface::Cdev`]).
    pub fn interface(&self) -> Interface {
        self.interface
    }

    /// Whether it was opened in no-IOMMU mode.
    pub fn is_noiommu(&self) -> bool {
        self.noiommu
    }

    /// The device file (regions with their capabilities, IRQ info).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Turns memory-space decoding and bus mastering (DMA) on or off in the
    /// PCI command register, keeping its other bits.
    pub fn set_command(&self, memory: bool, bus_master: bool) -> Result<()> {
        let mut b = [0u8; 2];
        self.config_read(crate::pci::COMMAND, &mut b)?;
        let mut cmd = u16::from_le_bytes(b);
        for (bit, on) in [
            (crate::pci::COMMAND_MEMORY, memory),
            (crate::pci::COMMAND_BUS_MASTER, bus_master),
        ] {
            if on {
                cmd |= bit;
            } else {
                cmd &= !bit;
            }
        }
        self.config_write(crate::pci::COMMAND, &cmd.to_le_bytes())
    }

    /// iommufd only: how file-backed memory was mapped so far, as
    /// (by `IOMMU_IOAS_MAP_FILE`, by address after the kernel refused it,
    /// whether the kernel lacks the ioctl: ENOTTY, before Linux 6.13).
    /// `None` on type1, which maps by address only.
    pub fn map_file_stats(&self) -> Option<(u64, u64, bool)> {
        match &self.iommu {
            Iommu::Container(_) => None,
            Iommu::Iommufd(f) => Some(f.map_file_stats()),
        }
    }

    /// Mappings the type1 IOMMU still allows (its `DMA_AVAIL`), where known.
    pub fn dma_mappings_left(&self) -> Result<Option<u32>> {
        match &self.iommu {
            Iommu::Container(c) => Ok(c.iommu_info()?.1),
            Iommu::Iommufd(_) => Ok(None),
        }
    }

    fn lock_maps(&self) -> MutexGuard<'_, Mappings> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps all of `buf` at `iova` with the given device permissions
    /// (iommufd: by its memfd where the kernel has `IOMMU_IOAS_MAP_FILE`).
    pub fn dma_map_access(
        &self,
        iova: Iova,
        buf: &Arc<DmaBuffer>,
        access: DmaAccess,
    ) -> Result<()> {
        let file = Some((buf.file().as_ref(), 0));
        self.map_range(
            iova,
            buf.host_addr(),
            buf.len() as u64,
            file,
            access,
            Some(buf.clone()),
        )
    }

    /// Maps `addr .. addr + len` of this process at `iova`: by address
    /// (type1 `VFIO_IOMMU_MAP_DMA`, iommufd `IOMMU_IOAS_MAP`), or by
    /// `file` and offset (iommufd `IOMMU_IOAS_MAP_FILE`, falling back to
    /// the address where the kernel lacks it).
    fn map_range(
        &self,
        iova: Iova,
        addr: u64,
        len: u64,
        file: Option<(&std::fs::File, u64)>,
        access: DmaAccess,
        keep: Option<Arc<DmaBuffer>>,
    ) -> Result<()> {
        let bad = |why| Error::Iova {
            iova: iova.0,
            len,
            why,
        };
        if iova.0 % 4096 != 0 || len == 0 {
            return Err(bad("empty or not 4 KiB aligned"));
        }
        let end = iova.0.checked_add(len).ok_or(bad("range wraps"))?;
        if self.noiommu {
            return Err(bad(
                "no-IOMMU mode: there is no IOMMU to map through; the device must be given \
                 physical addresses (KernelFunction::physical_addresses)",
            ));
        }
        let in_range = self
            .ranges
            .iter()
            .any(|r| iova.0 >= r.start && end - 1 <= r.last);
        if !in_range {
            return Err(bad("outside the usable IOVA ranges"));
        }
        let mut maps = self.lock_maps();
        let clash = maps
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &(l, _))| s + l > iova.0);
        if clash {
            return Err(bad("overlaps an existing mapping"));
        }
        match &self.iommu {
            Iommu::Container(c) => c.map(iova.0, addr, len, access)?,
            Iommu::Iommufd(f) => {
                let by_file = match file {
                    Some((file, offset)) => f.map_file(iova.0, file, offset, len, access)?,
                    None => false,
                };
                if !by_file {
                    f.map(iova.0, addr, len, access)?;
                }
            }
        }
        maps.insert(iova.0, (len, keep));
        Ok(())
    }

    /// The physical address of each 4 KiB page of `buf` (no-IOMMU mode,
    /// where the device is given these; reading them needs CAP_SYS_ADMIN).
    /// The pages are locked in memory first so they stay where they are.
    pub fn physical_addresses(buf: &DmaBuffer) -> Result<Vec<u64>> {
        // SAFETY: mlock only changes residency of the buffer's own live
        // mapping, `len` bytes from its start.
        if unsafe { libc::mlock(buf.host_addr() as *const libc::c_void, buf.len()) } != 0 {
            return Err(Error::os("mlock(DMA buffer)"));
        }
        let pagemap = std::fs::File::open("/proc/self/pagemap").map_err(|e| Error::Os {
            op: "open /proc/self/pagemap",
            source: e,
        })?;
        use std::os::unix::fs::FileExt;
        (0..buf.len() / 4096)
            .map(|i| {
                let va = buf.host_addr() + (i as u64) * 4096;
                let mut e = [0u8; 8];
                pagemap
                    .read_exact_at(&mut e, va / 4096 * 8)
                    .map_err(|e| Error::Os {
                        op: "read /proc/self/pagemap",
                        source: e,
                    })?;
                let e = u64::from_ne_bytes(e);
                let pfn = e & ((1 << 55) - 1);
                if e >> 63 == 0 || pfn == 0 {
                    return Err(Error::Unsupported(
                        "physical addresses (page not present, or no CAP_SYS_ADMIN)",
                    ));
                }
                Ok(pfn * 4096)
            })
            .collect()
    }

    /// Hot reset: resets every function on the bus, allowed when this
    /// process owns all of them (their groups are ours, or on the cdev
    /// path the kernel says we own them).
    pub fn hot_reset(&self) -> Result<()> {
        let info = self.device.hot_reset_info()?;
        match &self.iommu {
            Iommu::Container(c) => {
                let foreign: Vec<String> = info
                    .devices
                    .iter()
                    .filter(|d| d.group_or_devid != c.group_id())
                    .map(|d| d.address.to_string())
                    .collect();
                if !foreign.is_empty() {
                    return Err(Error::Setup {
                        device: self.name.clone(),
                        problem: format!(
                            "a hot reset would also reset {} in other IOMMU groups",
                            foreign.join(", ")
                        ),
                        fix: "open those functions in this process too, or use the function \
                              reset"
                            .into(),
                    });
                }
                self.device.hot_reset(&[c.group_fd()])
            }
            Iommu::Iommufd(_) => {
                if !info.owned_all {
                    return Err(Error::Setup {
                        device: self.name.clone(),
                        problem: "a hot reset would also reset functions this iommufd does \
                                  not own"
                            .into(),
                        fix: "bind those functions to this iommufd too, or use the function \
                              reset"
                            .into(),
                    });
                }
                self.device.hot_reset(&[])
            }
        }
    }
}

impl PciFunction for KernelFunction {
    fn name(&self) -> &str {
        &self.name
    }

    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.device.read(CONFIG_REGION, offset, buf)
    }

    fn config_write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.device.write(CONFIG_REGION, offset, data)
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo> {
        Ok(self.device.region(index)?.info.clone())
    }

    fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.device.read(index, offset, buf)
    }

    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<()> {
        self.device.write(index, offset, data)
    }

    fn map_region(&self, index: u32) -> Result<Mmio> {
        self.device.map(index)
    }

    fn irq_count(&self, kind: IrqKind) -> Result<u32> {
        Ok(self.device.irq_info(kind)?.count)
    }

    fn set_irqs(&self, kind: IrqKind, start: u32, fds: &[Option<&EventFd>]) -> Result<()> {
        self.device.set_irqs(kind, start, fds)
    }

    fn iova_ranges(&self) -> Result<Vec<IovaRange>> {
        Ok(self.ranges.clone())
    }

    fn dma_map(&self, iova: Iova, buf: &Arc<DmaBuffer>) -> Result<()> {
        self.dma_map_access(iova, buf, DmaAccess::READ_WRITE)
    }

    /// Maps process memory by its address: the kernel pins the pages
    /// (type1 `VFIO_IOMMU_MAP_DMA`; iommufd `IOMMU_IOAS_MAP`, or
    /// `IOMMU_IOAS_MAP_FILE` by the memfd or hugetlbfs file behind the
    /// range where there is one and the kernel has it, 6.13+). Any memory
    /// works: heap, anonymous, file-backed, huge pages.
    ///
    /// Pinning: the pages stay pinned, and the device reaches exactly
    /// them, from this call until [`dma_unmap`](PciFunction::dma_unmap).
    /// Pinned pages count against `RLIMIT_MEMLOCK`
    /// ([`Error::MemlockLimit`] when it is exceeded), each mapping against
    /// type1's `dma_entry_limit` ([`Error::MappingLimit`]). The caller must
    /// not `munmap`, `free` or remap the memory (nor let `fork` give it
    /// copy-on-write pages: `madvise(MADV_DONTFORK)`) before the unmap:
    /// the device would keep writing the old, pinned pages, which the
    /// program no longer sees.
    unsafe fn dma_map_host(&self, iova: Iova, addr: u64, len: u64) -> Result<()> {
        if addr % 4096 != 0 || len % 4096 != 0 {
            return Err(Error::Iova {
                iova: iova.0,
                len,
                why: "host mapping not 4 KiB aligned",
            });
        }
        let file = match &self.iommu {
            Iommu::Iommufd(_) => crate::host_memory::shared_file_of(addr, len).ok(),
            Iommu::Container(_) => None,
        };
        let by_file = file.as_ref().map(|(f, off)| (f.as_ref(), *off));
        self.map_range(iova, addr, len, by_file, DmaAccess::READ_WRITE, None)
    }

    fn dma_unmap(&self, iova: Iova, len: u64) -> Result<()> {
        let mut maps = self.lock_maps();
        match maps.get(&iova.0) {
            Some(&(l, _)) if l == len => {}
            _ => {
                return Err(Error::Iova {
                    iova: iova.0,
                    len,
                    why: "no mapping starts there with that length",
                })
            }
        }
        match &self.iommu {
            Iommu::Container(c) => c.unmap(iova.0, len)?,
            Iommu::Iommufd(f) => f.unmap(iova.0, len)?,
        }
        maps.remove(&iova.0);
        Ok(())
    }

    fn dma_mappings(&self) -> usize {
        self.lock_maps().len()
    }

    fn reset(&self) -> Result<()> {
        self.device.reset()
    }
}
