//! Devices and contexts: `ibv_get_device_list` / `ibv_open_device` and the
//! queries (`ibv_query_device`, `ibv_query_port`, `ibv_query_gid`).
//!
//! A [`Context`] is an open HCA ([`crate::hca::Hca`]) plus what the verbs
//! objects share: UAR pages for their doorbells, the port's RoCE GID table
//! and the asynchronous event stream. Every object ([`crate::pd::Pd`],
//! [`crate::cq::Cq`], ...) keeps the context alive; the HCA is torn down
//! when the context and the last object are gone.
//!
//! The link layer is Ethernet (RoCE v2): at open, GID index 0 of port 1 is
//! set with SET_ROCE_ADDRESS to `fe80::/64` + the EUI-64 of the port's
//! permanent MAC (QUERY_NIC_VPORT_CONTEXT), RoCE version 2, IPv6.
//!
//! `Context` is `Send + Sync`: commands may be issued from any thread.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlx5_hw::event::EventType;
use mlx5_hw::ifc::*;
use mlx5_hw::opcode::Opcode;
use vfio::PciFunction;

use crate::eq::AsyncEvent;
use crate::hca::{Hca, HcaOptions};
use crate::uar::{Bfreg, Uar, UarPool};
use crate::{Error, Result};

/// The RoCE GID of a port entry: 16 bytes, network order.
pub type Gid = [u8; 16];

/// `roce_version` of SET_ROCE_ADDRESS for RoCE v2 (`MLX5_ROCE_VERSION_2`).
pub const ROCE_VERSION_2: u8 = 2;
/// `roce_l3_type` for IPv6 (`MLX5_ROCE_L3_TYPE_IPV6`).
pub const ROCE_L3_TYPE_IPV6: u8 = 1;

/// How a `DEV` string names a function (the tools' syntax).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevSpec {
    /// `emu` or `emu:PROFILE`: a built-in device model, made by a provider
    /// the caller registers (verbs never depends on the model).
    Emu(String),
    /// `DDDD:BB:DD.F`: a PCI function bound to vfio-pci.
    Pci(String),
    /// `vfio-user:PATH`.
    VfioUser(String),
}

impl DevSpec {
    /// Parses `DEV`; `None` means the default device model (`emu`).
    pub fn parse(s: Option<&str>) -> Result<Self> {
        let Some(s) = s else {
            return Ok(DevSpec::Emu(String::new()));
        };
        if s == "emu" {
            return Ok(DevSpec::Emu(String::new()));
        }
        if let Some(p) = s.strip_prefix("emu:") {
            return Ok(DevSpec::Emu(p.to_ascii_lowercase()));
        }
        if let Some(p) = s.strip_prefix("vfio-user:") {
            if p.is_empty() {
                return Err(Error::Invalid("vfio-user: needs a socket path"));
            }
            return Ok(DevSpec::VfioUser(p.to_string()));
        }
        let parts: Vec<&str> = s.split([':', '.']).collect();
        let pci = parts.len() == 4
            && [4, 2, 2, 1]
                .iter()
                .zip(&parts)
                .all(|(n, p)| p.len() == *n && p.chars().all(|c| c.is_ascii_hexdigit()));
        if pci {
            return Ok(DevSpec::Pci(s.to_string()));
        }
        Err(Error::Invalid(
            "not a device: use a PCI address (0000:3b:00.0), emu[:PROFILE] or vfio-user:PATH",
        ))
    }
}

/// Makes functions for `DEV` strings: the hook through which a program that
/// links a device model (tools, tests) lets verbs open `emu:...` devices.
pub trait Provider: Send + Sync {
    /// Opens the function `spec` names, or says why not.
    fn open(&self, spec: &DevSpec) -> Result<Arc<dyn PciFunction>>;
}

/// One openable device (`struct ibv_device`).
#[derive(Clone)]
pub struct Device {
    name: String,
    func: Arc<dyn PciFunction>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish()
    }
}

impl Device {
    /// A device over an already-owned function.
    pub fn new(func: Arc<dyn PciFunction>) -> Self {
        Self {
            name: func.name().to_string(),
            func,
        }
    }

    /// Resolves `DEV` through `provider`.
    pub fn from_spec(spec: &DevSpec, provider: &dyn Provider) -> Result<Self> {
        provider.open(spec).map(Self::new)
    }

    /// The device's name (`ibv_get_device_name`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ibv_open_device`: brings the function up.
    pub fn open(&self) -> Result<Context> {
        Context::open(self.func.clone(), HcaOptions::default())
    }
}

/// `ibv_get_device_list`: the devices `specs` name, in order.
pub fn device_list(specs: &[&str], provider: &dyn Provider) -> Result<Vec<Device>> {
    specs
        .iter()
        .map(|s| Device::from_spec(&DevSpec::parse(Some(s))?, provider))
        .collect()
}

/// Device attributes (`struct ibv_device_attr`, the fields that apply).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAttr {
    /// Firmware version, `major.minor.subminor`.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest MR, in bytes.
    pub max_mr_size: u64,
    /// Vendor id (0x02c9, Mellanox).
    pub vendor_id: u32,
    /// PCI device id.
    pub vendor_part_id: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most outstanding WRs on one queue.
    pub max_qp_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most CQEs per CQ.
    pub max_cqe: u32,
    /// Most MRs.
    pub max_mr: u32,
    /// Most PDs.
    pub max_pd: u32,
    /// Outstanding RDMA reads/atomics as responder, per QP.
    pub max_qp_rd_atom: u32,
    /// Outstanding RDMA reads/atomics as initiator, per QP.
    pub max_qp_init_rd_atom: u32,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most WRs per SRQ.
    pub max_srq_wr: u32,
    /// Most SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Ports.
    pub phys_port_cnt: u8,
    /// Atomic capability: 0 none, 1 HCA (IBV_ATOMIC_HCA).
    pub atomic_cap: u32,
}

/// Port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// IBV_PORT_NOP.
    Nop = 0,
    /// IBV_PORT_DOWN.
    Down = 1,
    /// IBV_PORT_INIT.
    Init = 2,
    /// IBV_PORT_ARMED.
    Armed = 3,
    /// IBV_PORT_ACTIVE.
    Active = 4,
}

/// Port attributes (`struct ibv_port_attr`, the fields that apply to RoCE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU (IBV_MTU_*: 1 = 256 ... 5 = 4096).
    pub max_mtu: u8,
    /// Active MTU (IBV_MTU_*).
    pub active_mtu: u8,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Link layer: 2 = Ethernet (IBV_LINK_LAYER_ETHERNET).
    pub link_layer: u8,
}

/// An asynchronous event (`struct ibv_async_event`), numbered as
/// `enum ibv_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncEventKind {
    /// IBV_EVENT_CQ_ERR (0): CQ overrun or protection error.
    CqErr {
        /// The CQ number.
        cqn: u32,
        /// The EQE's syndrome.
        syndrome: u8,
    },
    /// IBV_EVENT_QP_FATAL (1).
    QpFatal(u32),
    /// IBV_EVENT_QP_REQ_ERR (2).
    QpReqErr(u32),
    /// IBV_EVENT_QP_ACCESS_ERR (3).
    QpAccessErr(u32),
    /// IBV_EVENT_COMM_EST (4).
    CommEst(u32),
    /// IBV_EVENT_SQ_DRAINED (5).
    SqDrained(u32),
    /// IBV_EVENT_PATH_MIG (6).
    PathMig(u32),
    /// IBV_EVENT_PATH_MIG_ERR (7).
    PathMigErr(u32),
    /// IBV_EVENT_DEVICE_FATAL (8).
    DeviceFatal,
    /// IBV_EVENT_PORT_ACTIVE (9).
    PortActive(u8),
    /// IBV_EVENT_PORT_ERR (10).
    PortErr(u8),
    /// IBV_EVENT_SRQ_ERR (14).
    SrqErr(u32),
    /// IBV_EVENT_SRQ_LIMIT_REACHED (15).
    SrqLimitReached(u32),
    /// IBV_EVENT_QP_LAST_WQE_REACHED (16).
    QpLastWqeReached(u32),
    /// Anything else, kept raw.
    Other(EventType, u8),
}

impl AsyncEventKind {
    /// The `ibv_event_type` number (`None` for [`AsyncEventKind::Other`]).
    pub fn ibv_event_type(&self) -> Option<u32> {
        Some(match self {
            Self::CqErr { .. } => 0,
            Self::QpFatal(_) => 1,
            Self::QpReqErr(_) => 2,
            Self::QpAccessErr(_) => 3,
            Self::CommEst(_) => 4,
            Self::SqDrained(_) => 5,
            Self::PathMig(_) => 6,
            Self::PathMigErr(_) => 7,
            Self::DeviceFatal => 8,
            Self::PortActive(_) => 9,
            Self::PortErr(_) => 10,
            Self::SrqErr(_) => 14,
            Self::SrqLimitReached(_) => 15,
            Self::QpLastWqeReached(_) => 16,
            Self::Other(..) => return None,
        })
    }

    /// Decodes an EQE of the async EQ as mlx5 does (`mlx5_ib_event`).
    pub fn from_eqe(e: &AsyncEvent) -> Self {
        use mlx5_hw::event::{EQE_PORT_SHIFT, EQE_RESOURCE_NUMBER_MASK};
        let qp_srq: &EqeQpSrq = zerocopy::transmute_ref!(&e.data);
        let res = qp_srq.qp_srq_n.get() & EQE_RESOURCE_NUMBER_MASK;
        let port_state: &EqePortState = zerocopy::transmute_ref!(&e.data);
        let port = port_state.port >> EQE_PORT_SHIFT;
        let cq_err: &EqeCqErr = zerocopy::transmute_ref!(&e.data);
        match e.event_type {
            EventType::CqError => Self::CqErr {
                cqn: cq_err.cqn.get() & EQE_RESOURCE_NUMBER_MASK,
                syndrome: cq_err.syndrome,
            },
            EventType::WqCatasError => Self::QpFatal(res),
            EventType::WqInvalReqError => Self::QpReqErr(res),
            EventType::WqAccessError => Self::QpAccessErr(res),
            EventType::CommEst => Self::CommEst(res),
            EventType::SqDrained => Self::SqDrained(res),
            EventType::PathMig => Self::PathMig(res),
            EventType::PathMigFailed => Self::PathMigErr(res),
            EventType::InternalError => Self::DeviceFatal,
            EventType::SrqCatasError => Self::SrqErr(res),
            EventType::SrqRqLimit => Self::SrqLimitReached(res),
            EventType::SrqLastWqe => Self::QpLastWqeReached(res),
            // sub_type: MLX5_PORT_CHANGE_SUBTYPE_ACTIVE = 4, DOWN = 1.
            EventType::PortChange if e.sub_type == 4 => Self::PortActive(port),
            EventType::PortChange if e.sub_type == 1 => Self::PortErr(port),
            t => Self::Other(t, e.sub_type),
        }
    }
}

/// What the verbs objects of one context share.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) hca: Hca,
    uars: Mutex<UarPool>,
    gids: Mutex<Vec<Option<Gid>>>,
    mac: [u8; 6],
    events: Mutex<Receiver<AsyncEvent>>,
    next_vector: std::sync::atomic::AtomicUsize,
    /// The UMR QP while anything holds it (`crate::umr::UmrEngine`: it
    /// holds the context, so the context holds it weakly).
    pub(crate) umr: Mutex<std::sync::Weak<crate::umr::UmrEngine>>,
    /// On-demand paging: QP memory and ODP regions by number, the fault
    /// handler while an ODP region exists (`crate::odp`).
    pub(crate) odp: crate::odp::CtxOdp,
    /// The mkey cache while its user holds it ([`crate::mkey_cache`]).
    pub(crate) mkey_cache: Mutex<std::sync::Weak<crate::mkey_cache::MkeyCache>>,
    /// The device clock's last wall-clock snapshot ([`crate::clock`]).
    pub(crate) clock: crate::clock::ClockCache,
    /// User indexes of polled Ethernet RQs ([`crate::uidx`]).
    pub(crate) uidx: crate::uidx::UidxPool,
}

impl Ctx {
    /// A UAR page for a CQ's doorbells ([`UarPool`]).
    pub(crate) fn alloc_uar(&self) -> Result<Arc<Uar>> {
        self.uar_pool().page(self.hca.cmd(), self.hca.bar())
    }

    /// Gives a CQ's UAR back; DEALLOC_UAR when nobody else uses it.
    pub(crate) fn release_uar(&self, uar: Arc<Uar>) {
        self.uar_pool().release(self.hca.cmd(), uar);
    }

    /// A bfreg for a QP's send doorbells ([`UarPool`]).
    pub(crate) fn alloc_bfreg(&self) -> Result<Bfreg> {
        self.uar_pool().bfreg(self.hca.cmd(), self.hca.bar())
    }

    /// Gives a QP's bfreg back.
    pub(crate) fn release_bfreg(&self, b: Bfreg) {
        self.uar_pool().release_bfreg(self.hca.cmd(), b);
    }

    fn uar_pool(&self) -> std::sync::MutexGuard<'_, UarPool> {
        self.uars.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The completion EQ for completion vector `v` (round robin when `None`).
    pub(crate) fn comp_eqn(&self, v: Option<usize>) -> Result<u8> {
        let eqns = self.hca.comp_eqns();
        if eqns.is_empty() {
            return Err(Error::NotSupported("completion EQs"));
        }
        let i = match v {
            Some(i) if i < eqns.len() => i,
            Some(vector) => {
                return Err(Error::CompVector {
                    vector,
                    count: eqns.len(),
                })
            }
            None => {
                self.next_vector
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    % eqns.len()
            }
        };
        Ok(eqns[i])
    }

    pub(crate) fn gid(&self, index: u32) -> Option<Gid> {
        let g = self.gids.lock().unwrap_or_else(|p| p.into_inner());
        g.get(index as usize).copied().flatten()
    }
}

/// An open device (`struct ibv_context`).
#[derive(Debug, Clone)]
pub struct Context {
    pub(crate) ctx: Arc<Ctx>,
}

/// The link-local GID of a MAC: `fe80::` + modified EUI-64.
pub fn link_local_gid(mac: [u8; 6]) -> Gid {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[8] = mac[0] ^ 0x02;
    g[9] = mac[1];
    g[10] = mac[2];
    g[11] = 0xff;
    g[12] = 0xfe;
    g[13] = mac[3];
    g[14] = mac[4];
    g[15] = mac[5];
    g
}

/// The MAC inside a link-local (EUI-64) GID, if it is one.
pub fn mac_of_link_local_gid(g: &Gid) -> Option<[u8; 6]> {
    if g[0] != 0xfe || g[1] & 0xc0 != 0x80 || g[11] != 0xff || g[12] != 0xfe {
        return None;
    }
    Some([g[8] ^ 0x02, g[9], g[10], g[13], g[14], g[15]])
}

/// The Ethernet group address of a multicast GID, as Linux's
/// `rdma_get_mcast_mac` maps it: an IPv4-mapped group (`::ffff:224.0.0.0/4`)
/// to `01:00:5e` and its low 23 bits (RFC 1112), an IPv6 one (`ff00::/8`)
/// to `33:33` and its low 32 bits (RFC 2464); none for a unicast GID.
pub fn mac_of_multicast_gid(g: &Gid) -> Option<[u8; 6]> {
    if !mlx5_hw::qp::is_multicast_gid(g) {
        return None;
    }
    Some(if g[0] == 0xff {
        [0x33, 0x33, g[12], g[13], g[14], g[15]]
    } else {
        [0x01, 0x00, 0x5e, g[13] & 0x7f, g[14], g[15]]
    })
}

impl Context {
    /// Opens `func` and prepares it for verbs (GID 0 of port 1).
    pub fn open(func: Arc<dyn PciFunction>, opts: HcaOptions) -> Result<Self> {
        let mut hca = Hca::open(func, opts)?;
        hca.create_comp_eqs()?;
        let events = hca.subscribe_events();
        let mac = query_mac(&hca).unwrap_or_else(|e| {
            tracing::warn!("QUERY_NIC_VPORT_CONTEXT for the port MAC: {e}");
            [0; 6]
        });
        let ntbl = hca
            .caps()
            .roce()
            .map(|r| 1u32 << r.roce_address_table_size().min(8))
            .unwrap_or(1)
            .max(1);
        let ctx = Ctx {
            hca,
            uars: Mutex::default(),
            gids: Mutex::new(vec![None; ntbl as usize]),
            mac,
            events: Mutex::new(events),
            next_vector: Default::default(),
            umr: Mutex::default(),
            odp: crate::odp::CtxOdp::default(),
            mkey_cache: Mutex::default(),
            clock: Default::default(),
            uidx: Default::default(),
        };
        let c = Context { ctx: Arc::new(ctx) };
        match c.set_gid(0, link_local_gid(mac)) {
            Ok(()) => {}
            Err(e @ Error::Cmd { .. }) => {
                tracing::warn!("GID 0 not set ({e}); RoCE traffic needs it")
            }
            Err(e) => return Err(e),
        }
        Ok(c)
    }

    /// The HCA underneath.
    pub fn hca(&self) -> &Hca {
        &self.ctx.hca
    }

    /// `ibv_context.num_comp_vectors`: the completion vectors CQs may name
    /// (`0..num_comp_vectors()`), one completion EQ and MSI-X vector each.
    pub fn num_comp_vectors(&self) -> usize {
        self.ctx.hca.num_comp_vectors()
    }

    /// What completion vector `v` saw (its EQ, MSI-X vector, interrupts,
    /// EQEs); `None` past the last.
    pub fn comp_vector_stats(&self, v: usize) -> Option<crate::eq::VectorStats> {
        self.ctx.hca.comp_vector_stats(v)
    }

    /// The port's MAC (permanent address of the NIC vport).
    pub fn mac(&self) -> [u8; 6] {
        self.ctx.mac
    }

    /// SET_ROCE_ADDRESS: GID table entry `index` of port 1 (RoCE v2, IPv6).
    pub fn set_gid(&self, index: u32, gid: Gid) -> Result<()> {
        {
            let g = self.ctx.gids.lock().unwrap_or_else(|p| p.into_inner());
            if index as usize >= g.len() {
                return Err(Error::Invalid("GID index beyond the table"));
            }
        }
        let mut inb = [0u8; set_roce_address_in::SIZE_BYTES];
        {
            let mut i = SetRoceAddressIn::new_unchecked(&mut inb[..]);
            i.set_opcode(Opcode::SetRoceAddress.to_raw())
                .set_roce_address_index(index as u16)
                .set_vhca_port_num(1);
            let mut a = i.roce_address_mut();
            a.source_l3_address_mut().copy_from_slice(&gid);
            let m = self.ctx.mac;
            a.set_source_mac_47_32(u16::from_be_bytes([m[0], m[1]]))
                .set_source_mac_31_0(u32::from_be_bytes([m[2], m[3], m[4], m[5]]))
                .set_roce_l3_type(ROCE_L3_TYPE_IPV6)
                .set_roce_version(ROCE_VERSION_2);
        }
        self.ctx
            .hca
            .cmd()
            .exec(&inb, set_roce_address_out::SIZE_BYTES)?;
        self.ctx.gids.lock().unwrap_or_else(|p| p.into_inner())[index as usize] = Some(gid);
        Ok(())
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        if port != 1 {
            return Err(Error::Invalid("port number (ports are numbered from 1)"));
        }
        self.ctx
            .gid(index)
            .ok_or(Error::Invalid("no GID at that index"))
    }

    /// `ibv_query_device`.
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let hca = &self.ctx.hca;
        let g = hca.caps().gen();
        let id = hca.identity();
        let fw = hca.fw_version();
        let mut dev_id = [0u8; 2];
        hca.function().config_read(2, &mut dev_id)?;
        let caps = hca.caps();
        let atomic = caps.atomic().is_some() && g.atomic();
        let max_wqes = caps.max_qp_sz()?;
        Ok(DeviceAttr {
            fw_ver: fw.to_string(),
            node_guid: id.node_guid.unwrap_or(0),
            sys_image_guid: id.system_image_guid.unwrap_or(0),
            max_mr_size: u64::MAX,
            vendor_id: 0x02c9,
            vendor_part_id: u16::from_le_bytes(dev_id).into(),
            max_qp: caps.max_qp()?,
            max_qp_wr: max_wqes,
            max_sge: crate::qp::MAX_SGE as u32,
            max_cq: caps.max_cq()?,
            max_cqe: caps.max_cq_sz()? - 1,
            max_mr: caps.max_mkey()?,
            max_pd: caps.max_pd()?,
            max_qp_rd_atom: caps.max_ra_res_qp()?,
            max_qp_init_rd_atom: caps.max_ra_req_qp()?,
            max_srq: caps.max_srq()?,
            max_srq_wr: caps.max_srq_sz()? - 1,
            max_srq_sge: crate::qp::MAX_SGE as u32 - 1,
            phys_port_cnt: g.num_ports(),
            atomic_cap: u32::from(atomic),
        })
    }

    /// `ibv_query_port`.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port == 0 || port > self.ctx.hca.caps().gen().num_ports().max(1) {
            return Err(Error::Invalid("port number"));
        }
        let s = self.ctx.hca.port_state(port)?;
        let mtu = |bytes: u16| -> u8 {
            match bytes {
                b if b >= 4096 => 5,
                b if b >= 2048 => 4,
                b if b >= 1024 => 3,
                b if b >= 512 => 2,
                _ => 1,
            }
        };
        let state = match s.oper_status {
            1 => PortState::Active,
            _ => PortState::Down,
        };
        let g = self.ctx.gids.lock().unwrap_or_else(|p| p.into_inner());
        Ok(PortAttr {
            state,
            max_mtu: mtu(s.max_mtu),
            active_mtu: mtu(s.oper_mtu),
            gid_tbl_len: g.len() as u32,
            max_msg_sz: self.ctx.hca.caps().max_msg()?,
            link_layer: 2,
        })
    }

    /// `ibv_get_async_event`, waiting up to `timeout` (`None`: nothing yet).
    pub fn get_async_event(&self, timeout: Duration) -> Option<AsyncEventKind> {
        let rx = self.ctx.events.lock().unwrap_or_else(|p| p.into_inner());
        rx.recv_timeout(timeout)
            .ok()
            .map(|e| AsyncEventKind::from_eqe(&e))
    }

    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&self) -> Result<crate::pd::Pd> {
        crate::pd::Pd::alloc(self)
    }

    /// `ibv_create_comp_channel`.
    pub fn create_comp_channel(&self) -> Result<crate::channel::CompChannel> {
        crate::channel::CompChannel::new()
    }

    /// `ibv_create_cq` with `cqe` entries at least, on completion vector
    /// `vector` (`None`: round robin), its events going to `channel`. A
    /// vector past [`Context::num_comp_vectors`] is refused
    /// ([`Error::CompVector`], `ibv_create_cq`'s EINVAL).
    pub fn create_cq(
        &self,
        cqe: u32,
        channel: Option<&crate::channel::CompChannel>,
        vector: Option<usize>,
    ) -> Result<crate::cq::Cq> {
        crate::cq::Cq::create(self, cqe, channel, vector, mlx5_hw::cqe::CQE_SIZE, None)
    }

    /// [`Context::create_cq`] whose receive CQEs the device may compress
    /// ([`crate::cq::CqeCompression`]; mlx5dv's
    /// `MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE`): for an Ethernet RQ read
    /// by a receive burst. Refused ([`Error::NotSupported`]) where the
    /// device offers no `cqe_compression`.
    pub fn create_cq_compressed(
        &self,
        cqe: u32,
        channel: Option<&crate::channel::CompChannel>,
        vector: Option<usize>,
        format: crate::cq::CqeCompression,
    ) -> Result<crate::cq::Cq> {
        let size = mlx5_hw::cqe::CQE_SIZE;
        crate::cq::Cq::create(self, cqe, channel, vector, size, Some(format))
    }

    /// `ibv_create_cq_ex` with `cqe_size` 64 or 128 (mlx5dv's
    /// `MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE`): 128-byte CQEs carry up to 64
    /// scattered bytes (`crate::scatter_cqe`).
    pub fn create_cq_sized(
        &self,
        cqe: u32,
        channel: Option<&crate::channel::CompChannel>,
        vector: Option<usize>,
        cqe_size: usize,
    ) -> Result<crate::cq::Cq> {
        if cqe_size != 64 && cqe_size != 128 {
            return Err(Error::Invalid("CQE size other than 64 or 128"));
        }
        crate::cq::Cq::create(self, cqe, channel, vector, cqe_size, None)
    }

    /// `ibv_close_device`: closes now if no object is left (else the HCA
    /// closes when the last object goes, and this says so).
    pub fn close(self) -> Result<()> {
        match Arc::try_unwrap(self.ctx) {
            Ok(ctx) => ctx.hca.close(),
            Err(_) => Err(Error::Busy("objects of this context still exist")),
        }
    }
}

fn query_mac(hca: &Hca) -> Result<[u8; 6]> {
    let out = hca.query_nic_vport_context()?;
    let o = QueryNicVportContextOut::new_unchecked(&out[..]);
    let c = o.nic_vport_context();
    let a = c.permanent_address();
    let hi = a.mac_addr_47_32().to_be_bytes();
    let lo = a.mac_addr_31_0().to_be_bytes();
    Ok([hi[0], hi[1], lo[0], lo[1], lo[2], lo[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_syntax() {
        assert_eq!(DevSpec::parse(None).unwrap(), DevSpec::Emu(String::new()));
        assert_eq!(
            DevSpec::parse(Some("emu:CX5")).unwrap(),
            DevSpec::Emu("cx5".into())
        );
        assert_eq!(
            DevSpec::parse(Some("0000:3b:00.1")).unwrap(),
            DevSpec::Pci("0000:3b:00.1".into())
        );
        assert_eq!(
            DevSpec::parse(Some("vfio-user:/tmp/s")).unwrap(),
            DevSpec::VfioUser("/tmp/s".into())
        );
        assert!(DevSpec::parse(Some("mlx5_0")).is_err());
        assert!(DevSpec::parse(Some("vfio-user:")).is_err());
    }

    #[test]
    fn gid_of_mac_round_trips() {
        let mac = [0x02, 0x15, 0xb3, 0x00, 0x00, 0x01];
        let g = link_local_gid(mac);
        assert_eq!(
            g,
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x15, 0xb3, 0xff, 0xfe, 0, 0, 1]
        );
        assert_eq!(mac_of_link_local_gid(&g), Some(mac));
        let mut other = g;
        other[0] = 0x20;
        assert_eq!(mac_of_link_local_gid(&other), None);
    }

    #[test]
    fn async_event_decoding() {
        let mut data = [0u8; 28];
        data[24..28].copy_from_slice(&0x0000_1234u32.to_be_bytes());
        let e = AsyncEvent {
            event_type: EventType::WqAccessError,
            sub_type: 0,
            data,
        };
        let k = AsyncEventKind::from_eqe(&e);
        assert_eq!(k, AsyncEventKind::QpAccessErr(0x1234));
        assert_eq!(k.ibv_event_type(), Some(3));
        let mut data = [0u8; 28];
        data[0..4].copy_from_slice(&0x77u32.to_be_bytes());
        data[11] = 1;
        let e = AsyncEvent {
            event_type: EventType::CqError,
            sub_type: 0,
            data,
        };
        assert_eq!(
            AsyncEventKind::from_eqe(&e),
            AsyncEventKind::CqErr {
                cqn: 0x77,
                syndrome: 1
            }
        );
    }
}
