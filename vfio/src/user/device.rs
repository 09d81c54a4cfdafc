//! Device-wide messages: `VFIO_USER_DEVICE_GET_INFO` (flags, how many
//! regions and interrupt types) and `VFIO_USER_DEVICE_RESET` (no payload).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Device flag: DEVICE_RESET is supported.
pub const DEVICE_FLAGS_RESET: u32 = vfio_bindings::bindings::vfio::VFIO_DEVICE_FLAGS_RESET;
/// Device flag: a PCI device (regions and interrupt types by vfio-pci's indexes).
pub const DEVICE_FLAGS_PCI: u32 = vfio_bindings::bindings::vfio::VFIO_DEVICE_FLAGS_PCI;
/// Regions of a PCI device: BAR0-5, ROM, config space, VGA.
pub const PCI_NUM_REGIONS: u32 = vfio_bindings::bindings::vfio::VFIO_PCI_NUM_REGIONS;
/// Interrupt types of a PCI device: INTx, MSI, MSI-X, error, request.
pub const PCI_NUM_IRQS: u32 = vfio_bindings::bindings::vfio::VFIO_PCI_NUM_IRQS;

/// `struct vfio_user_device_info`, request and reply.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct DeviceInfo {
    /// Request: largest reply payload taken; reply: the payload size (16).
    pub argsz: u32,
    /// [`DEVICE_FLAGS_RESET`], [`DEVICE_FLAGS_PCI`].
    pub flags: u32,
    /// Number of regions.
    pub num_regions: u32,
    /// Number of interrupt types.
    pub num_irqs: u32,
}
