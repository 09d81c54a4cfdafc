//! Event queue entries: the event types and subtypes firmware writes into
//! an EQE (`MLX5_EVENT_TYPE_*`, `MLX5_PORT_CHANGE_SUBTYPE_*` of device.h) and
//! the numbers that go with them.
//!
//! Event type names are the constants without their `MLX5_EVENT_TYPE_`
//! prefix (Linux's `eqe_type_str()` prints them with it).

use crate::ifc::eqe;
use crate::macros::prm_enum;

/// Size of one EQE, in bytes.
pub const EQE_SIZE: usize = eqe::SIZE_BYTES;
/// Byte offset of the event type in an EQE.
pub const EQE_TYPE_OFFSET: usize = eqe::EVENT_TYPE.off / 8;
/// Byte offset of the event subtype in an EQE.
pub const EQE_SUB_TYPE_OFFSET: usize = eqe::EVENT_SUB_TYPE.off / 8;
/// Byte offset of the 28-byte event data in an EQE.
pub const EQE_DATA_OFFSET: usize = eqe::EVENT_DATA.off / 8;
/// Size of the event data, in bytes.
pub const EQE_DATA_SIZE: usize = eqe::EVENT_DATA.width / 8;
/// Byte offset of the byte that holds the one-bit `owner` in an EQE
/// (device.h's `owner` byte).
pub const EQE_OWNER_OFFSET: usize = eqe::OWNER.off / 8;
/// The `owner` bit within its byte.
pub const EQE_OWNER_MASK: u8 = 1 << (7 - eqe::OWNER.off % 8);
/// Value software writes into every EQE's owner byte before creating the EQ.
pub const EQE_OWNER_INIT_VAL: u8 = 0x1;
/// Extra EQEs Linux adds to every EQ so the consumer index is updated in time.
pub const NUM_SPARE_EQE: u32 = 0x80;
/// Linux's EQE budget between consumer-index updates (must not exceed the spare EQEs).
pub const EQ_POLLING_BUDGET: u32 = 128;
/// Entries Linux requests for its command EQ (before adding the spare EQEs).
pub const NUM_CMD_EQE: u32 = 32;
/// Mask of a CQ, QP, SRQ or DCT number in EQE data (24 bits).
pub const EQE_RESOURCE_NUMBER_MASK: u32 = 0x00ff_ffff;
/// Shift of the port number in `eqe_port_state.port`.
pub const EQE_PORT_SHIFT: u8 = 4;

/// PAGE_REQUEST `ec_function` bit: the request is for the embedded CPU function.
pub const PAGE_REQ_EC_FUNCTION: u16 = 0x8000;
/// PAGE_REQUEST `ec_function` bit: firmware asks for all pages back.
pub const PAGE_REQ_RELEASE_ALL_PAGES: u16 = 0x4000;
/// Linux caps a single page reclaim at this many pages (as a negative `num_pages`).
pub const MAX_RECLAIM_NPAGES: i32 = -50_000;

/// EQ context state: armed, will generate an interrupt on the next event.
pub const EQ_STATE_ARMED: u8 = 0x9;
/// EQ context state: fired, must be re-armed.
pub const EQ_STATE_FIRED: u8 = 0xa;
/// EQ context state: always armed.
pub const EQ_STATE_ALWAYS_ARMED: u8 = 0xb;

/// The bit for `event_type` in an EQ's 256-bit event bitmask, as a mask of
/// the 64-bit word `event_type / 64` (word 0 holds types 0..=63).
pub const fn event_mask_bit(event_type: EventType) -> u64 {
    1u64 << (event_type.to_raw() % 64)
}

prm_enum! {
    /// Event type: EQE byte 1.
    pub enum EventType: u8, unknown = "Unrecognized event" {
        /// A CQ has a new completion (data: `eqe_comp`).
        Comp = 0x00 => "COMP",
        /// Path migration succeeded (data: `eqe_qp_srq`).
        PathMig = 0x01 => "PATH_MIG",
        /// Communication established on a QP (data: `eqe_qp_srq`).
        CommEst = 0x02 => "COMM_EST",
        /// A send queue drained (data: `eqe_qp_srq`).
        SqDrained = 0x03 => "SQ_DRAINED",
        /// CQ error (data: `eqe_cq_err`).
        CqError = 0x04 => "CQ_ERROR",
        /// Local work queue catastrophic error (data: `eqe_qp_srq`).
        WqCatasError = 0x05 => "WQ_CATAS_ERROR",
        /// Path migration failed (data: `eqe_qp_srq`).
        PathMigFailed = 0x07 => "PATH_MIG_FAILED",
        /// Internal error.
        InternalError = 0x08 => "INTERNAL_ERROR",
        /// Port state change (data: `eqe_port_state`; subtype: [`PortChangeSubtype`]).
        PortChange = 0x09 => "PORT_CHANGE",
        /// Command completion (data: `eqe_cmd`).
        Cmd = 0x0a => "CMD",
        /// Firmware asks for pages or returns them (data: `eqe_page_req`).
        PageRequest = 0x0b => "PAGE_REQUEST",
        /// ODP page fault (data: `eqe_page_fault`).
        PageFault = 0x0c => "PAGE_FAULT",
        /// NIC vport context changed (data: `eqe_vport_change`).
        NicVportChange = 0x0d => "NIC_VPORT_CHANGE",
        /// E-switch functions changed.
        EswFunctionsChanged = 0x0e => "ESW_FUNCTIONS_CHANGED",
        /// vHCA state changed (data: `eqe_vhca_state`).
        VhcaStateChange = 0x0f => "VHCA_STATE_CHANGE",
        /// Invalid request local work queue error (data: `eqe_qp_srq`).
        WqInvalReqError = 0x10 => "WQ_INVAL_REQ_ERROR",
        /// Local access violation work queue error (data: `eqe_qp_srq`).
        WqAccessError = 0x11 => "WQ_ACCESS_ERROR",
        /// SRQ catastrophic error (data: `eqe_qp_srq`).
        SrqCatasError = 0x12 => "SRQ_CATAS_ERROR",
        /// Last WQE reached on a QP attached to an SRQ (data: `eqe_qp_srq`).
        SrqLastWqe = 0x13 => "SRQ_LAST_WQE",
        /// SRQ or RQ fell below its limit (data: `eqe_qp_srq`).
        SrqRqLimit = 0x14 => "SRQ_RQ_LIMIT",
        /// GPIO event (data: `eqe_gpio`).
        GpioEvent = 0x15 => "GPIO_EVENT",
        /// Port module (transceiver) event (data: `eqe_port_module`).
        PortModuleEvent = 0x16 => "PORT_MODULE_EVENT",
        /// Temperature warning (data: `eqe_temp_warning`).
        TempWarnEvent = 0x17 => "TEMP_WARN_EVENT",
        /// XRQ error (data: `eqe_xrq_err`).
        XrqError = 0x18 => "XRQ_ERROR",
        /// Remote configuration protocol event.
        RemoteConfig = 0x19 => "REMOTE_CONFIG",
        /// Doorbell / BlueFlame congestion (data: `eqe_congestion`).
        DbBfCongestion = 0x1a => "DB_BF_CONGESTION",
        /// Stall VL event (data: `eqe_stall_vl`).
        StallEvent = 0x1b => "STALL_EVENT",
        /// All connections of a DCT closed after DRAIN_DCT (data: `eqe_dct`).
        DctDrained = 0x1c => "DCT_DRAINED",
        /// DC access key violation (data: `eqe_dct`).
        DctKeyViolation = 0x1d => "DCT_KEY_VIOLATION",
        /// FPGA error.
        FpgaError = 0x20 => "FPGA_ERROR",
        /// FPGA QP error.
        FpgaQpError = 0x21 => "FPGA_QP_ERROR",
        /// General event (subtype selects the kind).
        GeneralEvent = 0x22 => "GENERAL_EVENT",
        /// Monitor counter event.
        MonitorCounter = 0x24 => "MONITOR_COUNTER",
        /// PPS event (data: `eqe_pps`).
        PpsEvent = 0x25 => "PPS_EVENT",
        /// Firmware tracer event.
        DeviceTracer = 0x26 => "DEVICE_TRACER",
        /// General object changed (data: `eqe_obj_change`).
        ObjectChange = 0x27 => "OBJECT_CHANGE",
    }
}

prm_enum! {
    /// Subtype of a PORT_CHANGE event: EQE byte 3.
    pub enum PortChangeSubtype: u8, unknown = "unknown port change" {
        /// The port went down.
        Down = 1 => "DOWN",
        /// The port became active.
        Active = 4 => "ACTIVE",
        /// The port was initialized.
        Initialized = 5 => "INITIALIZED",
        /// The port's LID changed.
        Lid = 6 => "LID",
        /// The port's P_Key table changed.
        Pkey = 7 => "PKEY",
        /// The port's GUID changed.
        Guid = 8 => "GUID",
        /// The SM asked for client re-registration.
        ClientRereg = 9 => "CLIENT_REREG",
    }
}

prm_enum! {
    /// Subtype of a GENERAL_EVENT: EQE byte 3.
    pub enum GeneralEventSubtype: u8, unknown = "unknown general event" {
        /// Delay-drop timeout.
        DelayDropTimeout = 0x1 => "DELAY_DROP_TIMEOUT",
        /// PCI power state change.
        PciPowerChangeEvent = 0x5 => "PCI_POWER_CHANGE_EVENT",
        /// Firmware live patch.
        FwLivePatchEvent = 0x7 => "FW_LIVE_PATCH_EVENT",
        /// PCI sync for firmware update (data: `eqe_sync_fw_update`).
        PciSyncForFwUpdateEvent = 0x8 => "PCI_SYNC_FOR_FW_UPDATE_EVENT",
    }
}

prm_enum! {
    /// Resource type in `eqe_qp_srq.type` (`MLX5_EVENT_QUEUE_TYPE_*`).
    pub enum EventQueueType: u8, unknown = "unknown queue type" {
        /// A QP.
        Qp = 0 => "QP",
        /// An RQ.
        Rq = 1 => "RQ",
        /// An SQ.
        Sq = 2 => "SQ",
        /// A DCT.
        Dct = 6 => "DCT",
    }
}

prm_enum! {
    /// Subtype of a PAGE_FAULT event: EQE byte 3 (`MLX5_PFAULT_SUBTYPE_*`).
    pub enum PageFaultSubtype: u8, unknown = "unknown page fault" {
        /// A WQE's data (requester, or a receive WQE) touched a page not
        /// present (data: `eqe_page_fault_wqe`).
        Wqe = 0 => "WQE",
        /// An incoming RDMA READ/WRITE/atomic did (data: `eqe_page_fault_rdma`).
        Rdma = 1 => "RDMA",
        /// Memory scheme (`odp_cap.mem_page_fault`): by key and address.
        Memory = 2 => "MEMORY",
    }
}

/// Page-fault type bit (`pftype_*` bits 31:24, PAGE_FAULT_RESUME
/// `page_fault_type`): the requester faulted (`MLX5_PFAULT_REQUESTOR`).
pub const PFAULT_REQUESTOR: u8 = 1 << 0;
/// Page-fault type bit: the access writes memory (`MLX5_PFAULT_WRITE`).
pub const PFAULT_WRITE: u8 = 1 << 1;
/// Page-fault type bit: an RDMA fault (`MLX5_PFAULT_RDMA`).
pub const PFAULT_RDMA: u8 = 1 << 2;
/// WQE page-fault type: a receive WQE of an RMP/SRQ (`MLX5_WQE_PF_TYPE_RMP`).
pub const WQE_PF_TYPE_RMP: u8 = 0;
/// WQE page-fault type: a SEND or WRITE of the requester
/// (`MLX5_WQE_PF_TYPE_REQ_SEND_OR_WRITE`).
pub const WQE_PF_TYPE_REQ_SEND_OR_WRITE: u8 = 1;
/// WQE page-fault type: a receive WQE of a QP (`MLX5_WQE_PF_TYPE_RESP`).
pub const WQE_PF_TYPE_RESP: u8 = 2;
/// WQE page-fault type: a READ or atomic of the requester (its local
/// memory is written) (`MLX5_WQE_PF_TYPE_REQ_READ_OR_ATOMIC`).
pub const WQE_PF_TYPE_REQ_READ_OR_ATOMIC: u8 = 3;
/// Shift of the page-fault type in `pftype_wq` / `pftype_token`.
pub const PFTYPE_SHIFT: u32 = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_match_device_h() {
        assert_eq!(EventType::Comp.to_raw(), 0x00);
        assert_eq!(EventType::PortChange.to_raw(), 0x09);
        assert_eq!(EventType::Cmd.to_raw(), 0x0a);
        assert_eq!(EventType::PageRequest.to_raw(), 0x0b);
        assert_eq!(EventType::SrqLastWqe.to_raw(), 0x13);
        assert_eq!(EventType::DctKeyViolation.to_raw(), 0x1d);
        assert_eq!(EventType::ObjectChange.to_raw(), 0x27);
        assert_eq!(EventType::from(0x0bu8).to_string(), "PAGE_REQUEST(0xb)");
        assert_eq!(EventType::from(0x06u8), EventType::Unknown(0x06));
        assert_eq!(
            EventType::from(0xffu8).to_string(),
            "Unrecognized event(0xff)"
        );
        for t in EventType::ALL {
            assert_eq!(EventType::from(u8::from(*t)), *t);
        }
    }

    #[test]
    fn subtypes_and_masks() {
        assert_eq!(PortChangeSubtype::Active.to_raw(), 4);
        assert_eq!(PortChangeSubtype::from(9u8).name(), "CLIENT_REREG");
        assert_eq!(
            event_mask_bit(EventType::Cmd) | event_mask_bit(EventType::PageRequest),
            (1 << 0x0a) | (1 << 0x0b)
        );
        assert_eq!(EQE_DATA_OFFSET + EQE_DATA_SIZE + 4, EQE_SIZE);
    }

    #[test]
    fn page_fault_numbers_match_device_h() {
        assert_eq!(EventType::PageFault.to_raw(), 0x0c);
        assert_eq!(PageFaultSubtype::Rdma.to_raw(), 1);
        assert_eq!(
            WQE_PF_TYPE_REQ_READ_OR_ATOMIC,
            PFAULT_REQUESTOR | PFAULT_WRITE
        );
        assert_eq!(crate::ifc::eqe_page_fault_wqe::SIZE_BYTES, EQE_DATA_SIZE);
        assert_eq!(crate::ifc::eqe_page_fault_rdma::SIZE_BYTES, EQE_DATA_SIZE);
    }
}
