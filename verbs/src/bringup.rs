//! Bring-up and teardown of one function, in the kernel's order
//! (`mlx5_init_one` → `mlx5_function_setup` → `mlx5_load`; and back).
//!
//! Open:
//! 1. PCI COMMAND: memory space + bus master (read-modify-write);
//! 2. wait for `initializing` (0x1fc bit 31) to clear (120 s);
//! 3. read log size/stride and the timeouts, check `cmdif_rev == 5`,
//!    write the command-queue address (0x10, 0x14), wait again;
//! 4. start the health poller; ENABLE_HCA; QUERY_ISSI/SET_ISSI (1, or 0);
//! 5. boot pages; ACCESS_REG HOST_ENDIANNESS; SET_HCA_CAP (general,
//!    atomic, RoCE); init pages; INIT_HCA; SET_DRIVER_VERSION; re-read caps;
//! 6. ALLOC_UAR, the event thread and MSI-X eventfds, the command EQ, event
//!    mode, the page worker, the async EQ (events and page requests);
//! 7. identity: QUERY_ADAPTER, the vport context's GUIDs.
//!
//! Close (also on Drop, and on a failed open from wherever it got to):
//! destroy the async EQ, back to polling, destroy the command EQ, stop the
//! event thread and detach the eventfds, DEALLOC_UAR, stop the health
//! poller, TEARDOWN_HCA (fast with the nic_interface handshake when the
//! device supports it, else graceful), reclaim every page, DISABLE_HCA,
//! unmap everything. The function can be opened again at once.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlx5_hw::ifc::*;
use mlx5_hw::init::{self as iseg, NicInterface, RegisterId, TeardownProfile};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use vfio::clock::{self, Deadline, SharedClock};
use vfio::mmio::wmb;
use vfio::{pci, Mmio, PciFunction};

use crate::caps::{self, Caps};
use crate::cmd::{Cmd, CmdQueue, TraceSink};
use crate::dma::DmaCtx;
use crate::eq::{self, AsyncEvent, Dispatch, Eq, EventLoop};
use crate::health::{HealthEvent, HealthPoller, HealthSnapshot, HealthSubscribers, Watch};
use crate::pagealloc::{PageWorker, Pages, QUERY_PAGES_BOOT, QUERY_PAGES_INIT};
use crate::uar::Uar;
use crate::{Error, Result};

/// How long firmware may stay `initializing` before the queue is set up (kernel: 120 s).
pub const FW_PRE_INIT_TIMEOUT: Duration = Duration::from_secs(120);
/// How often `initializing` is polled (kernel: 2 ms).
pub const FW_INIT_POLL: Duration = Duration::from_millis(2);
/// How long the fast-teardown handshake may take (kernel: MLX5_TO_TEARDOWN_MS).
pub const TEARDOWN_TIMEOUT: Duration = Duration::from_millis(iseg::TEARDOWN_TIMEOUT_MS);

/// How to open a function.
#[derive(Debug, Clone)]
pub struct HcaOptions {
    /// Switch commands to event completion once the command EQ exists.
    pub event_mode: bool,
    /// Health poll interval (the kernel: 2 s); `None` disables the poller.
    pub health_interval: Option<Duration>,
    /// Where to write every command's dumps, if anywhere.
    pub trace: Option<TraceSink>,
    /// Use fast teardown when the device supports it.
    pub fast_teardown: bool,
    /// The string SET_DRIVER_VERSION sends.
    pub driver_version: String,
    /// How long to wait for `initializing` before the queue is set up.
    pub fw_pre_init_timeout: Duration,
    /// The most 4 KiB pages firmware may hold at once (boot, init and
    /// run-time requests together); a request past it is refused
    /// (`pagealloc`). Default: [`crate::pagealloc::default_budget`].
    pub max_fw_pages: usize,
    /// The clock every timeout and the health poll interval are measured
    /// on. Default: the monotonic clock; tests hand a
    /// [`vfio::clock::ManualClock`] and move time themselves.
    pub clock: SharedClock,
    /// Completion vectors (one completion EQ and one MSI-X vector each) to
    /// create, at most what the function offers ([`eq::comp_vector_plan`]:
    /// its MSI-X vectors past the control one, its EQs past the control
    /// EQs). `None`: one per CPU the process may run on and port, as
    /// Linux does (`num_online_cpus`). `Some(0)` is refused.
    pub num_comp_vectors: Option<u32>,
    /// Queue memory (rings, CQEs, doorbell records) in 2 MiB huge pages
    /// when the system has them free. Off by default: the huge pages a
    /// system reserves are the application's (its buffer pools), and
    /// rdma-core's mlx5 likewise takes them for queues only when asked
    /// (`MLX5_*_HUGE`-style environment, `mlx5_use_huge`).
    pub huge_queue_memory: bool,
}

impl Default for HcaOptions {
    fn default() -> Self {
        Self {
            event_mode: true,
            health_interval: Some(Duration::from_millis(
                mlx5_hw::health::HEALTH_POLL_INTERVAL_MS.into(),
            )),
            trace: None,
            fast_teardown: true,
            driver_version: format!("Linux,mlx5-user,{}", env!("CARGO_PKG_VERSION")),
            fw_pre_init_timeout: FW_PRE_INIT_TIMEOUT,
            max_fw_pages: crate::pagealloc::default_budget(),
            clock: clock::system(),
            num_comp_vectors: None,
            huge_queue_memory: false,
        }
    }
}

/// Firmware version from the init segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwVersion {
    /// Major.
    pub major: u16,
    /// Minor.
    pub minor: u16,
    /// Sub-minor.
    pub subminor: u16,
}

impl std::fmt::Display for FwVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.subminor)
    }
}

/// Who the device says it is.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identity {
    /// IEEE vendor id (QUERY_ADAPTER).
    pub ieee_vendor_id: u32,
    /// PSID (QUERY_ADAPTER), trailing NULs removed.
    pub psid: String,
    /// Node GUID (vport context), if it could be read.
    pub node_guid: Option<u64>,
    /// System image GUID (vport context), if it could be read.
    pub system_image_guid: Option<u64>,
    /// Port GUID (vport context), if it could be read.
    pub port_guid: Option<u64>,
}

/// Port state as the PAOS/PTYS/PMTU registers and QUERY_VPORT_STATE give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortState {
    /// PAOS admin_status (1 up, 2 down).
    pub admin_status: u8,
    /// PAOS oper_status (1 up, 2 down).
    pub oper_status: u8,
    /// PTYS eth_proto_oper.
    pub eth_proto_oper: u32,
    /// PTYS ib_proto_oper.
    pub ib_proto_oper: u16,
    /// PMTU max MTU.
    pub max_mtu: u16,
    /// PMTU operational MTU.
    pub oper_mtu: u16,
}

/// An open HCA: firmware initialized, EQs running, pages supplied.
#[derive(Debug)]
pub struct Hca {
    func: Arc<dyn PciFunction>,
    opts: HcaOptions,
    bar: Arc<Mmio>,
    cmd: Cmd,
    pages: Arc<Pages>,
    page_tx: Arc<Mutex<Option<mpsc::Sender<crate::pagealloc::PageRequest>>>>,
    page_worker: Option<PageWorker>,
    events: Option<EventLoop>,
    cmd_eq: Option<Arc<Eq>>,
    async_eq: Option<Arc<Eq>>,
    comp_eqs: Vec<Arc<Eq>>,
    /// Completion vectors planned at bring-up, and MSI-X vectors attached.
    comp_plan: (u32, u32),
    comp_table: Arc<eq::CompTable>,
    dma: Arc<DmaCtx>,
    uars: Vec<Arc<Uar>>,
    health: Option<HealthPoller>,
    health_subs: HealthSubscribers,
    event_subs: Arc<Mutex<Vec<mpsc::Sender<AsyncEvent>>>>,
    caps: Option<Caps>,
    fw: FwVersion,
    identity: Identity,
    enabled: bool,
    initialized: bool,
    closed: bool,
}

/// Names the wait for `initializing` (a test's `ManualClock::wait_armed`).
pub const INITIALIZING_DEADLINE: &str = "firmware initializing";
/// Names the wait for `nic_interface` after a fast teardown.
pub const TEARDOWN_DEADLINE: &str = "fast teardown";

fn wait_initializing(bar: &Mmio, clock: &SharedClock, timeout: Duration) -> Result<()> {
    let deadline = Deadline::after(clock, timeout, INITIALIZING_DEADLINE);
    loop {
        if !iseg::fw_initializing(bar.read32_be(iseg::ISEG_INITIALIZING)?) {
            return Ok(());
        }
        if deadline.passed() {
            return Err(Error::Timeout {
                what: "firmware initializing (init segment 0x1fc bit 31)",
                after: deadline.waited(),
            });
        }
        deadline.pause(FW_INIT_POLL);
    }
}

/// PCI COMMAND |= memory space | bus master, keeping every other bit.
fn enable_bus_master(func: &dyn PciFunction) -> Result<()> {
    let mut b = [0u8; 2];
    func.config_read(pci::COMMAND, &mut b)?;
    let cmd = u16::from_le_bytes(b) | pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER;
    func.config_write(pci::COMMAND, &cmd.to_le_bytes())?;
    Ok(())
}

fn bad(opcode: Opcode) -> impl Fn(mlx5_hw::LayoutError) -> Error {
    move |_| Error::BadOutput {
        opcode,
        what: "short outbox",
    }
}

impl Hca {
    /// Brings the function up. On failure, whatever was set up is torn down
    /// again before the error returns.
    pub fn open(func: Arc<dyn PciFunction>, opts: HcaOptions) -> Result<Hca> {
        enable_bus_master(&*func)?;
        let bar = Arc::new(func.map_region(0)?);
        // Kernel order: wait *before* touching the queue registers.
        wait_initializing(&bar, &opts.clock, opts.fw_pre_init_timeout)?;
        let geo = CmdQueue::read_geometry(&bar)?;
        let dma = DmaCtx::new(func.clone())?;
        dma.bufs.set_huge(opts.huge_queue_memory);
        let q = CmdQueue::new(
            func.name().to_string(),
            bar.clone(),
            dma.clone(),
            geo,
            opts.clock.clone(),
            opts.trace.clone(),
        )?;
        let cmd = Cmd(q);
        let fw_rev = bar.read32_be(iseg::ISEG_FW_REV)?;
        let sub = bar.read32_be(iseg::ISEG_CMDIF_REV_FW_SUB)?;
        let mut h = Hca {
            func: func.clone(),
            opts: opts.clone(),
            bar: bar.clone(),
            cmd,
            pages: Arc::new(Pages::new(dma.clone(), opts.max_fw_pages)),
            page_tx: Arc::default(),
            page_worker: None,
            events: None,
            cmd_eq: None,
            async_eq: None,
            comp_eqs: Vec::new(),
            comp_plan: (0, 0),
            comp_table: Arc::default(),
            dma: dma.clone(),
            uars: Vec::new(),
            health: None,
            health_subs: Arc::default(),
            event_subs: Arc::default(),
            caps: None,
            fw: FwVersion {
                major: iseg::fw_rev_major(fw_rev),
                minor: iseg::fw_rev_minor(fw_rev),
                subminor: iseg::fw_rev_subminor(sub),
            },
            identity: Identity::default(),
            enabled: false,
            initialized: false,
            closed: false,
        };
        match h.bring_up(&dma) {
            Ok(()) => Ok(h),
            Err(e) => {
                tracing::error!("bring-up of {} failed: {e}", func.name());
                if let Err(e2) = h.shutdown() {
                    tracing::warn!("teardown after the failed bring-up: {e2}");
                }
                Err(e)
            }
        }
    }

    fn bring_up(&mut self, dma: &Arc<DmaCtx>) -> Result<()> {
        let init_to = self.cmd.geometry().init_timeout.max(Duration::from_secs(2));
        wait_initializing(&self.bar, &self.opts.clock, init_to)?;
        if let Some(iv) = self.opts.health_interval {
            self.health = Some(HealthPoller::start(
                self.watch(),
                self.opts.clock.clone(),
                iv,
            )?);
        }
        self.enable_hca()?;
        self.enabled = true;
        self.set_issi()?;
        self.pages.satisfy(&self.cmd, QUERY_PAGES_BOOT)?;
        self.set_host_endianness()?;
        caps::set_kernel_choices(&self.cmd)?;
        self.pages.satisfy(&self.cmd, QUERY_PAGES_INIT)?;
        self.simple(Opcode::InitHca, 0, init_hca_in::SIZE_BYTES)?;
        self.initialized = true;
        let pre = caps::query_page(&self.cmd, caps::CapType::General)?;
        if CmdHcaCap::new_unchecked(&pre.current[..]).driver_version() {
            self.set_driver_version()?;
        }
        let caps = Caps::query_all(&self.cmd)?;
        self.caps = Some(caps);
        self.start_events(dma)?;
        self.identity = self.query_identity()?;
        Ok(())
    }

    fn simple(&self, op: Opcode, op_mod: u16, in_len: usize) -> Result<Vec<u8>> {
        let mut inb = vec![0u8; in_len.max(16)];
        inb[..2].copy_from_slice(&op.to_raw().to_be_bytes());
        inb[6..8].copy_from_slice(&op_mod.to_be_bytes());
        self.cmd.exec(&inb, 16)
    }

    fn enable_hca(&self) -> Result<()> {
        let mut inb = [0u8; enable_hca_in::SIZE_BYTES];
        EnableHcaIn::new_unchecked(&mut inb[..]).set_opcode(Opcode::EnableHca.to_raw());
        self.cmd.exec(&inb, enable_hca_out::SIZE_BYTES).map(|_| ())
    }

    fn set_issi(&self) -> Result<()> {
        let mut inb = [0u8; query_issi_in::SIZE_BYTES];
        QueryIssiIn::new_unchecked(&mut inb[..]).set_opcode(Opcode::QueryIssi.to_raw());
        let out = match self.cmd.exec(&inb, query_issi_out::SIZE_BYTES) {
            Ok(o) => o,
            // Old firmware without QUERY_ISSI runs ISSI 0 (as the kernel accepts).
            Err(Error::Cmd {
                status: CmdStatus::BadOperation,
                ..
            }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let o = QueryIssiOut::new_checked(&out[..]).map_err(bad(Opcode::QueryIssi))?;
        let sup = o.supported_issi_dw0();
        if sup & (1 << 1) != 0 {
            let mut inb = [0u8; set_issi_in::SIZE_BYTES];
            SetIssiIn::new_unchecked(&mut inb[..])
                .set_opcode(Opcode::SetIssi.to_raw())
                .set_current_issi(1);
            self.cmd.exec(&inb, set_issi_out::SIZE_BYTES).map(|_| ())
        } else if sup & 1 != 0 || sup == 0 {
            Ok(())
        } else {
            Err(Error::NotSupported("ISSI 0 or 1"))
        }
    }

    fn set_host_endianness(&self) -> Result<()> {
        let mut data = [0u8; 16];
        data[0] = if cfg!(target_endian = "big") {
            iseg::HOST_ENDIANNESS_BIG
        } else {
            iseg::HOST_ENDIANNESS_LITTLE
        };
        self.access_reg(RegisterId::HostEndianness, 0, &data, true)
            .map(|_| ())
    }

    fn set_driver_version(&self) -> Result<()> {
        let mut inb = [0u8; set_driver_version_in::SIZE_BYTES];
        SetDriverVersionIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::SetDriverVersion.to_raw());
        let v = self.opts.driver_version.as_bytes();
        let n = v.len().min(63);
        inb[16..16 + n].copy_from_slice(&v[..n]);
        self.cmd
            .exec(&inb, set_driver_version_out::SIZE_BYTES)
            .map(|_| ())
    }

    fn start_events(&mut self, dma: &Arc<DmaCtx>) -> Result<()> {
        // Vector 0: the control EQs (commands; async events and page
        // requests), as Linux 6.12's ctrl_irq; then one per completion EQ.
        let msix = self.func.irq_count(vfio::IrqKind::MsiX)?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let g = self.caps().gen();
        let ports = u32::from(g.num_ports());
        self.comp_plan = eq::comp_vector_plan(
            msix,
            self.caps().max_eqs(),
            cpus,
            ports,
            self.opts.num_comp_vectors,
        )?;
        tracing::debug!(
            msix,
            cpus,
            comp_vectors = self.comp_plan.0,
            "MSI-X vectors: {} attached",
            self.comp_plan.1
        );
        let dispatch = Dispatch {
            cmd: self.cmd.0.clone(),
            pages: self.page_tx.clone(),
            subs: self.event_subs.clone(),
            comp: self.comp_table.clone(),
        };
        let events = EventLoop::start(self.func.clone(), self.comp_plan.1, dispatch)?;
        let events = self.events.insert(events);
        let cmd_mask = 1u64 << mlx5_hw::event::EventType::Cmd.to_raw();
        let uar = Arc::new(Uar::alloc(&self.cmd, self.bar.clone())?);
        self.uars.push(uar.clone());
        let ceq = Eq::create(
            &self.cmd,
            dma,
            uar,
            eq::CTRL_VECTOR,
            eq::CMD_EQ_NENT,
            cmd_mask,
        )?;
        self.cmd_eq = Some(events.add(ceq));
        if self.opts.event_mode {
            self.cmd.0.set_event_mode(true);
        }
        let worker = PageWorker::start(self.pages.clone(), self.cmd.clone())?;
        *self.page_tx.lock().unwrap_or_else(|p| p.into_inner()) = worker.sender();
        self.page_worker = Some(worker);
        let g = self.caps().gen();
        let mask = eq::async_event_mask(
            g.port_module_event(),
            g.general_notification_event(),
            g.temp_warn_event(),
        );
        let uar = Arc::new(Uar::alloc(&self.cmd, self.bar.clone())?);
        self.uars.push(uar.clone());
        let aeq = Eq::create(
            &self.cmd,
            dma,
            uar,
            eq::CTRL_VECTOR,
            eq::ASYNC_EQ_NENT,
            mask,
        )?;
        if let Some(ev) = &self.events {
            self.async_eq = Some(ev.add(aeq));
        }
        Ok(())
    }

    fn query_identity(&self) -> Result<Identity> {
        let mut inb = [0u8; query_adapter_in::SIZE_BYTES];
        QueryAdapterIn::new_unchecked(&mut inb[..]).set_opcode(Opcode::QueryAdapter.to_raw());
        let out = self.cmd.exec(&inb, query_adapter_out::SIZE_BYTES)?;
        let o = QueryAdapterOut::new_checked(&out[..]).map_err(bad(Opcode::QueryAdapter))?;
        let a = o.query_adapter_struct();
        let psid = String::from_utf8_lossy(a.vsd_contd_psid())
            .trim_end_matches('\0')
            .trim()
            .to_string();
        let mut id = Identity {
            ieee_vendor_id: a.ieee_vendor_id(),
            psid,
            ..Identity::default()
        };
        // IB ports (port_type 0) keep their GUIDs in the HCA vport context,
        // Ethernet ports in the NIC vport context.
        let guids = if self.caps().gen().port_type() == 0 {
            self.hca_vport_guids()
        } else {
            self.nic_vport_guids()
        };
        match guids {
            Ok((node, sys, port)) => {
                id.node_guid = Some(node);
                id.system_image_guid = Some(sys);
                id.port_guid = Some(port);
            }
            Err(e) => tracing::warn!("vport context query for GUIDs failed: {e}"),
        }
        Ok(id)
    }

    fn hca_vport_guids(&self) -> Result<(u64, u64, u64)> {
        let mut inb = [0u8; query_hca_vport_context_in::SIZE_BYTES];
        QueryHcaVportContextIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::QueryHcaVportContext.to_raw())
            .set_port_num(1);
        let out = self
            .cmd
            .exec(&inb, query_hca_vport_context_out::SIZE_BYTES)?;
        let o = QueryHcaVportContextOut::new_checked(&out[..])
            .map_err(bad(Opcode::QueryHcaVportContext))?;
        let c = o.hca_vport_context();
        Ok((c.node_guid(), c.system_image_guid(), c.port_guid()))
    }

    fn nic_vport_guids(&self) -> Result<(u64, u64, u64)> {
        let out = self.query_nic_vport_context()?;
        let o = QueryNicVportContextOut::new_unchecked(&out[..]);
        let c = o.nic_vport_context();
        Ok((c.node_guid(), c.system_image_guid(), c.port_guid()))
    }

    /// QUERY_NIC_VPORT_CONTEXT of the function's own vport: the whole
    /// output, its length checked (read it through
    /// `QueryNicVportContextOut`).
    pub(crate) fn query_nic_vport_context(&self) -> Result<Vec<u8>> {
        let mut inb = [0u8; query_nic_vport_context_in::SIZE_BYTES];
        QueryNicVportContextIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::QueryNicVportContext.to_raw());
        let out = self
            .cmd
            .exec(&inb, query_nic_vport_context_out::SIZE_BYTES)?;
        QueryNicVportContextOut::new_checked(&out[..])
            .map_err(bad(Opcode::QueryNicVportContext))?;
        Ok(out)
    }

    /// ACCESS_REG: reads (or writes, if `write`) register `reg_id` with
    /// `argument`; `data` is the register's bytes. Returns the register.
    pub fn access_reg(
        &self,
        reg_id: RegisterId,
        argument: u32,
        data: &[u8],
        write: bool,
    ) -> Result<Vec<u8>> {
        let hdr = access_register_in::SIZE_BYTES;
        let mut inb = vec![0u8; hdr + data.len()];
        AccessRegisterIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::AccessReg.to_raw())
            .set_op_mod(if write {
                iseg::ACCESS_REG_OP_MOD_WRITE
            } else {
                iseg::ACCESS_REG_OP_MOD_READ
            })
            .set_register_id(reg_id.to_raw())
            .set_argument(argument);
        inb[hdr..].copy_from_slice(data);
        let out_hdr = access_register_out::SIZE_BYTES;
        let out = self.cmd.exec(&inb, out_hdr + data.len())?;
        Ok(out[out_hdr.min(out.len())..].to_vec())
    }

    /// The port's state: QUERY_VPORT_STATE plus PAOS, PTYS and PMTU.
    pub fn port_state(&self, port: u8) -> Result<PortState> {
        let mut r = [0u8; paos_reg::SIZE_BYTES];
        PaosReg::new_unchecked(&mut r[..]).set_local_port(port);
        let paos = self.access_reg(RegisterId::Paos, 0, &r, false)?;
        let paos = PaosReg::new_unchecked(&paos[..]);
        let mut r = [0u8; ptys_reg::SIZE_BYTES];
        let eth = self.caps().gen().port_type() == 1;
        PtysReg::new_unchecked(&mut r[..])
            .set_local_port(port)
            .set_proto_mask(if eth { 0x4 } else { 0x1 });
        let ptys = self.access_reg(RegisterId::Ptys, 0, &r, false)?;
        let ptys = PtysReg::new_unchecked(&ptys[..]);
        let mut r = [0u8; pmtu_reg::SIZE_BYTES];
        PmtuReg::new_unchecked(&mut r[..]).set_local_port(port);
        let pmtu = self.access_reg(RegisterId::Pmtu, 0, &r, false)?;
        let pmtu = PmtuReg::new_unchecked(&pmtu[..]);
        Ok(PortState {
            admin_status: paos.admin_status(),
            oper_status: paos.oper_status(),
            eth_proto_oper: ptys.eth_proto_oper(),
            ib_proto_oper: ptys.ib_proto_oper(),
            max_mtu: pmtu.max_mtu(),
            oper_mtu: pmtu.oper_mtu(),
        })
    }

    /// QUERY_VPORT_STATE of the function's own vport: (admin_state, state).
    pub fn vport_state(&self) -> Result<(u8, u8)> {
        let mut inb = [0u8; query_vport_state_in::SIZE_BYTES];
        QueryVportStateIn::new_unchecked(&mut inb[..]).set_opcode(Opcode::QueryVportState.to_raw());
        let out = self.cmd.exec(&inb, query_vport_state_out::SIZE_BYTES)?;
        let o = QueryVportStateOut::new_checked(&out[..]).map_err(bad(Opcode::QueryVportState))?;
        Ok((o.admin_state(), o.state()))
    }

    /// The command queue, for raw commands.
    #[inline]
    pub fn cmd(&self) -> &Cmd {
        &self.cmd
    }

    /// NOP round trip.
    pub fn nop(&self) -> Result<()> {
        self.cmd.nop()
    }

    /// Capabilities as re-read after INIT_HCA.
    ///
    /// # Panics
    /// Never after a successful [`Hca::open`] (the caps are read during it).
    pub fn caps(&self) -> &Caps {
        static EMPTY: std::sync::OnceLock<Caps> = std::sync::OnceLock::new();
        self.caps.as_ref().unwrap_or_else(|| {
            EMPTY.get_or_init(|| Caps {
                general: caps::CapPage {
                    current: vec![0; caps::CAP_PAGE_BYTES],
                    max: vec![0; caps::CAP_PAGE_BYTES],
                },
                general_2: None,
                atomic: None,
                roce: None,
                odp: None,
                device_mem: None,
            })
        })
    }

    /// Firmware version (init segment).
    pub fn fw_version(&self) -> FwVersion {
        self.fw
    }

    /// Adapter identity and GUIDs.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Pages firmware holds now.
    pub fn fw_pages(&self) -> usize {
        self.pages.given()
    }

    /// The PCI function.
    pub fn function(&self) -> &Arc<dyn PciFunction> {
        &self.func
    }

    /// The EQ numbers: (command EQ, async EQ).
    pub fn eqns(&self) -> (Option<u8>, Option<u8>) {
        (
            self.cmd_eq.as_ref().map(|e| e.eqn()),
            self.async_eq.as_ref().map(|e| e.eqn()),
        )
    }

    /// Creates the completion EQs (one per completion vector, as many as
    /// [`HcaOptions::num_comp_vectors`] and the function allow, each on an
    /// MSI-X vector of its own) if they do not exist yet: what CQs deliver
    /// events through. Not part of bring-up (the kernel's mlx5_core creates
    /// them with the first user); the verbs context does it when it opens.
    pub fn create_comp_eqs(&mut self) -> Result<()> {
        if !self.comp_eqs.is_empty() {
            return Ok(());
        }
        let (n, attached) = self.comp_plan;
        let comp_mask = 1u64 << mlx5_hw::event::EventType::Comp.to_raw();
        for i in 0..n {
            let uar = Arc::new(Uar::alloc(&self.cmd, self.bar.clone())?);
            self.uars.push(uar.clone());
            let ceq = Eq::create(
                &self.cmd,
                &self.dma,
                uar,
                eq::comp_msix_vector(i, attached),
                eq::COMP_EQ_NENT,
                comp_mask,
            )?;
            match &self.events {
                Some(ev) => self.comp_eqs.push(ev.add(ceq)),
                None => {
                    ceq.destroy(&self.cmd)?;
                    return Err(Error::Closed);
                }
            }
        }
        Ok(())
    }

    /// The completion EQ numbers, in vector order (CQs name one as `c_eqn`).
    pub fn comp_eqns(&self) -> Vec<u8> {
        self.comp_eqs.iter().map(|e| e.eqn()).collect()
    }

    /// Completion vectors: the completion EQs created (after
    /// [`Hca::create_comp_eqs`]; before it, none).
    pub fn num_comp_vectors(&self) -> usize {
        self.comp_eqs.len()
    }

    /// What completion vector `v` saw: its EQ, MSI-X vector, the
    /// interrupts taken and EQEs drained; `None` past the last.
    pub fn comp_vector_stats(&self, v: usize) -> Option<eq::VectorStats> {
        let q = self.comp_eqs.get(v)?;
        let interrupts = self.events.as_ref().map_or(0, |e| e.interrupts(q.vector()));
        Some(eq::VectorStats {
            eqn: q.eqn(),
            msix_vector: q.vector(),
            interrupts,
            eqes: q.eqes(),
        })
    }

    /// The BAR0 mapping (UAR pages live in it).
    pub(crate) fn bar(&self) -> &Arc<Mmio> {
        &self.bar
    }

    /// The DMA address space the driver manages.
    pub(crate) fn dma(&self) -> &Arc<DmaCtx> {
        &self.dma
    }

    /// What the queue-memory arena holds now: chunks (one memfd and one
    /// DMA mapping each), the queue buffers and doorbell records in them.
    pub fn queue_memory(&self) -> crate::buf::ArenaStats {
        self.dma.queue_memory()
    }

    /// Where completion events are routed by CQ number.
    pub(crate) fn comp_table(&self) -> &Arc<eq::CompTable> {
        &self.comp_table
    }

    /// An EQ of event types `mask` on the control vector, served by the
    /// event thread (whose subscribers get its events): the page-fault EQ
    /// of on-demand paging (`mlx5r_odp_create_eq`). Its owner destroys it
    /// ([`Eq::destroy`]).
    pub(crate) fn create_ctrl_eq(&self, uar: Arc<Uar>, nent: u32, mask: u64) -> Result<Arc<Eq>> {
        let q = Eq::create(&self.cmd, &self.dma, uar, eq::CTRL_VECTOR, nent, mask)?;
        match &self.events {
            Some(ev) => Ok(ev.add(q)),
            None => {
                q.destroy(&self.cmd)?;
                Err(Error::Closed)
            }
        }
    }

    /// A channel of asynchronous events (port changes, errors...).
    pub fn subscribe_events(&self) -> Receiver<AsyncEvent> {
        let (tx, rx) = mpsc::channel();
        self.event_subs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        rx
    }

    /// Adds `tx` to the receivers of asynchronous events (a receiver that
    /// also takes events from elsewhere: DevX event channels).
    pub(crate) fn add_event_subscriber(&self, tx: mpsc::Sender<AsyncEvent>) {
        self.event_subs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
    }

    /// A channel of health failures.
    pub fn subscribe_health(&self) -> Receiver<HealthEvent> {
        let (tx, rx) = mpsc::channel();
        self.health_subs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        rx
    }

    /// The health failure, if the device has failed.
    pub fn health_failure(&self) -> Option<HealthEvent> {
        self.cmd.health_failure()
    }

    /// Runs the health sensors now (config space, the health buffer,
    /// `fw_ver`, `nic_interface`; not the counter, which needs polls):
    /// a failure is declared, as the poller would, and returned, so a
    /// caller that suspects the device gets the cause at once.
    pub fn check_health(&self) -> Result<()> {
        self.watch().check_now()
    }

    fn watch(&self) -> Watch {
        Watch {
            func: self.func.clone(),
            bar: self.bar.clone(),
            cmd: self.cmd.0.clone(),
            comp: self.comp_table.clone(),
            subs: self.health_subs.clone(),
            events: self.event_subs.clone(),
        }
    }

    /// Reads the health registers now.
    pub fn health_snapshot(&self) -> Result<HealthSnapshot> {
        HealthSnapshot::read(&self.bar)
    }

    /// Tears the HCA down. Errors along the way are logged and the
    /// teardown continues; the first one is returned.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Recovery: tear down what can be, reset the function, bring it up again.
    pub fn recover(mut self) -> Result<Hca> {
        let _ = self.shutdown();
        let func = self.func.clone();
        let opts = self.opts.clone();
        drop(self);
        func.reset()?;
        Hca::open(func, opts)
    }

    fn shutdown(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        // A give in progress (however large the request) ends after the
        // MANAGE_PAGES in flight.
        self.pages.stop();
        let mut first: Option<Error> = None;
        let mut note = |r: Result<()>, what: &str| {
            if let Err(e) = r {
                tracing::warn!("teardown: {what}: {e}");
                if first.is_none() {
                    first = Some(e);
                }
            }
        };
        for eq in std::mem::take(&mut self.comp_eqs) {
            note(eq.destroy(&self.cmd), "DESTROY_EQ (completion)");
        }
        if let Some(eq) = self.async_eq.take() {
            note(eq.destroy(&self.cmd), "DESTROY_EQ (async)");
        }
        // The command EQ is destroyed with polled completion, as the kernel does.
        self.cmd.0.set_event_mode(false);
        if let Some(eq) = self.cmd_eq.take() {
            note(eq.destroy(&self.cmd), "DESTROY_EQ (cmd)");
        }
        if let Some(mut ev) = self.events.take() {
            ev.stop();
        }
        *self.page_tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Some(mut w) = self.page_worker.take() {
            w.stop();
        }
        for uar in std::mem::take(&mut self.uars) {
            match Arc::try_unwrap(uar) {
                Ok(u) => note(u.free(&self.cmd), "DEALLOC_UAR"),
                Err(_) => tracing::warn!("teardown: UAR still referenced; not freed"),
            }
        }
        // The handshake below sets nic_interface = disabled, which the
        // health poller would report.
        if let Some(mut h) = self.health.take() {
            h.stop();
        }
        let failed = self.cmd.health_failure().is_some();
        let mut fw_gone = false;
        if self.initialized && !failed {
            let fast = self.opts.fast_teardown
                && self.caps.as_ref().is_some_and(|c| c.gen().fast_teardown());
            if fast {
                match self.fast_teardown() {
                    Ok(()) => fw_gone = true,
                    Err(e) => {
                        tracing::warn!("fast teardown failed ({e}); graceful teardown");
                        note(
                            self.teardown(TeardownProfile::GracefulClose),
                            "TEARDOWN_HCA",
                        );
                    }
                }
            } else {
                note(
                    self.teardown(TeardownProfile::GracefulClose),
                    "TEARDOWN_HCA",
                );
            }
        }
        // After fast teardown firmware has let go of its pages and its
        // command interface is disabled: free locally, as the kernel's fast
        // unload does.
        let cmd = (!failed && !fw_gone).then_some(&self.cmd);
        self.pages.reclaim_all(cmd);
        if self.enabled && !failed && !fw_gone {
            let mut inb = [0u8; disable_hca_in::SIZE_BYTES];
            DisableHcaIn::new_unchecked(&mut inb[..]).set_opcode(Opcode::DisableHca.to_raw());
            note(
                self.cmd.exec(&inb, disable_hca_out::SIZE_BYTES).map(|_| ()),
                "DISABLE_HCA",
            );
        }
        self.cmd.0.close();
        self.cmd.0.release_memory();
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn teardown(&self, profile: TeardownProfile) -> Result<()> {
        let mut inb = [0u8; teardown_hca_in::SIZE_BYTES];
        TeardownHcaIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::TeardownHca.to_raw())
            .set_profile(profile.to_raw());
        self.cmd
            .exec(&inb, teardown_hca_out::SIZE_BYTES)
            .map(|_| ())
    }

    fn fast_teardown(&self) -> Result<()> {
        let mut inb = [0u8; teardown_hca_in::SIZE_BYTES];
        TeardownHcaIn::new_unchecked(&mut inb[..])
            .set_opcode(Opcode::TeardownHca.to_raw())
            .set_profile(TeardownProfile::PrepareFastTeardown.to_raw());
        let out = self.cmd.exec(&inb, teardown_hca_out::SIZE_BYTES)?;
        if TeardownHcaOut::new_unchecked(&out[..]).state() {
            return Err(Error::NotSupported(
                "fast teardown (firmware: FORCE_STATE_FAIL)",
            ));
        }
        // The register's low byte is the device's (log size and stride of
        // the queue, read-only).
        let geometry = self.bar.read32_be(iseg::ISEG_CMDQ_ADDR_L_SZ)? & 0xff;
        // nic_interface = disabled, keeping the queue address bits.
        let l = iseg::cmdq_addr_l_sz(self.cmd.0.queue_iova() as u32, NicInterface::Disabled);
        self.bar.write32_be(iseg::ISEG_CMDQ_ADDR_L_SZ, l)?;
        wmb();
        let deadline = Deadline::after(&self.opts.clock, TEARDOWN_TIMEOUT, TEARDOWN_DEADLINE);
        loop {
            // Done when the device reads back disabled with its own low
            // byte: a card always returns it; a device whose init segment
            // is shared memory (mlx5-emu mapped) shows the write, low byte
            // 0, until its firmware has taken it, and a next open must not
            // find it half done.
            let v = self.bar.read32_be(iseg::ISEG_CMDQ_ADDR_L_SZ)?;
            if iseg::nic_interface(v) == NicInterface::Disabled && v & 0xff == geometry {
                return Ok(());
            }
            if deadline.passed() {
                return Err(Error::Timeout {
                    what: "nic_interface to read disabled after fast teardown",
                    after: deadline.waited(),
                });
            }
            deadline.pause(Duration::from_millis(1));
        }
    }
}

impl Drop for Hca {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            tracing::warn!("closing {} on drop: {e}", self.func.name());
        }
    }
}
