//! The driver-side interface of one PCI function.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::{DmaBuffer, Mmio, Result};

/// An I/O virtual address: what the device puts on the bus for a DMA.
/// Kept apart from host pointers and BAR offsets by type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Iova(pub u64);

impl std::fmt::LowerHex for Iova {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A usable IOVA range, `start ..= last` (inclusive, as the kernel reports it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IovaRange {
    /// First usable address.
    pub start: u64,
    /// Last usable address.
    pub last: u64,
}

/// Interrupt kinds, with VFIO's index numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IrqKind {
    /// Legacy INTx.
    Intx = 0,
    /// MSI.
    Msi = 1,
    /// MSI-X.
    MsiX = 2,
    /// Error reporting.
    Err = 3,
    /// Device request (the kernel wants the device back: unplug).
    Req = 4,
}

/// What a region is and how it may be accessed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// VFIO region index (BAR0 = 0, ..., config space = 7).
    pub index: u32,
    /// Size in bytes (0: the region does not exist).
    pub size: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Parts that may be mapped, as (offset, size); empty if none.
    pub mmap_areas: Vec<(u64, u64)>,
}

/// VFIO's region index of config space.
pub const CONFIG_REGION: u32 = 7;

/// One PCI function owned from user space.
///
/// Implemented by the kernel VFIO backend, the vfio-user client and the
/// in-process backend for device models ([`crate::emulated`]). All methods
/// take `&self` and are safe to call from several threads.
pub trait PciFunction: Send + Sync + std::fmt::Debug {
    /// A human name: the PCI address, `emu:cx4lx`, a socket path.
    fn name(&self) -> &str;

    /// Reads config space at `offset`.
    fn config_read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes config space at `offset`.
    fn config_write(&self, offset: u64, data: &[u8]) -> Result<()>;

    /// Describes region `index`.
    fn region_info(&self, index: u32) -> Result<RegionInfo>;
    /// Reads a region through the backend (a trapped access).
    fn region_read(&self, index: u32, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Writes a region through the backend (a trapped access).
    fn region_write(&self, index: u32, offset: u64, data: &[u8]) -> Result<()>;
    /// Maps region `index` (its mappable areas) into the process.
    fn map_region(&self, index: u32) -> Result<Mmio>;

    /// How many vectors of `kind` the function has.
    fn irq_count(&self, kind: IrqKind) -> Result<u32>;
    /// Routes vectors `start ..` of `kind` to the given eventfds (`None`
    /// detaches a vector); an empty `fds` disables every vector of `kind`.
    fn set_irqs(&self, kind: IrqKind, start: u32, fds: &[Option<&EventFd>]) -> Result<()>;

    /// The IOVA ranges DMA may use.
    fn iova_ranges(&self) -> Result<Vec<IovaRange>>;
    /// Maps all of `buf` for DMA at `iova` (read and write). The backend keeps
    /// `buf` alive until the matching [`dma_unmap`](Self::dma_unmap).
    fn dma_map(&self, iova: Iova, buf: &Arc<DmaBuffer>) -> Result<()>;
    /// Maps `len` bytes of this process's memory at host address `addr` for
    /// DMA at `iova` (read and write): memory the caller owns (a verbs MR over
    /// user memory), as VFIO_IOMMU_MAP_DMA maps any address. `addr`, `iova`
    /// and `len` are 4 KiB aligned. Backends that cannot reach process memory
    /// refuse with [`Error::Unsupported`](crate::Error::Unsupported).
    ///
    /// # Safety
    ///
    /// `addr .. addr + len` is readable and writable memory of this process
    /// that stays mapped, and is touched only through volatile or atomic
    /// accesses (the device writes it concurrently), until the matching
    /// [`dma_unmap`](Self::dma_unmap).
    unsafe fn dma_map_host(&self, iova: Iova, addr: u64, len: u64) -> Result<()> {
        let _ = (iova, addr, len);
        Err(crate::Error::Unsupported("mapping process memory for DMA"))
    }
    /// Unmaps the mapping that starts at `iova` and is `len` bytes long.
    fn dma_unmap(&self, iova: Iova, len: u64) -> Result<()>;
    /// How many DMA mappings exist now (for leak checks and limits).
    fn dma_mappings(&self) -> usize;

    /// Function-level reset.
    fn reset(&self) -> Result<()>;
}
