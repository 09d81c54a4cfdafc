//! mlx5dv's Dynamically Connected QPs through the C ABI:
//! `mlx5dv_create_qp` with `MLX5DV_QP_INIT_ATTR_MASK_DC`, as perftest's
//! `-c DC` and rdma-core's DC programs make them (C type `IBV_QPT_DRIVER`).
//!
//! - A **DCI** is a QP of this library ([`crate::qp::Qp`]) over the
//!   driver's DCI (`verbs::dc::Dci::into_qp`): `ibv_modify_qp` moves it as
//!   mlx5_ib's `modify_dci_qp_is_ok` allows; `ibv_qp_to_qp_ex` and
//!   `mlx5dv_qp_ex_from_ibv_qp_ex` give the `ibv_wr_*` batch, where
//!   `mlx5dv_wr_set_dc_addr[_stream]` names each WR's DCT between the
//!   operation and its data, as libmlx5 takes them;
//!   `mlx5dv_dci_stream_id_reset` takes an errored stream out of error.
//!   `ibv_post_send` has
//!   no way to name a DCT: EINVAL (libmlx5 would write a WQE without
//!   its datagram segment).
//! - A **DCT** is an object of its own ([`Dct`], registry kind `Dct`):
//!   made in RESET with its PD, CQ (`recv_cq`), SRQ and access key; INIT
//!   gives its access flags, P_Key index and port; RTR creates it on the
//!   device (CREATE_DCT, as mlx5_ib's `mlx5_ib_modify_dct` does), and
//!   only then has it a number: `qp_num`, as libmlx5 sets it from the
//!   modify's response. Posting to it is EINVAL; its receives come from
//!   the SRQ.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use libc::c_int;
use verbs::qp::{attr_mask as m, QpState, QpType, SendOp};

use crate::abi::*;
use crate::device::CtxShared;
use crate::objects::{ah_attr_of, ah_of, cq_of, lock, pd_of, srq_of, unuse, Cq, Pd, Srq};
use crate::qp::Qp;
use crate::qp_ex::DvOps;
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno};

/// `ibv_qp_state`s a DCT is in before RTR.
const RESET: c_int = QpState::Reset as c_int;
const INIT: c_int = QpState::Init as c_int;

/// `IBV_QPT_DRIVER`: the C type of DC QPs.
pub(crate) const IBV_QPT_DRIVER: c_int = 0xff;

/// `enum mlx5dv_qp_init_attr_mask`.
const MASK_QP_CREATE_FLAGS: u64 = 1 << 0;
const MASK_DC: u64 = 1 << 1;
const MASK_SEND_OPS_FLAGS: u64 = 1 << 2;
const MASK_DCI_STREAMS: u64 = 1 << 3;
/// `enum mlx5dv_qp_create_send_ops_flags` offered: MR_INTERLEAVED,
/// MR_LIST, MKEY_CONFIGURE.
const SEND_OPS_MKEY: u64 = 0x7;
/// `enum mlx5dv_dc_type`.
const DCTYPE_DCT: c_int = 1;
const DCTYPE_DCI: c_int = 2;

/// `mlx5dv_create_qp`: a DCI or a DCT (`MLX5DV_QP_INIT_ATTR_MASK_DC`),
/// or, without it, `ibv_create_qp_ex` with the scatter-to-CQE create
/// flags. Send-operation builders of mlx5dv (mkeys, raw WQEs, memcpy):
/// EOPNOTSUPP.
#[no_mangle]
pub extern "C" fn mlx5dv_create_qp(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
    dv: *mut mlx5dv_qp_init_attr,
) -> *mut ibv_qp {
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { &mut *attr };
    // SAFETY: the caller's mlx5 attributes, when given.
    let d = (!dv.is_null()).then(|| unsafe { dv.read() });
    let d = d.unwrap_or(mlx5dv_qp_init_attr {
        comp_mask: 0,
        create_flags: 0,
        dc_init_attr: mlx5dv_dc_init_attr {
            dc_type: 0,
            u: mlx5dv_dc_init_attr_u { dct_access_key: 0 },
        },
        send_ops_flags: 0,
    });
    // mlx5dv send operations: the mkey builders (`crate::mkey`) on RC;
    // raw WQEs and memcpy are not offered.
    let mlx5_ops = if d.comp_mask & MASK_SEND_OPS_FLAGS != 0 {
        d.send_ops_flags
    } else {
        0
    };
    if d.comp_mask & !(MASK_QP_CREATE_FLAGS | MASK_DC | MASK_DCI_STREAMS | MASK_SEND_OPS_FLAGS) != 0
        || mlx5_ops & !SEND_OPS_MKEY != 0
    {
        tracing::debug!(
            "mlx5dv_create_qp: comp_mask {:#x} / send ops {mlx5_ops:#x} not offered",
            d.comp_mask
        );
        return null_errno(libc::EOPNOTSUPP);
    }
    let flags = if d.comp_mask & MASK_QP_CREATE_FLAGS != 0 {
        d.create_flags
    } else {
        0
    };
    // Create flags libmlx5 takes only from a device that has what they
    // need: signature pipelining (SQD2RTS), packet-based credits. The
    // driver does neither: EOPNOTSUPP, as libmlx5 answers for such a
    // device (the scatter-to-CQE flags are the driver's to check).
    const PACKET_BASED_CREDIT_MODE: u32 = 1 << 5;
    const SIG_PIPELINING: u32 = 1 << 6;
    if flags & (PACKET_BASED_CREDIT_MODE | SIG_PIPELINING) != 0 {
        return null_errno(libc::EOPNOTSUPP);
    }
    let r = match (d.comp_mask & MASK_DC != 0, a.qp_type == IBV_QPT_DRIVER) {
        // A DCI takes no mkey builders (libmlx5: raw WQEs and memcpy
        // only), a DCT nothing to send.
        (true, true) if mlx5_ops != 0 => Err(libc::EOPNOTSUPP),
        (true, true) => match d.dc_init_attr.dc_type {
            DCTYPE_DCI => create_dci(a, &d, flags),
            DCTYPE_DCT if d.comp_mask & MASK_DCI_STREAMS == 0 => {
                // SAFETY: a DCT's member of the union, plain bytes.
                let key = unsafe { d.dc_init_attr.u.dct_access_key };
                create_dct(a, flags, key)
            }
            _ => Err(libc::EINVAL),
        },
        // libmlx5: a driver QP is a DC QP, and DC is a driver QP.
        (true, false) | (false, true) => Err(libc::EINVAL),
        (false, false) if d.comp_mask & MASK_DCI_STREAMS != 0 => Err(libc::EINVAL),
        (false, false) if flags == 0 && mlx5_ops == 0 => {
            // SAFETY: forwarded: the caller's attributes.
            return unsafe { crate::qp::create_qp_ex(c, attr) };
        }
        (false, false) => crate::qp::create_dv(a, flags, mlx5_ops != 0),
    };
    match r {
        Ok(q) => q,
        Err(e) => null_errno(e),
    }
}

/// The PD of an `ibv_qp_init_attr_ex`, which must name it.
fn pd_in(a: &ibv_qp_init_attr_ex) -> Result<*mut ibv_pd, c_int> {
    if a.comp_mask & crate::qp::PD == 0 {
        return Err(libc::EINVAL);
    }
    Ok(a.pd)
}

/// A DCI: the driver's, made a QP of this library.
fn create_dci(
    a: &mut ibv_qp_init_attr_ex,
    d: &mlx5dv_qp_init_attr,
    flags: u32,
) -> Result<*mut ibv_qp, c_int> {
    let p = pd_in(a)?;
    if a.comp_mask & crate::qp::SEND_OPS_FLAGS != 0
        && a.send_ops_flags & !crate::qp_ex::SEND_OPS_DCI != 0
    {
        return Err(libc::EOPNOTSUPP);
    }
    let streams = (d.comp_mask & MASK_DCI_STREAMS != 0).then(|| {
        // SAFETY: a DCI's member of the union.
        let s = unsafe { d.dc_init_attr.u.dci_streams };
        verbs::dc::DciStreams {
            log_num_concurent: s.log_num_concurent,
            log_num_errored: s.log_num_errored,
        }
    });
    // A DCI has no receive queue; its "receive CQ" is the send CQ unless
    // one is named (libmlx5 takes either).
    let recv_cq = if a.recv_cq.is_null() {
        a.send_cq
    } else {
        a.recv_cq
    };
    let mut base = ibv_qp_init_attr {
        recv_cq,
        srq: std::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..a.cap
        },
        ..crate::qp::base_of(a)
    };
    let q = crate::qp::create_with(p, &mut base, QpType::Rc, DvOps::Dc, |pd, init| {
        pd.create_dci(&verbs::dc::DciInitAttr {
            send_cq: init.send_cq,
            cap: init.cap,
            sq_sig_all: init.sq_sig_all,
            streams,
            create_flags: flags,
        })
        .map(verbs::dc::Dci::into_qp)
    })?;
    a.cap = base.cap;
    Ok(q)
}

/// A DC target, made on the device at RTR.
#[repr(C)]
pub(crate) struct Dct {
    pub c: ibv_qp,
    cq: *const Cq,
    srq: *const Srq,
    pd: *const Pd,
    shared: Arc<CtxShared>,
    access_key: u64,
    create_flags: u32,
    st: Mutex<DctState>,
}

impl Dct {
    /// Its CQ, SRQ and PD.
    fn parts(&self) -> (&Cq, &Srq, &Pd) {
        // SAFETY: a CQ, SRQ or PD is not destroyed while a DCT counts
        // as its user (their destroy calls check).
        let cq = unsafe { &*self.cq };
        // SAFETY: as above.
        let srq = unsafe { &*self.srq };
        // SAFETY: as above.
        let pd = unsafe { &*self.pd };
        (cq, srq, pd)
    }
}

/// A DCT's state: the attributes given so far, and the device's DCT once
/// RTR made it.
struct DctState {
    attr: ibv_qp_attr,
    dct: Option<verbs::dc::Dct>,
}

/// A DCT in RESET: nothing on the device yet (mlx5_ib's `create_dct`
/// keeps the context until RTR too).
fn create_dct(
    a: &mut ibv_qp_init_attr_ex,
    flags: u32,
    access_key: u64,
) -> Result<*mut ibv_qp, c_int> {
    let p = pd_in(a)?;
    if a.comp_mask & crate::qp::SEND_OPS_FLAGS != 0 {
        // libmlx5: a DCT sends nothing.
        return Err(libc::EINVAL);
    }
    let pd = pd_of(p).ok_or(libc::EINVAL)?;
    let cq = cq_of(a.recv_cq).ok_or(libc::EINVAL)?;
    let srq = srq_of(a.srq).ok_or(libc::EINVAL)?;
    for u in [&pd.users, &cq.users, &srq.users] {
        u.fetch_add(1, Ordering::AcqRel);
    }
    pd.shared.objects.fetch_add(1, Ordering::AcqRel);
    a.cap = ibv_qp_cap::default();
    let b = Box::into_raw(Box::new(Dct {
        c: ibv_qp {
            context: pd.c.context,
            qp_context: a.qp_context,
            pd: p,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: 0,
            // Its number comes at RTR.
            qp_num: 0,
            state: 0,
            qp_type: IBV_QPT_DRIVER,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        },
        cq,
        srq,
        pd,
        shared: pd.shared.clone(),
        access_key,
        create_flags: flags,
        st: Mutex::new(DctState {
            attr: ibv_qp_attr::default(),
            dct: None,
        }),
    }));
    registry::add(b, Kind::Dct);
    Ok(b.cast())
}

/// Whether `p` is a live DCT of this library.
pub(crate) fn is_dct(p: *mut ibv_qp) -> bool {
    registry::is(p, Kind::Dct)
}

/// `ibv_modify_qp` of a DCT, as mlx5_ib's `mlx5_ib_modify_dct`: RESET to
/// INIT with exactly the access flags, P_Key index and port; INIT to RTR
/// with exactly the minimum RNR timer, the address (GID index, traffic
/// class, flow label, hop limit, SL) and the path MTU, which creates it.
/// Any other transition or attribute: EINVAL.
pub(crate) fn modify_dct(p: *mut ibv_qp, a: &ibv_qp_attr, mask: c_int) -> c_int {
    // SAFETY: `p` is a live Dct (the caller checked the registry).
    let d = unsafe { &*(p as *const Dct) };
    let mask = mask as u32;
    let mut st = lock(&d.st);
    let to = crate::qp::state_of(a.qp_state);
    let exact = |want: u32| mask == m::STATE | want;
    match (st.attr.qp_state, to) {
        _ if mask & m::STATE == 0 => ret_errno(libc::EINVAL),
        (RESET, Some(QpState::Init)) => {
            if !exact(m::ACCESS_FLAGS | m::PKEY_INDEX | m::PORT) || a.port_num != 1 {
                return ret_errno(libc::EINVAL);
            }
            st.attr.qp_access_flags = a.qp_access_flags;
            st.attr.pkey_index = a.pkey_index;
            st.attr.port_num = a.port_num;
            st.attr.qp_state = QpState::Init as c_int;
            // SAFETY: the live DCT's own C struct.
            unsafe { (*p).state = st.attr.qp_state };
            0
        }
        (INIT, Some(QpState::Rtr)) => {
            if !exact(m::MIN_RNR_TIMER | m::AV | m::PATH_MTU) {
                return ret_errno(libc::EINVAL);
            }
            let ah_attr = match ah_attr_of(&a.ah_attr) {
                Ok(v) => v,
                Err(e) => return ret_errno(e),
            };
            let (cq, srq, pd) = d.parts();
            let g = cq.cq.lock_control();
            let r = pd.pd.create_dct(&verbs::dc::DctInitAttr {
                cq: &g,
                srq: &srq.srq,
                access_key: d.access_key,
                access_flags: st.attr.qp_access_flags,
                path_mtu: a.path_mtu as u8,
                min_rnr_timer: a.min_rnr_timer,
                ah_attr,
                pkey_index: st.attr.pkey_index,
                create_flags: d.create_flags,
            });
            drop(g);
            let dct = match r {
                Ok(v) => v,
                Err(e) => return ret_errno(crate::errno_of("ibv_modify_qp (CREATE_DCT)", &e)),
            };
            let dctn = dct.dctn();
            st.dct = Some(dct);
            st.attr.path_mtu = a.path_mtu;
            st.attr.min_rnr_timer = a.min_rnr_timer;
            st.attr.ah_attr = a.ah_attr;
            st.attr.qp_state = QpState::Rtr as c_int;
            // SAFETY: the live DCT's own C struct; libmlx5 writes its
            // qp_num from the modify's response the same way.
            unsafe { (*p).qp_num = dctn };
            // SAFETY: as above.
            unsafe { (*p).handle = dctn };
            // SAFETY: as above.
            unsafe { (*p).state = st.attr.qp_state };
            0
        }
        _ => {
            tracing::debug!(
                "ibv_modify_qp: a DCT moves RESET -> INIT -> RTR only (state {}, mask {mask:#x})",
                st.attr.qp_state
            );
            ret_errno(libc::EINVAL)
        }
    }
}

/// `ibv_query_qp` of a DCT: its state and the attributes given.
pub(crate) fn query_dct(p: *mut ibv_qp, attr: &mut ibv_qp_attr, init: &mut ibv_qp_init_attr) {
    // SAFETY: `p` is a live Dct (the caller checked the registry).
    let d = unsafe { &*(p as *const Dct) };
    let a = lock(&d.st).attr;
    *attr = ibv_qp_attr {
        cur_qp_state: a.qp_state,
        ..a
    };
    *init = ibv_qp_init_attr {
        qp_context: d.c.qp_context,
        send_cq: d.c.send_cq,
        recv_cq: d.c.recv_cq,
        srq: d.c.srq,
        cap: ibv_qp_cap::default(),
        qp_type: IBV_QPT_DRIVER,
        sq_sig_all: 0,
    };
}

/// `ibv_destroy_qp` of a DCT: drained and destroyed on the device if RTR
/// made it (its receive CQEs still in the CQ go, their WQEs back to the
/// SRQ).
pub(crate) fn destroy_dct(p: *mut ibv_qp) -> c_int {
    if !registry::remove(p, Kind::Dct) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Dct) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let dct = lock(&b.st).dct.take();
    let r = dct.map_or(Ok(()), verbs::dc::Dct::destroy);
    let (cq, srq, pd) = b.parts();
    for u in [&cq.users, &srq.users, &pd.users] {
        unuse(u);
    }
    match r {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_destroy_qp (DESTROY_DCT)", &e)),
    }
}

/// `mlx5dv_qp_ex_from_ibv_qp_ex`: the QP's `mlx5dv_qp_ex` (its DC
/// address setters on a DCI, NULL ones elsewhere, as libmlx5's).
#[no_mangle]
pub extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(qpx: *mut ibv_qp_ex) -> *mut mlx5dv_qp_ex {
    let Some(q) = crate::qp::qp_of(qpx.cast()) else {
        return std::ptr::null_mut();
    };
    std::ptr::addr_of!(q.dv).cast_mut()
}

/// `mlx5dv_dci_stream_id_reset`: stream `stream_id` of the DCI `p` (in
/// RTS) out of error; EINVAL for another QP (a DCT among them), the
/// device's refusal for a stream not in error or a DCI without streams.
#[no_mangle]
pub extern "C" fn mlx5dv_dci_stream_id_reset(p: *mut ibv_qp, stream_id: u16) -> c_int {
    let Some(q) = crate::qp::qp_of(p) else {
        return libc::EINVAL;
    };
    if q.c.qp_base.qp_type != IBV_QPT_DRIVER {
        return ret_errno(libc::EINVAL);
    }
    match q.qp.lock_control().dci_stream_id_reset(stream_id) {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("mlx5dv_dci_stream_id_reset", &e)),
    }
}

/// The QP whose `dv` is `mqp`.
///
/// # Safety
///
/// `mqp` is the `dv` field of a live [`Qp`] (from
/// [`mlx5dv_qp_ex_from_ibv_qp_ex`]: the data path's contract).
pub(crate) unsafe fn qp_of_dv<'a>(mqp: *mut mlx5dv_qp_ex) -> &'a Qp {
    let at = std::mem::offset_of!(Qp, dv);
    let q = mqp.cast::<u8>().wrapping_sub(at).cast::<Qp>();
    // SAFETY: the caller's contract: `mqp` lies `at` bytes into a live Qp.
    unsafe { &*q }
}

/// `mlx5dv_wr_set_dc_addr`: the current WR goes to DCT `dctn` at `ah`,
/// presenting `key`.
pub(crate) unsafe extern "C" fn wr_set_dc_addr(
    mqp: *mut mlx5dv_qp_ex,
    ah: *mut ibv_ah,
    dctn: u32,
    key: u64,
) {
    // SAFETY: forwarded from the data path's contract.
    unsafe { wr_set_dc_addr_stream(mqp, ah, dctn, key, 0) }
}

/// `mlx5dv_wr_set_dc_addr_stream`: as [`wr_set_dc_addr`], on DCI stream
/// `stream` (a DCI without streams has one: any id names it).
pub(crate) unsafe extern "C" fn wr_set_dc_addr_stream(
    mqp: *mut mlx5dv_qp_ex,
    ah: *mut ibv_ah,
    dctn: u32,
    key: u64,
    stream: u16,
) {
    if mqp.is_null() {
        return;
    }
    // SAFETY: forwarded from the data path's contract.
    let q = unsafe { qp_of_dv(mqp) };
    let dc = ah_of(ah).map(|a| verbs::dc::DcAv::new(&a.ah, dctn, key, stream));
    crate::qp_ex::set_dc(q, dc);
}

/// Whether `op` is one a DCI sends (libmlx5's
/// `MLX5_SUPPORTED_SEND_OPS_FLAGS_DCI`: RDMA write (with immediate),
/// send (with immediate), RDMA read, both atomics).
pub(crate) fn dci_sends(op: &SendOp) -> bool {
    matches!(
        op,
        SendOp::RdmaWrite { .. }
            | SendOp::RdmaWriteImm { .. }
            | SendOp::Send
            | SendOp::SendImm(_)
            | SendOp::RdmaRead { .. }
            | SendOp::AtomicCmpSwp { .. }
            | SendOp::AtomicFetchAdd { .. }
    )
}
