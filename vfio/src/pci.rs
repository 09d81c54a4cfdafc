//! PCI config-space offsets and bits this workspace uses (PCI Local Bus 3.0, PCIe 4.0).

/// Vendor ID (16 bits).
pub const VENDOR_ID: u64 = 0x00;
/// Device ID (16 bits).
pub const DEVICE_ID: u64 = 0x02;
/// Command register (16 bits).
pub const COMMAND: u64 = 0x04;
/// Status register (16 bits).
pub const STATUS: u64 = 0x06;
/// Revision ID (8 bits), then the 24-bit class code.
pub const REVISION_ID: u64 = 0x08;
/// Header type (8 bits).
pub const HEADER_TYPE: u64 = 0x0e;
/// BAR0 (32 bits; BAR0+BAR1 for a 64-bit BAR).
pub const BAR0: u64 = 0x10;
/// Subsystem vendor ID.
pub const SUBSYSTEM_VENDOR_ID: u64 = 0x2c;
/// Subsystem ID.
pub const SUBSYSTEM_ID: u64 = 0x2e;
/// Pointer to the first capability.
pub const CAPABILITIES_POINTER: u64 = 0x34;

/// Command: respond to memory-space accesses.
pub const COMMAND_MEMORY: u16 = 1 << 1;
/// Command: the function may master the bus (DMA).
pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
/// Command: INTx disabled.
pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
/// Status: a capability list exists.
pub const STATUS_CAP_LIST: u16 = 1 << 4;

/// Capability ID: PCI Express.
pub const CAP_ID_EXP: u8 = 0x10;
/// Capability ID: MSI-X.
pub const CAP_ID_MSIX: u8 = 0x11;

/// MSI-X capability: message control (16 bits) at cap + 2.
pub const MSIX_MSG_CTRL: u64 = 2;
/// MSI-X message control: MSI-X enable.
pub const MSIX_CTRL_ENABLE: u16 = 1 << 15;
/// MSI-X message control: function mask.
pub const MSIX_CTRL_MASKALL: u16 = 1 << 14;
/// MSI-X message control: table size minus one.
pub const MSIX_CTRL_QSIZE: u16 = 0x7ff;
/// MSI-X capability: table offset and BIR at cap + 4.
pub const MSIX_TABLE: u64 = 4;
/// MSI-X capability: PBA offset and BIR at cap + 8.
pub const MSIX_PBA: u64 = 8;
/// Bytes per MSI-X table entry.
pub const MSIX_ENTRY_SIZE: u64 = 16;

/// BAR: 64-bit memory BAR type bits.
pub const BAR_MEM_TYPE_64: u32 = 0x4;
/// BAR: prefetchable.
pub const BAR_MEM_PREFETCH: u32 = 0x8;

/// PCI Express capability: device control (16 bits) at cap + 8.
pub const PCIE_DEVCTL: u64 = 8;
/// Device control: enable relaxed ordering (`PCI_EXP_DEVCTL_RELAX_EN`).
pub const PCIE_DEVCTL_RELAX_EN: u16 = 1 << 4;
