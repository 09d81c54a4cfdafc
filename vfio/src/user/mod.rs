//! vfio-user: a PCI function served by another process over a UNIX socket
//! (the protocol QEMU and libvfio-user implement; docs/interop/vfio-user.rst
//! in QEMU).
//!
//! The protocol is VFIO's ioctls as messages: a 16-byte header
//! ([`header`]), then a payload per command. File descriptors travel beside
//! the bytes as `SCM_RIGHTS` ([`socket`]): the server hands out the fd of
//! mappable region memory (so registers and doorbells in it are shared
//! memory, and a store costs no message), the client hands over the fds of
//! its DMA memory and the eventfds of its interrupt vectors.
//!
//! - [`header`]: the header and command numbers.
//! - [`version`]: `VERSION` and the capability JSON.
//! - [`device`]: `DEVICE_GET_INFO`, `DEVICE_RESET`.
//! - [`region`]: `DEVICE_GET_REGION_INFO` with the sparse-mmap capability,
//!   `REGION_READ/WRITE`.
//! - [`irq`]: `DEVICE_GET_IRQ_INFO`, `DEVICE_SET_IRQS`.
//! - [`dma`]: `DMA_MAP/UNMAP` (by fd), `DMA_READ/WRITE` (by message).
//! - [`socket`]: framing and fd passing.
//! - [`client`]: [`VfioUserFunction`], the client backend behind
//!   [`PciFunction`](crate::PciFunction).
//! - [`server`]: [`Server`], any [`DeviceModel`](crate::emulated::DeviceModel)
//!   served to clients.
//!
//! Neither side trusts the other: every length, index and offset a peer
//! sends is checked before use, a malformed request gets an error reply
//! (never a panic or a hang), and every client request has a deadline.

pub mod client;
pub mod device;
pub mod dma;
pub mod header;
pub mod irq;
pub mod region;
pub mod server;
pub mod socket;
pub mod version;

pub use client::{Options, VfioUserFunction};
pub use server::{Server, ServerThread};

/// The largest message either side reads: a header, a fixed part and the
/// largest data transfer (1 MiB). Bigger messages are refused unread.
pub const MAX_MESSAGE: usize = header::HEADER_SIZE + 64 + (1 << 20);
