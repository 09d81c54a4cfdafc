//! The device list (`MLX5_DEVICES`), opening and closing devices, the
//! queries (device, port, GID, P_Key); asynchronous events are
//! `async_event`'s.
//!
//! `MLX5_DEVICES` is a comma-separated list of the tools' `DEV` forms:
//! `emu[:PROFILE]` (a device-model function in this process; all of them
//! cabled together on one fabric, a single one looped back to itself),
//! `vfio-user:PATH`, or a PCI address bound to vfio-pci. Unset, it is
//! `emu`. The devices are named `mlx5_0`, `mlx5_1`, ... in that order.
//!
//! Opening a device brings its function up (`verbs::device::Context`); a
//! second `ibv_open_device` of the same device shares that context, and
//! the function goes down when the last context and object are gone.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use libc::{c_char, c_int, c_void};
use verbs::device::{Context, DevSpec};
use vfio::PciFunction;

use crate::abi::*;
pub(crate) use crate::async_event::CtxShared;
use crate::async_event::Dispatch;
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno, set_errno};

/// The environment variable naming the functions.
pub const DEVICES_ENV: &str = "MLX5_DEVICES";

/// One device of the list.
pub(crate) struct DevEntry {
    dev: Box<ibv_device>,
    spec: DevSpec,
    /// The device-model function, made at the first open and kept.
    emu: Mutex<Option<Arc<dyn PciFunction>>>,
    /// The open context and how many `ibv_context`s share it.
    open: Mutex<Option<(Context, usize)>>,
    /// The dispatcher of the device's async events to its contexts.
    events: Dispatch,
    guid: Mutex<Option<u64>>,
    /// The device's NIC receive table for `ibv_create_flow` (`crate::raw`),
    /// shared by its contexts: made at the first rule, destroyed with the
    /// last context.
    steering: Mutex<Option<verbs::flow::FlowSteering>>,
}

// SAFETY: `dev` is written once when the list is built and only read
// afterwards (its pointer fields are NULL); the rest is behind mutexes.
unsafe impl Sync for DevEntry {}
// SAFETY: as above.
unsafe impl Send for DevEntry {}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let n = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as c_char;
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MLX5_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The list `mlx5u_set_devices` set, if it did.
static SET_LIST: Mutex<Option<String>> = Mutex::new(None);
static DEVICES: OnceLock<Vec<DevEntry>> = OnceLock::new();

/// `mlx5u_set_devices` (mlx5_userspace.h): the device list, before the
/// first `ibv_get_device_list`.
#[no_mangle]
pub extern "C" fn mlx5u_set_devices(list: *const c_char) -> c_int {
    if list.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's NUL-terminated string, non-NULL.
    let s = unsafe { std::ffi::CStr::from_ptr(list) }
        .to_string_lossy()
        .into_owned();
    let mut g = lock(&SET_LIST);
    if DEVICES.get().is_some() {
        return ret_errno(libc::EBUSY);
    }
    *g = Some(s);
    0
}

/// The devices `mlx5u_set_devices` or `MLX5_DEVICES` names (read once
/// per process).
pub(crate) fn devices() -> &'static [DevEntry] {
    DEVICES.get_or_init(|| {
        init_logging();
        let set = lock(&SET_LIST).clone();
        let list = set
            .or_else(|| std::env::var(DEVICES_ENV).ok())
            .unwrap_or_else(|| "emu".into());
        let mut out = Vec::new();
        for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let spec = match DevSpec::parse(Some(s)) {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!("{DEVICES_ENV}: {s:?}: {e}");
                    continue;
                }
            };
            let i = out.len();
            let mut dev = Box::new(ibv_device {
                _ops: _ibv_device_ops {
                    _dummy1: std::ptr::null_mut(),
                    _dummy2: std::ptr::null_mut(),
                },
                node_type: 1,      // IBV_NODE_CA
                transport_type: 0, // IBV_TRANSPORT_IB
                name: [0; 64],
                dev_name: [0; 64],
                dev_path: [0; 256],
                ibdev_path: [0; 256],
            });
            copy_str(&mut dev.name, &format!("mlx5_{i}"));
            copy_str(&mut dev.dev_name, &format!("uverbs{i}"));
            copy_str(
                &mut dev.dev_path,
                &format!("/sys/class/infiniband_verbs/uverbs{i}"),
            );
            copy_str(
                &mut dev.ibdev_path,
                &format!("/sys/class/infiniband/mlx5_{i}"),
            );
            out.push(DevEntry {
                dev,
                spec,
                emu: Mutex::new(None),
                open: Mutex::new(None),
                events: Dispatch::default(),
                guid: Mutex::new(None),
                steering: Mutex::new(None),
            });
        }
        out
    })
}

/// Whether `dev` is a device of this library's list.
pub(crate) fn is_our_device(dev: *const ibv_device) -> bool {
    entry_of(dev).is_some()
}

fn entry_of(dev: *const ibv_device) -> Option<(usize, &'static DevEntry)> {
    devices()
        .iter()
        .enumerate()
        .find(|(_, e)| std::ptr::eq(&*e.dev, dev))
}

/// The process's device-model fabric: every `emu` function is cabled in.
fn fabric() -> &'static mlx5_emu::Fabric {
    static FABRIC: OnceLock<mlx5_emu::Fabric> = OnceLock::new();
    FABRIC.get_or_init(mlx5_emu::Fabric::new)
}

fn function_of(e: &DevEntry) -> Result<Arc<dyn PciFunction>, String> {
    let dev = tools::dev::Dev::from_spec(&e.spec)?;
    match dev {
        tools::dev::Dev::Emu(p) => {
            let mut g = lock(&e.emu);
            if let Some(f) = &*g {
                return Ok(f.clone());
            }
            let n = fabric().len() as u64;
            let mut cfg = mlx5_emu::DeviceConfig::for_profile(p);
            cfg.mac = mlx5_emu::DEFAULT_MAC + n;
            let f: Arc<dyn PciFunction> = fabric().add(cfg);
            *g = Some(f.clone());
            Ok(f)
        }
        d => d.open(),
    }
}

/// Runs `f` on the NIC receive table of `ctx`'s device, made if needed.
pub(crate) fn with_steering<T>(
    ctx: &Ctx,
    f: impl FnOnce(&mut verbs::flow::FlowSteering) -> verbs::Result<T>,
) -> verbs::Result<T> {
    let mut g = lock(&devices()[ctx.dev].steering);
    if g.is_none() {
        *g = Some(ctx.vc.flow_steering()?);
    }
    match &mut *g {
        Some(st) => f(st),
        None => Err(verbs::Error::Closed),
    }
}

/// The shared verbs context of device `e`, opened if needed.
fn acquire(e: &DevEntry) -> Result<Context, i32> {
    let mut g = lock(&e.open);
    if let Some((c, n)) = &mut *g {
        *n += 1;
        return Ok(c.clone());
    }
    let f = function_of(e).map_err(|m| {
        tracing::error!("opening {:?}: {m}", e.spec);
        libc::ENODEV
    })?;
    let c = Context::open(f, verbs::hca::HcaOptions::default())
        .map_err(|err| crate::errno_of("ibv_open_device", &err))?;
    if let Some(g) = c.hca().identity().node_guid {
        *lock(&e.guid) = Some(g);
    }
    *g = Some((c.clone(), 1));
    Ok(c)
}

fn release(e: &DevEntry) {
    let mut g = lock(&e.open);
    let last = match &mut *g {
        Some((_, n)) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => true,
        None => false,
    };
    if last {
        // The rules go with the table, before the context closes.
        if let Some(st) = lock(&e.steering).take() {
            if let Err(err) = st.destroy() {
                tracing::debug!("ibv_close_device: the flow table: {err}");
            }
        }
        if let Some((c, _)) = g.take() {
            if let Err(err) = c.close() {
                tracing::debug!("ibv_close_device: {err}; the HCA closes with its last object");
            }
        }
    }
}

/// An open device: the `verbs_context` C sees, then ours.
#[repr(C)]
pub(crate) struct Ctx {
    pub v: verbs_context,
    pub vc: Context,
    pub shared: Arc<CtxShared>,
    dev: usize,
    pub gid_tbl_len: u32,
    /// The DevX user context of `mlx5dv_devx_general_cmd`, made at its
    /// first call.
    pub devx: Mutex<Option<verbs::devx::DevxCtx>>,
    /// Opened with `MLX5DV_CONTEXT_FLAGS_DEVX`: its PDs are the DevX user
    /// context's (`crate::devx`), as the kernel makes them.
    pub devx_open: std::sync::atomic::AtomicBool,
}

impl Ctx {
    /// Whether the function is reached over vfio-user (the server maps
    /// only shared memory).
    pub(crate) fn is_vfio_user(&self) -> bool {
        matches!(devices()[self.dev].spec, DevSpec::VfioUser(_))
    }
}

/// The `Ctx` of an `ibv_context` this library made.
///
/// # Safety
///
/// `c` is a live context of this library ([`registry::is`]).
pub(crate) unsafe fn ctx_of<'a>(c: *mut ibv_context) -> &'a Ctx {
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: `c` is the `context` field of a `Ctx`'s `verbs_context`,
    // which is its first field: stepping back `off` bytes reaches the Ctx.
    unsafe { &*(c.wrapping_byte_sub(off) as *const Ctx) }
}

/// The `Ctx` of `c` if it is a live context, else `None` (errno EINVAL).
pub(crate) fn checked_ctx<'a>(c: *mut ibv_context) -> Option<&'a Ctx> {
    if !registry::is(c, Kind::Context) {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: the registry holds `c`: a live context of this library.
    Some(unsafe { ctx_of(c) })
}

fn ops() -> ibv_context_ops {
    ibv_context_ops {
        poll_cq: Some(crate::datapath::poll_cq),
        req_notify_cq: Some(crate::datapath::req_notify_cq),
        post_send: Some(crate::datapath::post_send),
        post_recv: Some(crate::datapath::post_recv),
        post_srq_recv: Some(crate::datapath::post_srq_recv),
        alloc_mw: Some(crate::mw::alloc_mw),
        bind_mw: Some(crate::mw::bind_mw),
        dealloc_mw: Some(crate::mw::dealloc_mw),
        ..Default::default()
    }
}

fn verbs_context_for(dev: *mut ibv_device, vc: &Context, async_fd: c_int) -> verbs_context {
    verbs_context {
        query_port: Some(query_port_ex),
        advise_mr: Some(crate::odp::advise_mr),
        alloc_null_mr: None,
        read_counters: None,
        attach_counters_point_flow: None,
        create_counters: None,
        destroy_counters: None,
        reg_dm_mr: Some(crate::dm::reg_dm_mr),
        alloc_dm: Some(crate::dm::alloc_dm),
        free_dm: Some(crate::dm::free_dm),
        modify_flow_action_esp: None,
        destroy_flow_action: None,
        create_flow_action_esp: None,
        modify_qp_rate_limit: None,
        alloc_parent_domain: None,
        dealloc_td: None,
        alloc_td: None,
        modify_cq: None,
        post_srq_ops: None,
        destroy_rwq_ind_table: Some(crate::rss::destroy_rwq_ind_table),
        create_rwq_ind_table: Some(crate::rss::create_rwq_ind_table),
        destroy_wq: Some(crate::rss::destroy_wq),
        modify_wq: Some(crate::rss::modify_wq),
        create_wq: Some(crate::rss::create_wq),
        query_rt_values: Some(crate::clock::query_rt_values),
        create_cq_ex: Some(crate::cq_ex::create_cq_ex),
        priv_: std::ptr::null_mut(),
        query_device_ex: Some(query_device_ex),
        ibv_destroy_flow: Some(crate::raw::destroy_flow),
        abi_placeholder2: None,
        ibv_create_flow: Some(crate::raw::create_flow),
        abi_placeholder1: None,
        open_qp: None,
        create_qp_ex: Some(crate::qp::create_qp_ex),
        get_srq_num: Some(crate::objects::get_srq_num),
        create_srq_ex: None,
        open_xrcd: None,
        close_xrcd: None,
        _abi_placeholder3: 0,
        sz: std::mem::size_of::<verbs_context>(),
        context: ibv_context {
            device: dev,
            ops: ops(),
            cmd_fd: -1,
            async_fd,
            num_comp_vectors: vc.num_comp_vectors() as c_int,
            mutex: mutex_init(),
            // __VERBS_ABI_IS_EXTENDED: verbs_get_ctx() finds the ops above.
            abi_compat: usize::MAX as *mut c_void,
        },
    }
}

/// `ibv_get_device_list`.
#[no_mangle]
pub extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    let d = devices();
    // SAFETY: calloc of n+1 pointers; checked for NULL below.
    let arr = unsafe { libc::calloc(d.len() + 1, std::mem::size_of::<*mut ibv_device>()) }
        as *mut *mut ibv_device;
    if arr.is_null() {
        return null_errno(libc::ENOMEM);
    }
    for (i, e) in d.iter().enumerate() {
        let dev = &*e.dev as *const ibv_device as *mut ibv_device;
        // SAFETY: `arr` has d.len() + 1 slots.
        unsafe { arr.wrapping_add(i).write(dev) };
    }
    if !num_devices.is_null() {
        // SAFETY: the caller's out parameter, non-NULL.
        unsafe { *num_devices = d.len() as c_int };
    }
    arr
}

/// `ibv_free_device_list`.
#[no_mangle]
pub extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: the array came from calloc in ibv_get_device_list (or NULL).
    unsafe { libc::free(list.cast()) };
}

/// `ibv_get_device_name`.
#[no_mangle]
pub extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    match entry_of(dev) {
        Some((_, e)) => e.dev.name.as_ptr(),
        None => null_errno(libc::EINVAL),
    }
}

/// `ibv_get_device_index`: its place in the list.
#[no_mangle]
pub extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    match entry_of(dev) {
        Some((i, _)) => i as c_int,
        None => -1,
    }
}

/// `ibv_get_device_guid`: the node GUID, network order (the device is
/// opened for it once if it has not been).
#[no_mangle]
pub extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> u64 {
    let Some((_, e)) = entry_of(dev) else {
        set_errno(libc::EINVAL);
        return 0;
    };
    if let Some(g) = *lock(&e.guid) {
        return g.to_be();
    }
    match acquire(e) {
        Ok(_) => {
            release(e);
            lock(&e.guid).unwrap_or(0).to_be()
        }
        Err(err) => {
            set_errno(err);
            0
        }
    }
}

/// `ibv_open_device`.
#[no_mangle]
pub extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let Some((i, e)) = entry_of(dev) else {
        return null_errno(libc::EINVAL);
    };
    let vc = match acquire(e) {
        Ok(c) => c,
        Err(err) => return null_errno(err),
    };
    let shared = match CtxShared::new() {
        Ok(s) => Arc::new(s),
        Err(err) => {
            release(e);
            return null_errno(err);
        }
    };
    let gid_tbl_len = vc.query_port(1).map(|p| p.gid_tbl_len).unwrap_or(1);
    e.events.subscribe(&vc, shared.clone());
    let b = Box::new(Ctx {
        v: verbs_context_for(dev, &vc, shared.async_fd()),
        vc,
        shared,
        dev: i,
        gid_tbl_len,
        devx: Mutex::new(None),
        devx_open: Default::default(),
    });
    let p = Box::into_raw(b);
    // SAFETY: `p` is the live box just made.
    let c = unsafe { &raw mut (*p).v.context };
    registry::add(c, Kind::Context);
    c
}

/// `ibv_close_device`.
#[no_mangle]
pub extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    let Some(ctx) = checked_ctx(c) else {
        return -1;
    };
    let left = ctx.shared.objects.load(Ordering::Acquire);
    if left > 0 {
        // As libibverbs: the close succeeds. The objects keep the device
        // up until they go; calls naming this context get EINVAL.
        tracing::warn!("ibv_close_device with {left} objects of it left");
    }
    registry::remove(c, Kind::Context);
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: `c` was live (the registry held it) and is a Ctx's context
    // field; the Ctx box is taken back exactly once (removed above).
    let b = unsafe { Box::from_raw(c.wrapping_byte_sub(off) as *mut Ctx) };
    let e = &devices()[b.dev];
    e.events.unsubscribe(&b.shared);
    drop(b);
    release(e);
    0
}

fn fill_device_attr(c: &Ctx, a: &mut ibv_device_attr) -> Result<(), i32> {
    let d =
        c.vc.query_device()
            .map_err(|e| crate::errno_of("ibv_query_device", &e))?;
    // SAFETY: ibv_device_attr is plain integers: all zeros is valid.
    *a = unsafe { std::mem::zeroed() };
    copy_str(&mut a.fw_ver, &d.fw_ver);
    a.node_guid = d.node_guid.to_be();
    a.sys_image_guid = d.sys_image_guid.to_be();
    a.max_mr_size = d.max_mr_size;
    a.page_size_cap = !0xfff;
    a.vendor_id = d.vendor_id;
    a.vendor_part_id = d.vendor_part_id;
    let clamp = |v: u32| v.min(i32::MAX as u32) as c_int;
    a.max_qp = clamp(d.max_qp);
    a.max_qp_wr = clamp(d.max_qp_wr);
    // RC_RNR_NAK_GEN, CURR_QP_STATE_MOD, PORT_ACTIVE_EVENT, SYS_IMAGE_GUID.
    // ... and memory windows of both types (IBV_DEVICE_MEM_WINDOW,
    // IBV_DEVICE_MEM_WINDOW_TYPE_2B), as many as MRs (both are mkeys).
    a.device_cap_flags = (1 << 12) | (1 << 7) | (1 << 10) | (1 << 11) | (1 << 17) | (1 << 24);
    // IBV_DEVICE_RAW_IP_CSUM: raw packet QPs' receive checksums checked.
    if c.vc.raw_ip_csum().unwrap_or(false) {
        a.device_cap_flags |= 1 << 26;
    }
    a.max_sge = clamp(d.max_sge);
    a.max_sge_rd = clamp(d.max_sge);
    a.max_cq = clamp(d.max_cq);
    a.max_cqe = clamp(d.max_cqe);
    a.max_mr = clamp(d.max_mr);
    a.max_mw = a.max_mr;
    a.max_pd = clamp(d.max_pd);
    a.max_qp_rd_atom = clamp(d.max_qp_rd_atom);
    a.max_res_rd_atom = clamp(d.max_qp_rd_atom.saturating_mul(d.max_qp));
    a.max_qp_init_rd_atom = clamp(d.max_qp_init_rd_atom);
    a.atomic_cap = d.atomic_cap as c_int;
    a.max_ah = i32::MAX;
    a.max_srq = clamp(d.max_srq);
    a.max_srq_wr = clamp(d.max_srq_wr);
    a.max_srq_sge = clamp(d.max_srq_sge);
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 16;
    a.phys_port_cnt = d.phys_port_cnt;
    Ok(())
}

/// `ibv_query_device`.
#[no_mangle]
pub extern "C" fn ibv_query_device(c: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's out struct, non-NULL.
    let a = unsafe { &mut *attr };
    match fill_device_attr(c, a) {
        Ok(()) => 0,
        Err(e) => ret_errno(e),
    }
}

/// `verbs_context.query_device_ex` (`ibv_query_device_ex`).
unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    _input: *const c_void,
    attr: *mut ibv_device_attr_ex,
    size: usize,
) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if attr.is_null() || size < std::mem::size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    // SAFETY: ibv_device_attr_ex is plain integers: zeros are valid.
    let mut ex: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    if let Err(e) = fill_device_attr(c, &mut ex.orig_attr) {
        return e;
    }
    ex.phys_port_cnt_ex = u32::from(ex.orig_attr.phys_port_cnt);
    ex.max_dm_size = c.vc.max_dm_size();
    let odp = c.vc.odp_caps();
    ex.odp_caps = ibv_odp_caps {
        general_caps: odp.general_caps,
        rc_odp_caps: odp.rc_odp_caps,
        uc_odp_caps: odp.uc_odp_caps,
        ud_odp_caps: odp.ud_odp_caps,
    };
    ex.xrc_odp_caps = odp.xrc_odp_caps;
    crate::clock::device_attr_clock(c, &mut ex);
    let n = size.min(std::mem::size_of::<ibv_device_attr_ex>());
    // SAFETY: the caller's struct holds `size` bytes; we copy at most that.
    unsafe { std::ptr::copy_nonoverlapping((&raw const ex).cast::<u8>(), attr.cast::<u8>(), n) };
    0
}

fn fill_port_attr(c: &Ctx, port: u8) -> Result<ibv_port_attr, i32> {
    let p =
        c.vc.query_port(port)
            .map_err(|e| crate::errno_of("ibv_query_port", &e))?;
    let active = p.state == verbs::device::PortState::Active;
    Ok(ibv_port_attr {
        state: p.state as c_int,
        max_mtu: c_int::from(p.max_mtu),
        active_mtu: c_int::from(p.active_mtu),
        gid_tbl_len: p.gid_tbl_len as c_int,
        // IBV_PORT_IP_BASED_GIDS: RoCE.
        port_cap_flags: 1 << 26,
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: 1,
        max_vl_num: 4,
        active_width: 1,                        // 1X
        active_speed: 32,                       // EDR: 25 Gb/s a lane
        phys_state: if active { 5 } else { 3 }, // LINK_UP / DISABLED
        link_layer: p.link_layer,
        ..Default::default()
    })
}

/// `verbs_context.query_port`: what the header's inline
/// `ibv_query_port` calls.
unsafe extern "C" fn query_port_ex(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    match fill_port_attr(c, port) {
        Ok(a) => {
            let n = len.min(std::mem::size_of::<ibv_port_attr>());
            // SAFETY: the caller's struct holds `len` bytes; we copy at most that.
            unsafe { std::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), attr.cast(), n) };
            0
        }
        Err(e) => e,
    }
}

/// `ibv_query_port` (the exported compat entry: the fields up to
/// `flags`, the old `struct _compat_ibv_port_attr`).
#[no_mangle]
pub extern "C" fn ibv_query_port(c: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    let n = std::mem::offset_of!(ibv_port_attr, port_cap_flags2);
    // SAFETY: forwarded; the compat struct holds `n` bytes.
    let r = unsafe { query_port_ex(c, port, attr, n) };
    if r != 0 {
        set_errno(r);
    }
    r
}

fn gid_at(c: &Ctx, port: u8, index: c_int) -> Result<Option<[u8; 16]>, i32> {
    if port != 1 || index < 0 || index as u32 >= c.gid_tbl_len {
        return Err(libc::EINVAL);
    }
    Ok(c.vc.query_gid(port, index as u32).ok())
}

/// `ibv_query_gid`: an empty entry reads as zeros, as sysfs shows it.
#[no_mangle]
pub extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return -1;
    };
    if gid.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    match gid_at(c, port, index) {
        Ok(g) => {
            // SAFETY: the caller's out GID, non-NULL.
            unsafe { (*gid).raw = g.unwrap_or([0; 16]) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// `ibv_query_gid_type` (IBVERBS_PRIVATE_34; ibv_devinfo calls it):
/// every GID is RoCE v2 (`IBV_GID_TYPE_SYSFS_ROCE_V2`).
#[no_mangle]
pub extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return -1;
    };
    if ty.is_null() || gid_at(c, port, index as c_int).is_err() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's out int, non-NULL.
    unsafe { *ty = 1 };
    0
}

/// `_ibv_query_gid_ex`: `ENODATA` for an empty entry.
#[no_mangle]
pub extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    _flags: u32,
    entry_size: usize,
) -> c_int {
    let Some(c) = checked_ctx(c) else {
        return libc::EINVAL;
    };
    if entry.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() || port > 255 {
        return ret_errno(libc::EINVAL);
    }
    match gid_at(c, port as u8, index as c_int) {
        Ok(Some(g)) => {
            let e = ibv_gid_entry {
                gid: ibv_gid { raw: g },
                gid_index: index,
                port_num: port,
                gid_type: 2, // IBV_GID_TYPE_ROCE_V2
                ndev_ifindex: 0,
            };
            // SAFETY: the caller's entry, non-NULL and large enough.
            unsafe { entry.write(e) };
            0
        }
        Ok(None) => ret_errno(libc::ENODATA),
        Err(e) => ret_errno(e),
    }
}

/// `_ibv_query_gid_table`: the valid entries, how many.
#[no_mangle]
pub extern "C" fn _ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    _flags: u32,
    entry_size: usize,
) -> isize {
    let Some(c) = checked_ctx(c) else {
        return -(libc::EINVAL as isize);
    };
    if entries.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
        return -(libc::EINVAL as isize);
    }
    let mut n = 0usize;
    for i in 0..c.gid_tbl_len {
        let Ok(Some(g)) = gid_at(c, 1, i as c_int) else {
            continue;
        };
        if n == max_entries {
            return -(libc::EINVAL as isize);
        }
        let e = ibv_gid_entry {
            gid: ibv_gid { raw: g },
            gid_index: i,
            port_num: 1,
            gid_type: 2,
            ndev_ifindex: 0,
        };
        // SAFETY: entry n < max_entries of the caller's array of
        // `entry_size`-byte entries.
        let at = entries.wrapping_byte_add(n * entry_size);
        // SAFETY: as above.
        unsafe { at.write(e) };
        n += 1;
    }
    n as isize
}

/// `ibv_query_pkey`: one entry, the default P_Key.
#[no_mangle]
pub extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if checked_ctx(c).is_none() {
        return -1;
    }
    if port != 1 || index != 0 || pkey.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's out value, non-NULL.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

/// `ibv_get_pkey_index`.
#[no_mangle]
pub extern "C" fn ibv_get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    if checked_ctx(c).is_none() || port != 1 || u16::from_be(pkey) & 0x7fff != 0x7fff {
        set_errno(libc::EINVAL);
        return -1;
    }
    0
}
