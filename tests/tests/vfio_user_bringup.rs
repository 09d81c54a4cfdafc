//! The bring-up suites (`bringup.rs`, `bringup_faults.rs`) again, every
//! function served over vfio-user: a server thread serves the device model
//! on a UNIX socket and the driver runs on the vfio-user client backend,
//! with BAR0 as shared memory, DMA by memfd and MSI-X by eventfd.

const BACKEND: tests::backend::Backend = tests::backend::Backend::VfioUser;

#[path = "bringup.rs"]
mod bringup;
#[path = "bringup_faults.rs"]
mod bringup_faults;
