//! InfiniBand management datagrams (IBA vol. 1, chapters 13-16) as
//! MAD_IFC carries them (`mad_ifc_in.mad`, `mad_ifc_out.response_mad_packet`):
//! the common MAD header, the subnet management (SMP) and performance
//! management (PMA) classes, the attributes firmware's agents answer, and
//! the byte offsets of their fields (names as Linux's `ib_mad.h`,
//! `ib_smi.h` and `ib_pma.h`). Every value is big-endian.

/// The size of a MAD.
pub const MAD_SIZE: usize = 256;

/// Common header: `base_version` (1).
pub const HDR_BASE_VERSION: usize = 0;
/// Common header: `mgmt_class`.
pub const HDR_MGMT_CLASS: usize = 1;
/// Common header: `class_version`.
pub const HDR_CLASS_VERSION: usize = 2;
/// Common header: `method`.
pub const HDR_METHOD: usize = 3;
/// Common header: `status` (16 bits; bit 15 is a directed-route SMP's D).
pub const HDR_STATUS: usize = 4;
/// Common header: `tid` (64 bits).
pub const HDR_TID: usize = 8;
/// Common header: `attr_id` (16 bits).
pub const HDR_ATTR_ID: usize = 16;
/// Common header: `attr_mod` (32 bits).
pub const HDR_ATTR_MOD: usize = 20;
/// Where an SMP's (LID-routed or directed-route) and a PMA MAD's
/// attribute data start.
pub const DATA: usize = 64;
/// The size of an SMP's attribute data.
pub const SMP_DATA_SIZE: usize = 64;

/// `IB_MGMT_BASE_VERSION`.
pub const BASE_VERSION: u8 = 1;
/// `IB_MGMT_CLASS_SUBN_LID_ROUTED`.
pub const CLASS_SUBN_LID_ROUTED: u8 = 0x01;
/// `IB_MGMT_CLASS_SUBN_DIRECTED_ROUTE`.
pub const CLASS_SUBN_DIRECTED_ROUTE: u8 = 0x81;
/// `IB_MGMT_CLASS_PERF_MGMT`.
pub const CLASS_PERF_MGMT: u8 = 0x04;
/// The SMP and PMA class version (1).
pub const CLASS_VERSION_1: u8 = 1;
/// `IB_MGMT_METHOD_GET`.
pub const METHOD_GET: u8 = 0x01;
/// `IB_MGMT_METHOD_SET`.
pub const METHOD_SET: u8 = 0x02;
/// `IB_MGMT_METHOD_GET_RESP`.
pub const METHOD_GET_RESP: u8 = 0x81;
/// A directed-route SMP's direction bit in `status` (a response).
pub const STATUS_DIRECTION: u16 = 0x8000;
/// `IB_MGMT_MAD_STATUS_BAD_VERSION`.
pub const STATUS_BAD_VERSION: u16 = 0x0004;
/// `IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD`.
pub const STATUS_UNSUPPORTED_METHOD: u16 = 0x0008;
/// `IB_MGMT_MAD_STATUS_UNSUPPORTED_METHOD_ATTRIB`.
pub const STATUS_UNSUPPORTED_METHOD_ATTRIB: u16 = 0x000c;
/// `IB_MGMT_MAD_STATUS_INVALID_ATTRIB_VALUE`.
pub const STATUS_INVALID_ATTRIB_VALUE: u16 = 0x001c;

/// `IB_SMP_ATTR_NODE_DESC`.
pub const ATTR_NODE_DESC: u16 = 0x0010;
/// `IB_SMP_ATTR_NODE_INFO`.
pub const ATTR_NODE_INFO: u16 = 0x0011;
/// `IB_SMP_ATTR_GUID_INFO`.
pub const ATTR_GUID_INFO: u16 = 0x0014;
/// `IB_SMP_ATTR_PORT_INFO`.
pub const ATTR_PORT_INFO: u16 = 0x0015;
/// `IB_SMP_ATTR_PKEY_TABLE`.
pub const ATTR_PKEY_TABLE: u16 = 0x0016;
/// `IB_PMA_CLASS_PORT_INFO`.
pub const ATTR_CLASS_PORT_INFO: u16 = 0x0001;
/// `IB_PMA_PORT_COUNTERS`.
pub const ATTR_PORT_COUNTERS: u16 = 0x0012;
/// `IB_PMA_PORT_COUNTERS_EXT`.
pub const ATTR_PORT_COUNTERS_EXT: u16 = 0x001d;

/// NodeInfo (offsets in the attribute data): base and class version,
/// node type, port count, GUIDs, P_Key capacity, device, revision, port,
/// vendor.
#[allow(missing_docs)] // each offset is the IB field of its name
pub mod node_info {
    pub const BASE_VERSION: usize = 0;
    pub const CLASS_VERSION: usize = 1;
    pub const NODE_TYPE: usize = 2;
    pub const NUM_PORTS: usize = 3;
    pub const SYS_IMAGE_GUID: usize = 4;
    pub const NODE_GUID: usize = 12;
    pub const PORT_GUID: usize = 20;
    pub const PARTITION_CAP: usize = 28;
    pub const DEVICE_ID: usize = 30;
    pub const REVISION: usize = 32;
    /// LocalPortNum (8 bits), then VendorID (24 bits).
    pub const LOCAL_PORT_VENDOR_ID: usize = 36;
    /// NodeType of a channel adapter.
    pub const NODE_TYPE_CA: u8 = 1;
}

/// PortInfo (offsets in the attribute data; where two fields share a
/// byte, the first named is its high nibble).
#[allow(missing_docs)] // each offset is the IB field of its name
pub mod port_info {
    pub const GID_PREFIX: usize = 8;
    pub const LID: usize = 16;
    pub const SM_LID: usize = 18;
    pub const CAP_MASK: usize = 20;
    pub const LOCAL_PORT_NUM: usize = 28;
    pub const LINK_WIDTH_ENABLED: usize = 29;
    pub const LINK_WIDTH_SUPPORTED: usize = 30;
    pub const LINK_WIDTH_ACTIVE: usize = 31;
    /// LinkSpeedSupported | PortState.
    pub const SPEED_SUP_PORT_STATE: usize = 32;
    /// PortPhysicalState | LinkDownDefaultState.
    pub const PHYS_STATE_DOWN_DEF: usize = 33;
    /// M_KeyProtectBits, LMC (low 3 bits).
    pub const MKEY_PROT_LMC: usize = 34;
    /// LinkSpeedActive | LinkSpeedEnabled.
    pub const SPEED_ACTIVE_ENABLED: usize = 35;
    /// NeighborMTU | MasterSMSL.
    pub const MTU_SMSL: usize = 36;
    /// VLCap | InitType.
    pub const VL_CAP_INIT_TYPE: usize = 37;
    /// InitTypeReply | MTUCap.
    pub const INIT_REPLY_MTU_CAP: usize = 41;
    /// OperationalVLs | partition enforcement bits.
    pub const OPER_VLS: usize = 43;
    pub const PKEY_VIOLATIONS: usize = 46;
    pub const QKEY_VIOLATIONS: usize = 48;
    pub const GUID_CAP: usize = 50;
    /// LinkSpeedExtActive | LinkSpeedExtSupported.
    pub const SPEED_EXT_ACTIVE_SUP: usize = 62;
    /// PortState: down.
    pub const STATE_DOWN: u8 = 1;
    /// PortState: active.
    pub const STATE_ACTIVE: u8 = 4;
    /// PortPhysicalState: polling.
    pub const PHYS_POLLING: u8 = 2;
    /// PortPhysicalState: disabled.
    pub const PHYS_DISABLED: u8 = 3;
    /// PortPhysicalState: link up.
    pub const PHYS_LINK_UP: u8 = 5;
    /// CapabilityMask: IsCommunicationManagementSupported.
    pub const CAP_CM: u32 = 1 << 16;
    /// CapabilityMask: IsExtendedSpeedsSupported.
    pub const CAP_EXT_SPEEDS: u32 = 1 << 14;
    /// Link widths: 1x, 4x, 2x.
    pub const WIDTH_1X: u8 = 1;
    pub const WIDTH_4X: u8 = 2;
    pub const WIDTH_2X: u8 = 16;
    /// LinkSpeedActive: QDR (10 Gb/s per lane).
    pub const SPEED_QDR: u8 = 4;
    /// LinkSpeedExtActive: EDR (25 Gb/s per lane).
    pub const SPEED_EXT_EDR: u8 = 2;
    /// MTU enumeration (`IB_MTU_256` = 1 ... `IB_MTU_4096` = 5).
    pub const MTU_1024: u8 = 3;
    pub const MTU_2048: u8 = 4;
    pub const MTU_4096: u8 = 5;
}

/// GUIDInfo: 8 GUIDs per block (`attr_mod` is the block).
pub const GUIDS_PER_BLOCK: usize = 8;
/// P_KeyTable: 32 P_Keys per block (`attr_mod` is the block).
pub const PKEYS_PER_BLOCK: usize = 32;

/// PMA ClassPortInfo (offsets in the attribute data).
#[allow(missing_docs)] // each offset is the IB field of its name
pub mod class_port_info {
    pub const BASE_VERSION: usize = 0;
    pub const CLASS_VERSION: usize = 1;
    pub const CAP_MASK: usize = 2;
    /// RespTimeValue (low 5 bits of the 32-bit word at 4).
    pub const RESP_TIME: usize = 7;
    /// `IB_PMA_CLASS_CAP_EXT_WIDTH`: PortCountersExtended is supported.
    pub const CAP_EXT_WIDTH: u16 = 1 << 9;
}

/// PMA PortCounters (offsets in the attribute data; 32-bit data counters
/// count octets divided by 4, and every counter saturates).
#[allow(missing_docs)] // each offset is the IB field of its name
pub mod port_counters {
    pub const PORT_SELECT: usize = 1;
    pub const XMIT_DATA: usize = 24;
    pub const RCV_DATA: usize = 28;
    pub const XMIT_PACKETS: usize = 32;
    pub const RCV_PACKETS: usize = 36;
}

/// PMA PortCountersExtended (64-bit counters).
#[allow(missing_docs)] // each offset is the IB field of its name
pub mod port_counters_ext {
    pub const PORT_SELECT: usize = 1;
    pub const XMIT_DATA: usize = 8;
    pub const RCV_DATA: usize = 16;
    pub const XMIT_PACKETS: usize = 24;
    pub const RCV_PACKETS: usize = 32;
    pub const UNICAST_XMIT_PACKETS: usize = 40;
    pub const UNICAST_RCV_PACKETS: usize = 48;
}
