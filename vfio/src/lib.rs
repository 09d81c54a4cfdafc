//! Owning one PCI function from user space.
//!
//! A PCI function is reached through four things: its **config space**, its
//! **regions** (BARs; parts of them can be mapped into the process so that a
//! register write is a plain store), **DMA** (the function reads and writes
//! memory at I/O virtual addresses, IOVAs, that the owner mapped through the
//! IOMMU) and **interrupts** (MSI-X vectors delivered on eventfds). The Linux
//! kernel's VFIO exposes exactly these; so does the vfio-user protocol; and so
//! does a device model running in the same process. [`PciFunction`] is that
//! interface, and a driver written against it does not know which backend it
//! runs on.
//!
//! - [`function`]: the driver-side interface, [`PciFunction`].
//! - [`clock`]: time as an input ([`clock::Clock`]; the monotonic clock by
//!   default, a manual one for tests).
//! - [`dma`]: DMA memory ([`DmaBuffer`], memfd-backed so any backend can share it).
//! - [`host_memory`]: memory the program owns and maps for DMA itself
//!   ([`HostMemory`], a shareable buffer pool), and how a backend finds the
//!   file behind a range of process memory.
//! - [`iova`]: the allocator of naturally aligned IOVA ranges.
//! - [`mmio`]: mapped BAR access ([`Mmio`]) and the barriers that order it.
//! - [`emulated`]: the in-process backend and the device-side interface a
//!   device model implements ([`emulated::DeviceModel`]).
//! - [`kernel`]: the kernel backend (VFIO group/container, iommufd cdev,
//!   no-IOMMU mode) and sysfs discovery.
//! - [`pci`]: config-space offsets and bits.
//! - [`user`]: vfio-user, the client backend and the server of device models.
//!
//! # Memory the device can touch
//!
//! DMA buffers and mapped BARs are shared with a device that reads and writes
//! them concurrently, so no Rust reference to them is ever created: every
//! access is a volatile copy (through `vm-memory`'s volatile slices or
//! [`Mmio`]'s accessors). A buffer mapped for DMA stays alive while it is
//! mapped: the backend holds an `Arc` to it until `dma_unmap`.
#![deny(missing_docs)]
#![warn(clippy::too_many_lines)] // at most 120 lines: clippy.toml

pub mod clock;
pub mod dma;
pub mod dma_ring;
pub mod emulated;
pub mod function;
pub mod host_memory;
pub mod iova;
pub mod iova_memory;
pub mod kernel;
pub mod mmio;
pub mod pci;
pub mod user;

pub use dma::DmaBuffer;
pub use dma_ring::DmaRing;
pub use function::{Iova, IovaRange, IrqKind, PciFunction, RegionInfo};
pub use host_memory::HostMemory;
pub use iova::IovaAllocator;
pub use iova_memory::IovaMemory;
pub use mmio::{MemType, Mmio, MmioRing};

/// Everything that can go wrong while owning a function.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A region index the function does not have.
    #[error("region {0} does not exist")]
    NoRegion(u32),
    /// An access outside a region or buffer.
    #[error("{what}: offset {offset:#x} + {len:#x} lies outside its {size:#x} bytes")]
    OutOfBounds {
        /// What was accessed.
        what: &'static str,
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Size of the thing accessed.
        size: u64,
    },
    /// A region that cannot be mapped.
    #[error("region {0} cannot be mapped")]
    NotMappable(u32),
    /// An IOVA range that is not free, not usable, or not mapped.
    #[error("IOVA {iova:#x}+{len:#x}: {why}")]
    Iova {
        /// Start of the range.
        iova: u64,
        /// Length of the range.
        len: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// No IOVA range of the size asked for is free.
    #[error("no free IOVA range of {len:#x} bytes aligned to {align:#x}")]
    IovaExhausted {
        /// Length asked for.
        len: u64,
        /// Alignment asked for.
        align: u64,
    },
    /// An interrupt index or vector the function does not have.
    #[error("{kind:?} vector {vector} does not exist (the function has {count})")]
    NoVector {
        /// The interrupt kind.
        kind: IrqKind,
        /// The first vector asked for.
        vector: u32,
        /// How many vectors there are.
        count: u32,
    },
    /// The device is gone (its model stopped, the server hung up, it was unplugged).
    #[error("device is gone: {0}")]
    Gone(String),
    /// The backend cannot do this.
    #[error("not supported by this backend: {0}")]
    Unsupported(&'static str),
    /// A vfio-user peer sent something the protocol does not allow.
    #[error("vfio-user {command}: {why}")]
    Protocol {
        /// The request it answered (or the message it sent).
        command: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A vfio-user server answered a request with an error reply.
    #[error("vfio-user {command}: refused by the server: {}", std::io::Error::from_raw_os_error(*errno))]
    Refused {
        /// The request.
        command: &'static str,
        /// The errno of the reply.
        errno: i32,
    },
    /// A vfio-user request got no reply in time.
    #[error("vfio-user {command}: no reply within {after:?}")]
    Timeout {
        /// The request.
        command: &'static str,
        /// How long it waited.
        after: std::time::Duration,
    },
    /// A function (or group, or node) is not ready to be owned; `fix` says
    /// what to do next.
    #[error("{device}: {problem}; {fix}")]
    Setup {
        /// The PCI address or node concerned.
        device: String,
        /// What is wrong.
        problem: String,
        /// What to do about it.
        fix: String,
    },
    /// The kernel refused to pin DMA memory: RLIMIT_MEMLOCK is too small.
    #[error(
        "DMA mapping of {len:#x} bytes refused: RLIMIT_MEMLOCK ({}) exceeded; raise it (ulimit -l, \
         LimitMEMLOCK= in systemd, memlock in limits.conf)",
        limit.map_or("unlimited".to_string(), |l| format!("{l} bytes"))
    )]
    MemlockLimit {
        /// Bytes of the refused mapping.
        len: u64,
        /// The soft limit, `None` if unlimited.
        limit: Option<u64>,
    },
    /// The IOMMU refused another mapping: its mapping-count limit was reached.
    #[error("DMA mapping refused: the mapping-count limit ({limit}) is reached; map fewer, larger buffers or raise it")]
    MappingLimit {
        /// Which limit (`vfio_iommu_type1.dma_entry_limit`).
        limit: &'static str,
    },
    /// Process memory a backend can reach only through a file descriptor
    /// (vfio-user) is not a shared mapping of a file.
    #[error(
        "host memory {addr:#x}+{len:#x} cannot be shared with the device's server: {why}; \
         allocate DMA memory shareable: vfio::HostMemory (a memfd or hugetlbfs pool), or \
         mmap(MAP_SHARED) a memfd_create / hugetlbfs file yourself"
    )]
    NotShareable {
        /// Host address of the range.
        addr: u64,
        /// Its length.
        len: u64,
        /// Why it cannot be shared.
        why: String,
    },
    /// Huge pages were asked for and there are too few free.
    #[error(
        "no {} KiB huge pages free for {len:#x} bytes: reserve some \
         (echo N > /sys/kernel/mm/hugepages/hugepages-{}kB/nr_hugepages, or hugepages= at boot)",
        page_size >> 10, page_size >> 10
    )]
    NoHugePages {
        /// The huge page size asked for.
        page_size: u64,
        /// Bytes asked for.
        len: u64,
    },
}

impl Error {
    pub(crate) fn os(op: &'static str) -> Self {
        Error::Os {
            op,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;
