//! Firmware: the state behind the command queue and its background duties
//! (the `initializing` bit, the health counter, the HCA clock, doorbells,
//! page requests). One file per mechanism; object tables (EQs, UARs; later
//! CQs, QPs, MKEYs) are `BTreeMap`s keyed by their PRM number.

mod adapter;
mod caps;
mod cong;
mod counters;
pub(crate) mod cq;
mod dct;
mod dek;
mod eq;
pub(crate) mod eth;
pub(crate) mod flow;
mod general_obj;
mod hca;
mod issi;
mod l2;
mod mad;
mod mcg;
pub(crate) mod memic;
pub(crate) mod memic_op;
mod mkey;
mod odp;
mod pages;
mod pd;
mod qp;
mod reg;
mod roce;
mod rq;
mod rqt;
mod sq;
mod srq;
mod tir;
mod tis;
mod uar;
pub(crate) mod uctx;
mod umem;
mod vport;
mod vxlan;
mod xrcd;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Instant;

use vfio::clock::SharedClock;

use mlx5_hw::health;
use mlx5_hw::ifc::CmdLayout;
use mlx5_hw::init::NicInterface;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use zerocopy::FromBytes;

use crate::initseg::{self, rd, wr};
use crate::profile::CapPages;
use crate::{DeviceConfig, Inner, Profile, Stats};

pub(crate) use adapter::NULL_MKEY;
pub(crate) use adapter::RESD_LKEY;
pub(crate) use dek::LOG_MAX_DEK;
pub(crate) use eq::Eq;
pub(crate) use uctx::{LOG_MAX_UCTX, LOG_MAX_UMEM, UCTX_CAPS};

/// How often the health counter moves while firmware lives.
pub(crate) const HEALTH_TICK: std::time::Duration = std::time::Duration::from_millis(1);

/// The HCA's life cycle as firmware tracks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HcaState {
    /// Power-on or after DISABLE_HCA: only ENABLE_HCA (and NOP) are accepted.
    #[default]
    Disabled,
    /// After ENABLE_HCA: ISSI, pages, caps, registers; INIT_HCA next.
    Enabled,
    /// After INIT_HCA: resources can be created.
    Initialized,
    /// After TEARDOWN_HCA: pages can be reclaimed, DISABLE_HCA next.
    TornDown,
    /// After a fast teardown (nic_interface = disabled): firmware let go of
    /// every page and object.
    FastTornDown,
}

/// The port as firmware models it (PAOS, PMTU, PTYS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortState {
    /// Administratively up.
    pub admin_up: bool,
    /// Operationally up (link trained).
    pub oper_up: bool,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u16,
    /// MTU set by the driver, in bytes.
    pub admin_mtu: u16,
    /// Ethernet protocols the port supports (PTYS eth_proto_capability).
    pub eth_proto_cap: u32,
    /// Ethernet protocols enabled (PTYS eth_proto_admin).
    pub eth_proto_admin: u32,
    /// Ethernet protocol the link runs (PTYS eth_proto_oper; 0 when down).
    pub eth_proto_oper: u32,
    /// The protocol the link trains to when it comes up.
    pub eth_proto_up: u32,
    /// Flow control (PFCC): global pause and per-priority PFC.
    pub flow: FlowControl,
}

/// The port's flow control as PFCC sets it. Global pause starts on both
/// ways (`ethtool -a` on a fresh ConnectX port); it and per-priority flow
/// control exclude each other. The model's cable never pauses: this is
/// what the driver configured, not a behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowControl {
    /// Global pause: send (`pptx`) and honour (`pprx`) pause frames.
    pub pause_tx: bool,
    pub pause_rx: bool,
    /// Per-priority flow control, one bit per priority (`pfctx`, `pfcrx`).
    pub pfc_tx: u8,
    pub pfc_rx: u8,
    /// Device-stall watermarks (`device_stall_minor_watermark`,
    /// `_critical_`), in milliseconds; 0: off.
    pub stall_minor: u16,
    pub stall_critical: u16,
}

/// PTYS eth_proto bits (legacy field, mlx5_ifc's `mlx5e_link_modes`).
pub(crate) mod eth_proto {
    pub const CR_10G: u32 = 1 << 2;
    pub const CR4_40G: u32 = 1 << 6;
    pub const CR4_100G: u32 = 1 << 20;
    pub const CR_25G: u32 = 1 << 27;
    pub const CR2_50G: u32 = 1 << 30;
}

impl PortState {
    pub(crate) fn power_on(p: Profile) -> Self {
        use eth_proto::*;
        // A ConnectX-4 Lx port does 10/25/50G (a 25G card trains to
        // 25GBASE-CR); ConnectX-5 and later also 40 and 100G and train to
        // 100GBASE-CR4 in this legacy field.
        let (cap, up) = match p {
            Profile::ConnectX4Lx => (CR_10G | CR_25G | CR2_50G, CR_25G),
            _ => (CR_10G | CR4_40G | CR4_100G | CR_25G | CR2_50G, CR4_100G),
        };
        Self {
            admin_up: true,
            oper_up: false,
            max_mtu: 9978,
            admin_mtu: 1500,
            eth_proto_cap: cap,
            eth_proto_admin: cap,
            eth_proto_oper: 0,
            eth_proto_up: up,
            flow: FlowControl {
                pause_tx: true,
                pause_rx: true,
                pfc_tx: 0,
                pfc_rx: 0,
                stall_minor: 0,
                stall_critical: 0,
            },
        }
    }
}

/// A failed command: status and syndrome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fail {
    pub status: CmdStatus,
    pub syndrome: u32,
}

pub(crate) type CmdResult = Result<Vec<u8>, Fail>;

pub(crate) fn fail(status: CmdStatus, syndrome: u32) -> Fail {
    Fail { status, syndrome }
}

/// Syndromes firmware returns, one per check (stable values).
pub(crate) mod synd {
    pub const BAD_OPCODE: u32 = 0x1d3c_0001;
    pub const HCA_NOT_ENABLED: u32 = 0x3a5b_0001;
    pub const HCA_ALREADY_ENABLED: u32 = 0x3a5b_0002;
    pub const HCA_NOT_INITIALIZED: u32 = 0x3a5b_0003;
    pub const HCA_ALREADY_INITIALIZED: u32 = 0x3a5b_0004;
    pub const INIT_WITHOUT_PAGES: u32 = 0x3a5b_0005;
    pub const DISABLE_WHILE_INITIALIZED: u32 = 0x3a5b_0006;
    pub const BAD_TEARDOWN_PROFILE: u32 = 0x3a5b_0007;
    pub const BAD_FUNCTION_ID: u32 = 0x3a5b_0008;
    pub const BAD_INPUT_LENGTH: u32 = 0x0cad_0001;
    pub const BAD_OUTPUT_LENGTH: u32 = 0x0cad_0002;
    pub const ISSI_UNSUPPORTED: u32 = 0x6a1b_0001;
    pub const ISSI_AFTER_INIT: u32 = 0x6a1b_0002;
    pub const PAGES_BAD_OP_MOD: u32 = 0x5e91_0001;
    pub const PAGE_NOT_MAPPED: u32 = 0x5e91_0002;
    pub const PAGE_MISALIGNED: u32 = 0x5e91_0003;
    pub const PAGE_DUPLICATE: u32 = 0x5e91_0004;
    pub const PAGES_TOO_MANY: u32 = 0x5e91_0005;
    pub const CAP_BAD_TYPE: u32 = 0x2c7f_0001;
    pub const CAP_EXCEEDS_MAX: u32 = 0x2c7f_0002;
    pub const CAP_AFTER_INIT: u32 = 0x2c7f_0003;
    pub const CAP_WITHOUT_BOOT_PAGES: u32 = 0x2c7f_0004;
    pub const REG_UNKNOWN: u32 = 0x7e60_0001;
    pub const REG_BAD_PORT: u32 = 0x7e60_0002;
    pub const REG_BAD_VALUE: u32 = 0x7e60_0003;
    pub const REG_BAD_OP_MOD: u32 = 0x7e60_0004;
    pub const UAR_UNKNOWN: u32 = 0x4c31_0001;
    pub const UAR_EXHAUSTED: u32 = 0x4c31_0002;
    pub const UAR_IN_USE: u32 = 0x4c31_0003;
    pub const EQ_UNKNOWN: u32 = 0x0e90_0001;
    pub const EQ_EXHAUSTED: u32 = 0x0e90_0002;
    pub const EQ_BAD_SIZE: u32 = 0x0e90_0003;
    pub const EQ_BAD_UAR: u32 = 0x0e90_0004;
    pub const EQ_BAD_INTR: u32 = 0x0e90_0005;
    pub const EQ_BAD_PAS: u32 = 0x0e90_0006;
    pub const EQ_BAD_PAGE_SIZE: u32 = 0x0e90_0007;
    pub const VPORT_BAD_PORT: u32 = 0x2b07_0001;
    pub const VPORT_OTHER: u32 = 0x2b07_0002;
    pub const VPORT_BAD_GID_INDEX: u32 = 0x2b07_0003;
    pub const VPORT_BAD_PKEY_INDEX: u32 = 0x2b07_0004;
    pub const VPORT_LOCAL_LB_NOT_SUPPORTED: u32 = 0x2b07_0005;
    pub const BAD_PAS: u32 = 0x1f00_0001;
    pub const PD_EXHAUSTED: u32 = 0x5d00_0001;
    pub const PD_UNKNOWN: u32 = 0x5d00_0002;
    pub const PD_IN_USE: u32 = 0x5d00_0003;
    pub const TD_EXHAUSTED: u32 = 0x5d00_0011;
    pub const TD_UNKNOWN: u32 = 0x5d00_0012;
    pub const MKEY_BAD_PD: u32 = 0x3e00_0001;
    pub const MKEY_BAD_ACCESS_MODE: u32 = 0x3e00_0002;
    pub const MKEY_BAD_PAGE_SIZE: u32 = 0x3e00_0003;
    pub const MKEY_BAD_MTT: u32 = 0x3e00_0004;
    pub const MKEY_BAD_RANGE: u32 = 0x3e00_0005;
    pub const MKEY_EXHAUSTED: u32 = 0x3e00_0006;
    pub const MKEY_UNKNOWN: u32 = 0x3e00_0007;
    pub const MKEY_BAD_RELAXED_ORDERING: u32 = 0x3e00_0008;
    pub const MEMIC_UNSUPPORTED: u32 = 0x5e00_0001;
    pub const MEMIC_BAD_SIZE: u32 = 0x5e00_0002;
    pub const MEMIC_BAD_RANGE: u32 = 0x5e00_0003;
    pub const MEMIC_EXHAUSTED: u32 = 0x5e00_0004;
    pub const MEMIC_UNKNOWN: u32 = 0x5e00_0005;
    pub const MEMIC_BAD_OP_MOD: u32 = 0x5e00_0006;
    pub const MEMIC_BAD_OPERATION: u32 = 0x5e00_0007;
    pub const MEMIC_OP_NOT_MAPPED: u32 = 0x5e00_0008;
    pub const CQ_BAD_SIZE: u32 = 0x0c90_0001;
    pub const CQ_BAD_CQE_SIZE: u32 = 0x0c90_0002;
    pub const CQ_BAD_UAR: u32 = 0x0c90_0003;
    pub const CQ_BAD_EQ: u32 = 0x0c90_0004;
    pub const CQ_NOT_MAPPED: u32 = 0x0c90_0005;
    pub const CQ_EXHAUSTED: u32 = 0x0c90_0006;
    pub const CQ_UNKNOWN: u32 = 0x0c90_0007;
    pub const CQ_IN_USE: u32 = 0x0c90_0008;
    pub const CQ_RESIZE: u32 = 0x0c90_0009;
    pub const CQ_BAD_COMPRESSION: u32 = 0x0c90_000a;
    pub const QP_BAD_ST: u32 = 0x0a90_0001;
    pub const QP_BAD_PD: u32 = 0x0a90_0002;
    pub const QP_BAD_CQ: u32 = 0x0a90_0003;
    pub const QP_BAD_SRQ: u32 = 0x0a90_0004;
    pub const QP_BAD_RQ_TYPE: u32 = 0x0a90_0005;
    pub const QP_BAD_UAR: u32 = 0x0a90_0006;
    pub const QP_BAD_SIZE: u32 = 0x0a90_0007;
    pub const QP_NOT_MAPPED: u32 = 0x0a90_0008;
    pub const QP_EXHAUSTED: u32 = 0x0a90_0009;
    pub const QP_GSI_EXISTS: u32 = 0x0a90_000a;
    pub const QP_UNKNOWN: u32 = 0x0a90_000b;
    pub const QP_BAD_STATE: u32 = 0x0a90_000c;
    pub const QP_BAD_SGID: u32 = 0x0a90_000d;
    pub const QP_BAD_MTU: u32 = 0x0a90_000e;
    pub const QP_BAD_XRCD: u32 = 0x0a90_000f;
    pub const MCG_BAD_PARAM: u32 = 0x0a9a_0001;
    pub const MCG_EXHAUSTED: u32 = 0x0a9a_0002;
    pub const DCT_BAD_PD: u32 = 0x0a98_0001;
    pub const DCT_BAD_CQ: u32 = 0x0a98_0002;
    pub const DCT_BAD_SRQ: u32 = 0x0a98_0003;
    pub const DCT_BAD_MTU: u32 = 0x0a98_0004;
    pub const DCT_BAD_SGID: u32 = 0x0a98_0005;
    pub const DCT_UNKNOWN: u32 = 0x0a98_0006;
    pub const DCT_DRAINED: u32 = 0x0a98_0007;
    pub const DCI_BAD_STREAMS: u32 = 0x0a98_0008;
    pub const SRQ_BAD_SIZE: u32 = 0x5a90_0001;
    pub const SRQ_BAD_PD: u32 = 0x5a90_0002;
    pub const SRQ_NOT_MAPPED: u32 = 0x5a90_0003;
    pub const SRQ_EXHAUSTED: u32 = 0x5a90_0004;
    pub const SRQ_UNKNOWN: u32 = 0x5a90_0005;
    pub const SRQ_IN_USE: u32 = 0x5a90_0006;
    pub const XRCD_EXHAUSTED: u32 = 0x5d00_0021;
    pub const XRCD_UNKNOWN: u32 = 0x5d00_0022;
    pub const XRCD_IN_USE: u32 = 0x5d00_0023;
    pub const SRQ_BAD_XRCD: u32 = 0x5a90_0007;
    pub const SRQ_BAD_CQ: u32 = 0x5a90_0008;
    pub const SRQ_BAD_STATE: u32 = 0x5a90_0009;
    pub const SRQ_BAD_WQ_TYPE: u32 = 0x5a90_000a;
    pub const Q_COUNTER_EXHAUSTED: u32 = 0x6c00_0001;
    pub const Q_COUNTER_UNKNOWN: u32 = 0x6c00_0002;
    pub const Q_COUNTER_IN_USE: u32 = 0x6c00_0003;
    pub const Q_COUNTER_NO_AGGREGATION: u32 = 0x6c00_0004;
    pub const BAD_UID: u32 = 0x1d3c_0002;
    pub const FT_BAD_TYPE: u32 = 0x6f10_0001;
    pub const FT_OTHER_VPORT: u32 = 0x6f10_0002;
    pub const FT_UNKNOWN: u32 = 0x6f10_0003;
    pub const FT_BAD_LEVEL: u32 = 0x6f10_0004;
    pub const FT_BAD_SIZE: u32 = 0x6f10_0005;
    pub const FT_UNSUPPORTED: u32 = 0x6f10_0006;
    pub const FT_BAD_MISS_TABLE: u32 = 0x6f10_0007;
    pub const FT_BAD_MISS_ACTION: u32 = 0x6f10_0008;
    pub const FT_EXHAUSTED: u32 = 0x6f10_0009;
    pub const FT_NOT_EMPTY: u32 = 0x6f10_000a;
    pub const FT_REFERENCED: u32 = 0x6f10_000b;
    pub const FT_IS_ROOT: u32 = 0x6f10_000c;
    pub const FT_BAD_OP_MOD: u32 = 0x6f10_000d;
    pub const FG_BAD_RANGE: u32 = 0x6f20_0001;
    pub const FG_OVERLAP: u32 = 0x6f20_0002;
    pub const FG_BAD_CRITERIA: u32 = 0x6f20_0003;
    pub const FG_UNKNOWN: u32 = 0x6f20_0004;
    pub const FG_NOT_EMPTY: u32 = 0x6f20_0005;
    pub const FTE_BAD_INDEX: u32 = 0x6f30_0001;
    pub const FTE_EXISTS: u32 = 0x6f30_0002;
    pub const FTE_UNKNOWN: u32 = 0x6f30_0003;
    pub const FTE_BAD_ACTION: u32 = 0x6f30_0004;
    pub const FTE_BAD_DEST: u32 = 0x6f30_0005;
    pub const FC_UNKNOWN: u32 = 0x6f40_0001;
    pub const FC_BAD_BULK: u32 = 0x6f40_0002;
    pub const FC_EXHAUSTED: u32 = 0x6f40_0003;
    pub const FC_IN_USE: u32 = 0x6f40_0004;
    pub const TIS_BAD_TD: u32 = 0x7a10_0001;
    pub const TIS_BAD_PARAM: u32 = 0x7a10_0002;
    pub const TIS_EXHAUSTED: u32 = 0x7a10_0003;
    pub const TIS_UNKNOWN: u32 = 0x7a10_0004;
    pub const TIS_IN_USE: u32 = 0x7a10_0005;
    pub const TIR_BAD_TD: u32 = 0x7a20_0001;
    pub const TIR_BAD_PARAM: u32 = 0x7a20_0002;
    pub const TIR_EXHAUSTED: u32 = 0x7a20_0003;
    pub const TIR_UNKNOWN: u32 = 0x7a20_0004;
    pub const TIR_BAD_RQ: u32 = 0x7a20_0005;
    pub const TIR_BAD_RQT: u32 = 0x7a20_0006;
    pub const TIR_BAD_HASH: u32 = 0x7a20_0007;
    pub const TIR_BAD_DISP_TYPE: u32 = 0x7a20_0008;
    pub const TIR_IN_USE: u32 = 0x7a20_0009;
    pub const RQT_BAD_SIZE: u32 = 0x7a30_0001;
    pub const RQT_BAD_PARAM: u32 = 0x7a30_0002;
    pub const RQT_EXHAUSTED: u32 = 0x7a30_0003;
    pub const RQT_UNKNOWN: u32 = 0x7a30_0004;
    pub const RQT_BAD_RQ: u32 = 0x7a30_0005;
    pub const RQT_IN_USE: u32 = 0x7a30_0006;
    pub const WQ_BAD_PD: u32 = 0x7a40_0001;
    pub const WQ_BAD_UAR: u32 = 0x7a40_0002;
    pub const WQ_BAD_SIZE: u32 = 0x7a40_0003;
    pub const WQ_NOT_MAPPED: u32 = 0x7a40_0004;
    pub const WQ_BAD_STATE: u32 = 0x7a40_0005;
    pub const WQ_BAD_TYPE: u32 = 0x7a40_0006;
    pub const WQ_BAD_CQ: u32 = 0x7a40_0007;
    pub const WQ_BAD_PARAM: u32 = 0x7a40_0008;
    pub const WQ_EXHAUSTED: u32 = 0x7a40_0009;
    pub const WQ_STATE_MISMATCH: u32 = 0x7a40_000a;
    pub const WQ_BAD_TRANSITION: u32 = 0x7a40_000b;
    pub const SQ_UNKNOWN: u32 = 0x7a50_0001;
    pub const SQ_BAD_TIS: u32 = 0x7a50_0002;
    pub const RQ_UNKNOWN: u32 = 0x7a60_0001;
    pub const RQ_BAD_COUNTER: u32 = 0x7a60_0002;
    pub const RQ_BAD_RMP: u32 = 0x7a60_0003;
    pub const RQ_IN_USE: u32 = 0x7a60_0004;
    pub const VXLAN_PORTS_EXHAUSTED: u32 = 0x7a70_0001;
    pub const VXLAN_PORT_UNKNOWN: u32 = 0x7a70_0002;
    pub const L2_BAD_INDEX: u32 = 0x7a80_0001;
    pub const L2_UNKNOWN: u32 = 0x7a80_0002;
    pub const L2_DUPLICATE: u32 = 0x7a80_0003;
    pub const VPORT_COUNTER_BAD_VPORT: u32 = 0x7a90_0001;
}

/// Firmware state.
#[derive(Debug)]
pub(crate) struct Firmware {
    pub(crate) profile: Profile,
    pub(crate) caps: CapPages,
    /// The model's clock (DeviceConfig::clock): firmware delays and the
    /// internal timer are measured on it.
    clock: SharedClock,
    power_on_at: Instant,
    fw_start: std::time::Duration,
    initializing: bool,
    pub(crate) dead: bool,
    last_tick: Instant,
    health_counter: u32,
    // Command interface.
    pub(crate) cmdq_base: u64,
    pub(crate) pending: u32,
    pub(crate) stuck: u32,
    pub(crate) doorbell_seen: bool,
    pub(crate) checksums: bool,
    nic_interface: u32,
    // HCA.
    pub(crate) hca: HcaState,
    pub(crate) issi: u16,
    pub(crate) driver_version: String,
    fast_teardown_prepared: bool,
    host_endianness: u8,
    // Pages.
    pub(crate) pages: BTreeSet<u64>,
    pub(crate) extra_demand: i64,
    pub(crate) page_requests: VecDeque<i32>,
    // Objects.
    pub(crate) uars: uar::UarSet,
    pub(crate) eqs: BTreeMap<u8, Eq>,
    pub(crate) eq_db_last: BTreeMap<(u32, usize), u32>,
    pub(crate) steering: flow::Steering,
    /// TISes, TIRs, RQ tables, SQs, RQs and VXLAN ports (fw/eth.rs).
    pub(crate) eth: eth::EthObjects,
    /// DevX: user contexts, UMEMs, object owners (fw/uctx.rs).
    pub(crate) devx: uctx::Devx,
    /// DCT numbers (fw/dct.rs), taken from the QP number space.
    pub(crate) dctns: BTreeSet<u32>,
    /// Objects alive at a teardown (Stats::leaked_at_teardown).
    pub(crate) leaked: u64,
    // Port and vport.
    pub(crate) port: PortState,
    pub(crate) roce_en: bool,
    pub(crate) vport_mtu: u16,
    /// The port's MAC (DeviceConfig::mac).
    pub(crate) mac: u64,
    /// NODE_DESC: what firmware reports until the driver sets it.
    pub(crate) node_desc: [u8; reg::NODE_DESC_BYTES],
    /// Device memory allocations (fw/memic.rs).
    pub(crate) memic: memic::Memic,
}

impl Firmware {
    pub(crate) fn new(cfg: &DeviceConfig) -> Self {
        Self {
            profile: cfg.profile,
            caps: cfg.profile.caps(),
            clock: cfg.clock.clone(),
            power_on_at: cfg.clock.now(),
            fw_start: cfg.fw_start,
            initializing: true,
            dead: false,
            last_tick: Instant::now(),
            health_counter: 0,
            cmdq_base: 0,
            pending: 0,
            stuck: 0,
            doorbell_seen: false,
            checksums: false,
            nic_interface: 0,
            hca: HcaState::Disabled,
            issi: 0,
            driver_version: String::new(),
            fast_teardown_prepared: false,
            host_endianness: 0,
            pages: BTreeSet::new(),
            extra_demand: 0,
            page_requests: VecDeque::new(),
            uars: uar::UarSet::default(),
            eqs: BTreeMap::new(),
            eq_db_last: BTreeMap::new(),
            steering: flow::Steering::default(),
            eth: eth::EthObjects::default(),
            devx: uctx::Devx::default(),
            dctns: BTreeSet::new(),
            leaked: 0,
            port: PortState::power_on(cfg.profile),
            roce_en: false,
            vport_mtu: 1500,
            mac: cfg.mac,
            node_desc: default_node_desc(cfg.profile),
            memic: Default::default(),
        }
    }

    /// Power-on (or FLR): forget everything, rewrite BAR0.
    pub(crate) fn power_on(&mut self, bar: &vfio::DmaBuffer, cfg: &DeviceConfig) {
        // The whole BAR: a client may have stored anywhere in it (UAR pages
        // it never allocated included), and nothing of it may reach the next.
        if let Err(e) = bar.fill(0, bar.len(), 0) {
            tracing::error!(error = %e, "cannot clear BAR0 at power-on");
        }
        *self = Self::new(cfg);
        initseg::power_on(
            bar,
            cfg.profile,
            cfg.cmd_exec_timeout_ms,
            cfg.cmd_init_timeout_ms,
        );
    }

    /// Everything firmware keeps except what time alone moves (the power-on
    /// instant, the last tick, the health counter and `initializing`), for
    /// [`crate::PowerOnState`].
    pub(crate) fn state_summary(&self) -> String {
        let Self {
            profile,
            caps,
            clock: _,
            power_on_at: _,
            fw_start,
            initializing: _,
            dead,
            last_tick: _,
            health_counter: _,
            cmdq_base,
            pending,
            stuck,
            doorbell_seen,
            checksums,
            nic_interface,
            hca,
            issi,
            driver_version,
            fast_teardown_prepared,
            host_endianness,
            pages,
            extra_demand,
            page_requests,
            uars,
            eqs,
            eq_db_last,
            steering,
            eth,
            devx,
            dctns,
            leaked,
            port,
            roce_en,
            vport_mtu,
            mac,
            node_desc,
            memic,
        } = self;
        format!(
            "{:?}",
            (
                (profile, caps, fw_start, dead, cmdq_base, pending, stuck),
                (doorbell_seen, checksums, nic_interface, hca, issi),
                (driver_version, fast_teardown_prepared, host_endianness),
                (pages, extra_demand, page_requests, uars, eqs, eq_db_last),
                (steering, eth, leaked, port, roce_en, vport_mtu, mac, node_desc),
                devx,
                dctns,
                memic,
            )
        )
    }

    pub(crate) fn fill_stats(&self, s: &mut Stats) {
        s.pages_held = self.pages.len() as u64;
        s.eqs = self.eqs.len();
        s.uars = self.uars.len();
        s.flow_tables = self.steering.tables.len();
        s.flow_groups = self.steering.groups();
        s.ftes = self.steering.ftes();
        s.flow_counters = self.steering.counter_ids();
        s.leaked_at_teardown = self.leaked;
        s.hca_state = self.hca;
    }

    /// The internal timer's base: power-on and the device frequency (the
    /// data path stamps CQEs with the same clock, [`crate::transport::Rdma::timer`]).
    pub(crate) fn timer(&self) -> crate::transport::DeviceTimer {
        crate::transport::DeviceTimer {
            epoch: self.power_on_at,
            khz: self.cap(mlx5_hw::ifc::cmd_hca_cap::DEVICE_FREQUENCY_KHZ),
        }
    }

    /// The HCA clock (the internal timer): nanoseconds since power-on.
    pub(crate) fn hca_clock_ns(&self) -> u64 {
        self.clock.now().duration_since(self.power_on_at).as_nanos() as u64
    }

    /// Pages firmware needs to hold in its current state.
    pub(crate) fn page_demand(&self) -> u64 {
        let boot = u64::from(self.profile.boot_pages());
        let init = u64::from(self.profile.init_pages());
        match self.hca {
            HcaState::Enabled => boot,
            HcaState::Initialized => (boot as i64 + init as i64 + self.extra_demand).max(0) as u64,
            _ => 0,
        }
    }

    /// Firmware asks for (or returns) pages at run time.
    pub(crate) fn queue_page_request(&mut self, npages: i32) {
        self.page_requests.push_back(npages);
    }

    /// The heartbeat, called by the model's health thread: every
    /// [`HEALTH_TICK`] of real time the health counter moves and the
    /// internal timer (model time, in device clock cycles) is written. It
    /// beats on real time because it says the firmware runs, which on a
    /// clock a test holds still it does; and on a thread of its own, as
    /// real firmware's health runs beside the data path: a long data-path
    /// pass on a loaded machine is not hung firmware. A failed firmware
    /// (an injected health failure) no longer beats. So the timer a driver
    /// reads through the BAR lags the clock by up to a tick (a card's runs
    /// live), while a CQE's stamp is the clock itself: a wall-clock
    /// conversion snapshot taken from the BAR (`verbs::clock`) is late by
    /// that much.
    pub(crate) fn heartbeat(&mut self, inner: &Inner) {
        if self.dead || inner.faults.health().is_some() {
            return;
        }
        let beat = Instant::now();
        if beat.duration_since(self.last_tick) < HEALTH_TICK {
            return;
        }
        let bar = &inner.bar;
        self.last_tick = beat;
        self.health_counter = (self.health_counter + 1) & health::HEALTH_COUNTER_MASK;
        wr(bar, initseg::HEALTH_COUNTER, self.health_counter);
        let ticks = self.timer().ticks(self.clock.now());
        wr(bar, initseg::INTERNAL_TIMER_H, (ticks >> 32) as u32);
        wr(bar, initseg::INTERNAL_TIMER_L, ticks as u32);
    }

    /// One pass of the worker; true if something happened.
    pub(crate) fn poll(&mut self, inner: &Inner) -> bool {
        let bar = &inner.bar;
        // Start-up delays are model time (the heartbeat: [`Self::heartbeat`]).
        let now = self.clock.now();
        let mut busy = false;
        // Health.
        if let Some((synd, ext)) = inner.faults.health() {
            if !self.dead {
                tracing::warn!(%synd, ext, "firmware health failure injected");
                self.dead = true;
                let _ = bar.write(initseg::HEALTH_SYND, &[synd.to_raw()]);
                let _ = bar.write(initseg::HEALTH_EXT_SYND, &ext.to_be_bytes());
                // rfr set, severity valid and critical.
                let rfr_severity = 1 << health::RFR_BIT_OFFSET
                    | health::SEVERITY_VALID_MASK
                    | health::HealthSeverity::Critical.to_raw();
                let _ = bar.write(initseg::HEALTH_RFR_SEVERITY, &[rfr_severity]);
                wr(bar, initseg::HEALTH_FW_VER, health::HEALTH_FW_VER_DEAD);
                let hc = rd(bar, initseg::HEALTH_COUNTER) & health::HEALTH_COUNTER_MASK;
                wr(
                    bar,
                    initseg::HEALTH_COUNTER,
                    u32::from(synd.to_raw()) << health::HEALTH_COUNTER_SYNDROME_SHIFT | hc,
                );
                busy = true;
            }
            return busy;
        }
        if self.initializing {
            if now.duration_since(self.power_on_at) >= self.fw_start
                && !inner.faults.is_stuck_initializing()
            {
                let v = rd(bar, initseg::INITIALIZING) & !initseg::INITIALIZING_BIT;
                wr(bar, initseg::INITIALIZING, v);
                self.initializing = false;
                tracing::debug!("firmware initialized");
                return true;
            }
            return false;
        }
        busy |= self.poll_cmdq_regs(inner);
        if !inner.bus_master() {
            return busy;
        }
        busy |= self.poll_commands(inner);
        busy |= self.poll_eq_doorbells(inner);
        busy |= self.post_rdma_events(inner);
        busy |= self.post_page_requests(inner);
        busy
    }

    /// The command-queue address register: the driver writes the address
    /// (and, for fast teardown, nic_interface); the low byte always reads
    /// log size and stride.
    fn poll_cmdq_regs(&mut self, inner: &Inner) -> bool {
        let bar = &inner.bar;
        let l = rd(bar, initseg::CMDQ_ADDR_L_SZ);
        let h = rd(bar, initseg::CMDQ_ADDR_H);
        let base = u64::from(h) << 32 | u64::from(l & mlx5_hw::init::CMDQ_ADDR_L_MASK);
        let mut busy = false;
        if base != self.cmdq_base {
            tracing::debug!(base = format_args!("{base:#x}"), "command queue address");
            self.cmdq_base = base;
            busy = true;
        }
        if l & 0xff != initseg::CMDQ_SZ_BYTE {
            let nic = u32::from(mlx5_hw::init::nic_interface(l).to_raw());
            if nic != self.nic_interface {
                self.nic_interface = nic;
                if nic == u32::from(NicInterface::Disabled.to_raw()) {
                    self.fast_teardown(inner);
                    inner.rdma.reset();
                }
            }
            // The read-only byte back last: a driver reading it with the
            // state it wrote knows the state was taken (shared memory
            // shows the write at once, as a card does not).
            wr(
                bar,
                initseg::CMDQ_ADDR_L_SZ,
                (l & !0xff) | initseg::CMDQ_SZ_BYTE,
            );
            busy = true;
        }
        busy
    }

    fn poll_commands(&mut self, inner: &Inner) -> bool {
        let bar = &inner.bar;
        let mut db = rd(bar, initseg::CMD_DBELL);
        if db != 0 {
            wr(bar, initseg::CMD_DBELL, 0);
        }
        // Doorbells that arrive as trapped writes are all there: the shared
        // copy only repeats them (possibly an old one, which would start a
        // command the driver has handed over but not rung yet), and slots
        // are run on their doorbell only, as silicon does. Linux sets an
        // entry's ownership before it marks the command pending and rings:
        // running it early completes a command the driver does not wait for
        // yet ("Command completion arrived after timeout").
        let trapped = inner.cmd_doorbell_trapped.load(Ordering::Acquire);
        if trapped {
            db = inner.trapped_cmd_doorbell.swap(0, Ordering::AcqRel);
        }
        if db != 0 {
            self.pending |= db & !self.stuck;
            self.doorbell_seen = true;
        }
        if self.cmdq_base == 0 {
            return db != 0;
        }
        if self.doorbell_seen && !trapped {
            // A lost doorbell (overwritten in shared memory): any entry that
            // the driver handed to HW counts as rung.
            const N: usize = 1 << initseg::LOG_CMDQ_SIZE;
            const STRIDE: usize = 1 << initseg::LOG_CMDQ_STRIDE;
            let (n, stride) = (N, STRIDE);
            let mut q = [0u8; N * STRIDE];
            if inner.bus.dma.read(self.cmdq_base, &mut q).is_ok() {
                for slot in 0..n {
                    let e = CmdLayout::ref_from_prefix(&q[slot * stride..]).map(|(e, _)| e);
                    if e.is_ok_and(CmdLayout::hw_owned) && self.stuck & 1 << slot == 0 {
                        self.pending |= 1 << slot;
                    }
                }
            }
        }
        let busy = self.pending != 0;
        while self.pending != 0 {
            let slot = self.pending.trailing_zeros();
            self.pending &= !(1 << slot);
            crate::cmdq::run_slot(self, inner, slot as u8);
        }
        busy || db != 0
    }

    /// Runs one command's input; `Ok(output)` or the failing status.
    pub(crate) fn execute(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        let opcode = Opcode::from(be16(input, 0));
        use Opcode as O;
        // Before ENABLE_HCA firmware only takes ENABLE_HCA.
        if matches!(self.hca, HcaState::Disabled | HcaState::FastTornDown)
            && !matches!(opcode, O::EnableHca | O::Nop | O::DisableHca)
        {
            if !opcode.is_known() || !self.implements(opcode) {
                return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
            }
            return Err(fail(CmdStatus::BadSystemState, synd::HCA_NOT_ENABLED));
        }
        let needs_init = Self::needs_init(opcode);
        if needs_init && self.hca != HcaState::Initialized {
            return Err(fail(CmdStatus::BadSystemState, synd::HCA_NOT_INITIALIZED));
        }
        if needs_init {
            self.devx_check(opcode, input)?;
        }
        let r = match opcode {
            O::EnableHca => self.enable_hca(input, outlen),
            O::DisableHca => self.disable_hca(input, outlen),
            O::InitHca => self.init_hca(input, outlen),
            O::TeardownHca => self.teardown_hca(inner, input, outlen),
            O::SetDriverVersion => self.set_driver_version(input, outlen),
            O::Nop => sized(input, outlen, 0x10, 0x10).map(|_| vec![0; 0x10]),
            O::QueryIssi => self.query_issi(input, outlen),
            O::SetIssi => self.set_issi(input, outlen),
            O::QueryPages => self.query_pages(input, outlen),
            O::ManagePages => self.manage_pages(inner, input, outlen),
            O::QueryHcaCap => self.query_hca_cap(input, outlen),
            O::SetHcaCap => self.set_hca_cap(inner, input, outlen),
            O::AccessReg => self.access_reg(inner, input, outlen),
            O::QueryAdapter => self.query_adapter(input, outlen),
            O::QuerySpecialContexts => self.query_special_contexts(input, outlen),
            O::AllocUar => self.alloc_uar(inner, input, outlen),
            O::AllocMemic => self.alloc_memic(inner, input, outlen),
            O::DeallocMemic => self.dealloc_memic(inner, input, outlen),
            O::ModifyMemic => self.modify_memic(inner, input, outlen),
            O::DeallocUar => self.dealloc_uar(inner, input, outlen),
            O::CreateEq => self.create_eq_odp(inner, input, outlen),
            O::DestroyEq => self.destroy_eq_odp(inner, input, outlen),
            O::PageFaultResume => self.page_fault_resume(inner, input, outlen),
            O::QueryEq => self.query_eq(input, outlen),
            O::QueryVportState => self.query_vport_state(input, outlen),
            O::QueryHcaVportContext => self.query_hca_vport_context(input, outlen),
            O::QueryHcaVportGid => self.query_hca_vport_gid(input, outlen),
            O::QueryHcaVportPkey => self.query_hca_vport_pkey(input, outlen),
            O::QueryNicVportContext => self.query_nic_vport_context(inner, input, outlen),
            O::ModifyNicVportContext => self.modify_nic_vport_context(inner, input, outlen),
            O::AllocPd => self.alloc_pd(inner, input, outlen),
            O::DeallocPd => self.dealloc_pd(inner, input, outlen),
            O::AllocTransportDomain => self.alloc_transport_domain(inner, input, outlen),
            O::DeallocTransportDomain => self.dealloc_transport_domain(inner, input, outlen),
            O::CreateMkey => self.create_mkey(inner, input, outlen),
            O::DestroyMkey => self.destroy_mkey(inner, input, outlen),
            O::QueryMkey => self.query_mkey(inner, input, outlen),
            O::CreateCq => self.create_cq(inner, input, outlen),
            O::DestroyCq => self.destroy_cq(inner, input, outlen),
            O::QueryCq => self.query_cq(inner, input, outlen),
            O::ModifyCq => self.modify_cq(inner, input, outlen),
            O::CreateQp => self.create_qp(inner, input, outlen),
            O::DestroyQp => self.destroy_qp(inner, input, outlen),
            O::QueryQp => self.query_qp(inner, input, outlen),
            O::AttachToMcg => self.attach_to_mcg(inner, input, outlen),
            O::DetachFromMcg => self.detach_from_mcg(inner, input, outlen),
            O::Rst2InitQp
            | O::Init2InitQp
            | O::Init2RtrQp
            | O::Rtr2RtsQp
            | O::Rts2RtsQp
            | O::Sqerr2RtsQp
            | O::SqdRtsQp
            | O::ToErrQp
            | O::ToRstQp => self.modify_qp(inner, opcode, input, outlen),
            o if dct::is_dct(o) => self.execute_dct(inner, o, input, outlen),
            o if srq::is_srq(o) => self.execute_srq(inner, o, input, outlen),
            O::SetRoceAddress => self.set_roce_address(inner, input, outlen),
            O::AllocXrcd => self.alloc_xrcd(inner, input, outlen),
            O::DeallocXrcd => self.dealloc_xrcd(inner, input, outlen),
            O::AllocQCounter => self.alloc_q_counter(inner, input, outlen),
            O::DeallocQCounter => self.dealloc_q_counter(inner, input, outlen),
            O::QueryQCounter => self.query_q_counter(inner, input, outlen),
            O::QueryCongStatistics => self.query_cong_statistics(input, outlen),
            O::QueryRoceAddress => self.query_roce_address(inner, input, outlen),
            O::CreateFlowTable => self.create_flow_table(input, outlen),
            O::DestroyFlowTable => self.destroy_flow_table(input, outlen),
            O::ModifyFlowTable => self.modify_flow_table(input, outlen),
            O::QueryFlowTable => self.query_flow_table(input, outlen),
            O::SetFlowTableRoot => self.set_flow_table_root(input, outlen),
            O::CreateFlowGroup => self.create_flow_group(input, outlen),
            O::DestroyFlowGroup => self.destroy_flow_group(input, outlen),
            O::SetFlowTableEntry => self.set_fte(input, outlen),
            O::DeleteFlowTableEntry => self.delete_fte(input, outlen),
            O::QueryFlowTableEntry => self.query_fte(input, outlen),
            O::AllocFlowCounter => self.alloc_flow_counter(input, outlen),
            O::DeallocFlowCounter => self.dealloc_flow_counter(input, outlen),
            O::CreateUctx => self.create_uctx(input, outlen),
            O::DestroyUctx => self.destroy_uctx(input, outlen),
            O::CreateUmem => self.create_umem(inner, input, outlen),
            O::DestroyUmem => self.destroy_umem(input, outlen),
            O::CreateGeneralObject
            | O::ModifyGeneralObject
            | O::QueryGeneralObject
            | O::DestroyGeneralObject => self.general_obj(inner, opcode, input, outlen),
            _ => self.execute_eth(inner, opcode, input, outlen),
        };
        if opcode == O::TeardownHca && r.is_ok() {
            // Firmware forgets every object with the HCA.
            self.leaked += inner.rdma.objects() as u64;
            inner.rdma.reset();
            self.dctns.clear();
        }
        if let Ok(out) = &r {
            self.devx_done(opcode, input, out);
            crate::transport::steer::after(opcode, out, &self.steering, &self.eth, &inner.rdma);
        }
        r
    }

    /// The data-path object commands (fw/{pd,mkey,cq,qp,srq,roce}.rs).
    fn is_rdma(op: Opcode) -> bool {
        use Opcode as O;
        matches!(
            op,
            O::AllocPd
                | O::DeallocPd
                | O::AllocTransportDomain
                | O::DeallocTransportDomain
                | O::CreateMkey
                | O::DestroyMkey
                | O::QueryMkey
                | O::CreateCq
                | O::DestroyCq
                | O::QueryCq
                | O::ModifyCq
                | O::CreateQp
                | O::DestroyQp
                | O::QueryQp
                | O::AttachToMcg
                | O::DetachFromMcg
                | O::Rst2InitQp
                | O::Init2InitQp
                | O::Init2RtrQp
                | O::Rtr2RtsQp
                | O::Rts2RtsQp
                | O::Sqerr2RtsQp
                | O::SqdRtsQp
                | O::ToErrQp
                | O::ToRstQp
                | O::CreateSrq
                | O::DestroySrq
                | O::QuerySrq
                | O::ArmRq
                | O::CreateDct
                | O::DestroyDct
                | O::QueryDct
                | O::DrainDct
                | O::ArmDctForKeyViolation
                | O::SetRoceAddress
                | O::QueryRoceAddress
                | O::AllocXrcd
                | O::CreateXrcSrq
                | O::CreateRmp
                | O::DestroyRmp
                | O::ModifyRmp
                | O::QueryRmp
                | O::DestroyXrcSrq
                | O::DeallocXrcd
                | O::AllocQCounter
                | O::DeallocQCounter
                | O::QueryQCounter
        )
    }

    /// The Ethernet object commands (fw/{tis,tir,rqt,sq,rq,vxlan}.rs);
    /// BAD_OPERATION for any other opcode.
    fn execute_eth(&mut self, inner: &Inner, op: Opcode, input: &[u8], outlen: usize) -> CmdResult {
        use Opcode as O;
        match op {
            O::CreateTis => self.create_tis(inner, input, outlen),
            O::ModifyTis => self.modify_tis(input, outlen),
            O::DestroyTis => self.destroy_tis(input, outlen),
            O::QueryTis => self.query_tis(input, outlen),
            O::CreateTir => self.create_tir(inner, input, outlen),
            O::ModifyTir => self.modify_tir(input, outlen),
            O::DestroyTir => self.destroy_tir(input, outlen),
            O::QueryTir => self.query_tir(input, outlen),
            O::CreateRqt => self.create_rqt(input, outlen),
            O::ModifyRqt => self.modify_rqt(input, outlen),
            O::DestroyRqt => self.destroy_rqt(input, outlen),
            O::QueryRqt => self.query_rqt(input, outlen),
            O::CreateSq => self.create_sq(inner, input, outlen),
            O::ModifySq => self.modify_sq(inner, input, outlen),
            O::DestroySq => self.destroy_sq(inner, input, outlen),
            O::QuerySq => self.query_sq(inner, input, outlen),
            O::CreateRq => self.create_rq(inner, input, outlen),
            O::ModifyRq => self.modify_rq(inner, input, outlen),
            O::DestroyRq => self.destroy_rq(inner, input, outlen),
            O::QueryRq => self.query_rq(input, outlen),
            O::AddVxlanUdpDport => self.add_vxlan_udp_dport(input, outlen),
            O::DeleteVxlanUdpDport => self.delete_vxlan_udp_dport(input, outlen),
            O::SetL2TableEntry => self.set_l2_table_entry(inner, input, outlen),
            O::DeleteL2TableEntry => self.delete_l2_table_entry(inner, input, outlen),
            O::QueryVportCounter => self.query_vport_counter(inner, input, outlen),
            O::MadIfc => self.mad_ifc(inner, input, outlen),
            O::QueryFlowCounter => self.query_flow_counter(inner, input, outlen),
            _ => Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE)),
        }
    }

    /// The Ethernet object commands (fw/eth.rs).
    fn is_eth(op: Opcode) -> bool {
        use Opcode as O;
        matches!(
            op,
            O::CreateTis
                | O::ModifyTis
                | O::DestroyTis
                | O::QueryTis
                | O::CreateTir
                | O::ModifyTir
                | O::DestroyTir
                | O::QueryTir
                | O::CreateRqt
                | O::ModifyRqt
                | O::DestroyRqt
                | O::QueryRqt
                | O::CreateSq
                | O::ModifySq
                | O::DestroySq
                | O::QuerySq
                | O::CreateRq
                | O::ModifyRq
                | O::DestroyRq
                | O::QueryRq
                | O::AddVxlanUdpDport
                | O::DeleteVxlanUdpDport
                | O::SetL2TableEntry
                | O::DeleteL2TableEntry
                | O::QueryVportCounter
        )
    }

    /// The flow-steering commands (fw/flow.rs).
    fn is_flow(op: Opcode) -> bool {
        use Opcode as O;
        matches!(
            op,
            O::CreateFlowTable
                | O::DestroyFlowTable
                | O::ModifyFlowTable
                | O::QueryFlowTable
                | O::SetFlowTableRoot
                | O::CreateFlowGroup
                | O::DestroyFlowGroup
                | O::SetFlowTableEntry
                | O::DeleteFlowTableEntry
                | O::QueryFlowTableEntry
                | O::AllocFlowCounter
                | O::DeallocFlowCounter
                | O::QueryFlowCounter
        )
    }

    /// The commands firmware takes only once INIT_HCA has run.
    fn needs_init(op: Opcode) -> bool {
        use Opcode as O;
        Self::is_rdma(op)
            || Self::is_flow(op)
            || Self::is_eth(op)
            || matches!(
                op,
                O::AllocUar
                    | O::DeallocUar
                    | O::AllocMemic
                    | O::DeallocMemic
                    | O::ModifyMemic
                    | O::CreateEq
                    | O::DestroyEq
                    | O::QueryEq
                    | O::QuerySpecialContexts
                    | O::QueryVportState
                    | O::QueryHcaVportContext
                    | O::QueryHcaVportGid
                    | O::QueryHcaVportPkey
                    | O::QueryNicVportContext
                    | O::ModifyNicVportContext
                    | O::QueryCongStatistics
                    | O::CreateUctx
                    | O::DestroyUctx
                    | O::CreateUmem
                    | O::DestroyUmem
                    | O::CreateGeneralObject
                    | O::ModifyGeneralObject
                    | O::QueryGeneralObject
                    | O::DestroyGeneralObject
                    | O::MadIfc
            )
    }

    fn implements(&self, op: Opcode) -> bool {
        use Opcode as O;
        Self::needs_init(op)
            || matches!(
                op,
                O::EnableHca
                    | O::DisableHca
                    | O::InitHca
                    | O::TeardownHca
                    | O::SetDriverVersion
                    | O::Nop
                    | O::QueryIssi
                    | O::SetIssi
                    | O::QueryPages
                    | O::ManagePages
                    | O::QueryHcaCap
                    | O::SetHcaCap
                    | O::AccessReg
                    | O::QueryAdapter
            )
    }
}

/// The node description firmware boots with: the part number and the
/// card's name, as Mellanox firmware reports it ("MT4117 ConnectX4Lx ...").
fn default_node_desc(p: Profile) -> [u8; reg::NODE_DESC_BYTES] {
    let text = format!(
        "MT{} {} Mellanox Technologies",
        p.device_id(),
        p.name().replace(['-', ' '], "")
    );
    let mut d = [0u8; reg::NODE_DESC_BYTES];
    let n = text.len().min(d.len());
    d[..n].copy_from_slice(&text.as_bytes()[..n]);
    d
}

/// Checks the input length a command needs (else BAD_INPUT_LENGTH).
///
/// An output shorter than the command's full layout is no error: firmware
/// answers what fits (the command engine truncates the answer to
/// `outlen`), as drivers built against older, shorter layouts rely on
/// (QUERY_HCA_CAP with the 0x800-byte capability union of older
/// `mlx5_ifc.h` gets its first 0x810 bytes). The engine already refused
/// an output too short for status and syndrome; commands whose answer
/// has a variable part the caller sized (registers, P_Key tables, RQT
/// entries) check that themselves.
pub(crate) fn sized(
    input: &[u8],
    outlen: usize,
    inlen_min: usize,
    outlen_full: usize,
) -> Result<(), Fail> {
    if input.len() < inlen_min {
        return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
    }
    if outlen < outlen_full {
        tracing::trace!(outlen, outlen_full, "short output: answered truncated");
    }
    Ok(())
}

pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(s) => u16::from_be_bytes([s[0], s[1]]),
        None => 0,
    }
}
