//! Interrupts: `VFIO_USER_DEVICE_GET_IRQ_INFO` (how many vectors a type
//! has) and `VFIO_USER_DEVICE_SET_IRQS` (eventfds by SCM_RIGHTS to signal
//! them; none to detach; `count` 0 with `DATA_NONE` to detach every vector
//! of the type).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use vfio_bindings::bindings::vfio as sys;

/// IRQ info flag: vectors are signalled through eventfds.
pub const IRQ_INFO_EVENTFD: u32 = sys::VFIO_IRQ_INFO_EVENTFD;
/// IRQ info flag: vectors are set up as a whole (MSI-X under vfio-pci).
pub const IRQ_INFO_NORESIZE: u32 = sys::VFIO_IRQ_INFO_NORESIZE;
/// SET_IRQS data: none.
pub const IRQ_SET_DATA_NONE: u32 = sys::VFIO_IRQ_SET_DATA_NONE;
/// SET_IRQS data: one boolean byte per vector.
pub const IRQ_SET_DATA_BOOL: u32 = sys::VFIO_IRQ_SET_DATA_BOOL;
/// SET_IRQS data: eventfds in the message's SCM_RIGHTS.
pub const IRQ_SET_DATA_EVENTFD: u32 = sys::VFIO_IRQ_SET_DATA_EVENTFD;
/// SET_IRQS data-type bits.
pub const IRQ_SET_DATA_MASK: u32 = IRQ_SET_DATA_NONE | IRQ_SET_DATA_BOOL | IRQ_SET_DATA_EVENTFD;
/// SET_IRQS action: mask.
pub const IRQ_SET_ACTION_MASK: u32 = sys::VFIO_IRQ_SET_ACTION_MASK;
/// SET_IRQS action: unmask.
pub const IRQ_SET_ACTION_UNMASK: u32 = sys::VFIO_IRQ_SET_ACTION_UNMASK;
/// SET_IRQS action: trigger (with eventfds: what signals the vectors).
pub const IRQ_SET_ACTION_TRIGGER: u32 = sys::VFIO_IRQ_SET_ACTION_TRIGGER;
/// SET_IRQS action bits.
pub const IRQ_SET_ACTION_TYPE_MASK: u32 =
    IRQ_SET_ACTION_MASK | IRQ_SET_ACTION_UNMASK | IRQ_SET_ACTION_TRIGGER;

/// `struct vfio_irq_info`, request and reply.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct IrqInfo {
    /// Largest reply payload taken / the reply's payload size (16).
    pub argsz: u32,
    /// `IRQ_INFO_*`.
    pub flags: u32,
    /// Interrupt type (vfio-pci's index: 2 is MSI-X).
    pub index: u32,
    /// Vectors of that type.
    pub count: u32,
}

/// `struct vfio_irq_set` without its data (booleans follow for `DATA_BOOL`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
#[repr(C)]
pub struct IrqSet {
    /// Size of the request payload, data included.
    pub argsz: u32,
    /// One `IRQ_SET_DATA_*` and one `IRQ_SET_ACTION_*`.
    pub flags: u32,
    /// Interrupt type.
    pub index: u32,
    /// First vector.
    pub start: u32,
    /// Number of vectors.
    pub count: u32,
}
