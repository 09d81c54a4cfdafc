//! Queue pairs: `ibv_create_qp(_ex)`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_destroy_qp` over `verbs::qp::Qp`. The QP sits behind a mutex (the
//! data path in `datapath` takes it per call, as libmlx5 takes its QP
//! spinlock), its CQs and SRQ count it as a user, and its last modified
//! attributes are kept for `ibv_query_qp`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use libc::c_int;
use verbs::qp::{QpAttr, QpCap, QpInitAttr, QpState, QpType};

use crate::abi::*;
use crate::device::CtxShared;
use crate::objects::{cq_of, lock, pd_of, srq_of, unuse, Cq, Pd, Srq};
use crate::qp_ex::DvOps;
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno, set_errno};

/// A queue pair.
#[repr(C)]
pub(crate) struct Qp {
    /// `ibv_qp_ex`, whose first field is the `ibv_qp`.
    pub c: ibv_qp_ex,
    pub qp: crate::spin::SpinLock<verbs::qp::Qp>,
    send_cq: *const Cq,
    recv_cq: *const Cq,
    srq: *const Srq,
    pd: *const Pd,
    shared: Arc<CtxShared>,
    attr: Mutex<ibv_qp_attr>,
    sq_sig_all: c_int,
    /// The `ibv_wr_*` batch under way.
    pub wr: Mutex<crate::qp_ex::WrState>,
    /// What `mlx5dv_qp_ex_from_ibv_qp_ex` returns: a DCI's DC address
    /// setters (`crate::dc`).
    pub dv: mlx5dv_qp_ex,
}

/// `ibv_qp_init_attr_ex.comp_mask` bits: `IBV_QP_INIT_ATTR_PD`,
/// `IBV_QP_INIT_ATTR_CREATE_FLAGS`, `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`.
pub(crate) const PD: u32 = 1 << 0;
pub(crate) const CREATE_FLAGS: u32 = 1 << 2;
pub(crate) const SEND_OPS_FLAGS: u32 = 1 << 6;

pub(crate) fn qp_type_of(t: c_int) -> Option<QpType> {
    match t {
        2 => Some(QpType::Rc),
        3 => Some(QpType::Uc),
        4 => Some(QpType::Ud),
        _ => None,
    }
}

pub(crate) fn state_of(s: c_int) -> Option<QpState> {
    Some(match s {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

fn cap_of(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn ibv_cap(c: QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

/// The `Qp` of a live `ibv_qp`, or `None` (errno EINVAL).
pub(crate) fn qp_of<'a>(p: *mut ibv_qp) -> Option<&'a Qp> {
    if !registry::is(p, Kind::Qp) {
        set_errno(libc::EINVAL);
        return None;
    }
    // SAFETY: the registry holds `p`: a live Qp box.
    Some(unsafe { &*(p as *const Qp) })
}

fn create(p: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, i32> {
    let qp_type = qp_type_of(a.qp_type).ok_or_else(|| {
        tracing::debug!("ibv_create_qp: QP type {} not offered", a.qp_type);
        libc::EOPNOTSUPP
    })?;
    // RC send WQEs with room for a memory-window bind, as libmlx5 makes
    // every RC QP (`ibv_bind_mw`, BIND_MW work requests).
    create_with(p, a, qp_type, DvOps::None, |pd, init| {
        pd.create_qp_for_mw(init)
    })
}

/// Makes the QP `make` creates on the PD, CQs and SRQ `a` names (`init`
/// gives it them, the transport `qp_type` and `a`'s capacities), and
/// its C object: `a.qp_type` is the type C sees (`IBV_QPT_DRIVER` for a
/// DCI), `dv` the builders of its `mlx5dv_qp_ex`.
pub(crate) fn create_with(
    p: *mut ibv_pd,
    a: &mut ibv_qp_init_attr,
    qp_type: QpType,
    dv: DvOps,
    make: impl FnOnce(&verbs::pd::Pd, &QpInitAttr<'_>) -> verbs::Result<verbs::qp::Qp>,
) -> Result<*mut ibv_qp, i32> {
    let pd = pd_of(p).ok_or(libc::EINVAL)?;
    let scq = cq_of(a.send_cq).ok_or(libc::EINVAL)?;
    let rcq = cq_of(a.recv_cq).ok_or(libc::EINVAL)?;
    let srq = if a.srq.is_null() {
        None
    } else {
        Some(srq_of(a.srq).ok_or(libc::EINVAL)?)
    };
    let sg = scq.cq.lock_control();
    let rg = if std::ptr::eq(scq, rcq) {
        None
    } else {
        Some(rcq.cq.lock_control())
    };
    let init = QpInitAttr {
        send_cq: &sg,
        recv_cq: rg.as_deref().unwrap_or(&sg),
        srq: srq.map(|s| &s.srq),
        cap: cap_of(&a.cap),
        qp_type,
        sq_sig_all: a.sq_sig_all != 0,
    };
    let qp = make(&pd.pd, &init).map_err(|e| crate::errno_of("ibv_create_qp", &e))?;
    drop((sg, rg));
    a.cap = ibv_cap(qp.cap());
    let qpn = qp.qp_num();
    for u in [&pd.users, &scq.users, &rcq.users] {
        u.fetch_add(1, Ordering::AcqRel);
    }
    if let Some(s) = srq {
        s.users.fetch_add(1, Ordering::AcqRel);
    }
    pd.shared.objects.fetch_add(1, Ordering::AcqRel);
    let attr = ibv_qp_attr {
        cap: a.cap,
        ..Default::default()
    };
    let b = Box::into_raw(Box::new(Qp {
        c: crate::qp_ex::qp_ex(ibv_qp {
            context: pd.c.context,
            qp_context: a.qp_context,
            pd: p,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: qpn,
            qp_num: qpn,
            state: 0,
            qp_type: a.qp_type,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        }),
        qp: crate::spin::SpinLock::new(qp),
        send_cq: scq,
        recv_cq: rcq,
        srq: srq.map_or(std::ptr::null(), |s| s as *const Srq),
        pd,
        shared: pd.shared.clone(),
        attr: Mutex::new(attr),
        sq_sig_all: a.sq_sig_all,
        wr: Mutex::default(),
        dv: crate::qp_ex::dv_qp_ex(dv),
    }));
    lock(&pd.shared.qps).insert(qpn, b as usize);
    registry::add(b, Kind::Qp);
    Ok(b.cast())
}

/// `ibv_create_qp`; `attr.cap` gets the capacities made.
#[no_mangle]
pub extern "C" fn ibv_create_qp(p: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { &mut *attr };
    let r = if a.qp_type == crate::raw::IBV_QPT_RAW_PACKET {
        crate::raw::create(p, a)
    } else {
        create(p, a)
    };
    match r {
        Ok(q) => q,
        Err(e) => null_errno(e),
    }
}

/// `verbs_context.create_qp_ex` (`ibv_create_qp_ex`): the PD form, with
/// the send operations `qp_ex` offers; XRC, RSS and create flags other
/// than `BLOCK_SELF_MCAST_LB` are `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn create_qp_ex(
    _c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if attr.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { &mut *attr };
    if a.comp_mask & PD == 0 {
        return null_errno(libc::EINVAL);
    }
    // An RSS raw packet QP: an indirection table and a hash.
    const IND_TABLE: u32 = 1 << 4;
    const RX_HASH: u32 = 1 << 5;
    if a.comp_mask & (IND_TABLE | RX_HASH) != 0 {
        let both = a.comp_mask & (IND_TABLE | RX_HASH) == IND_TABLE | RX_HASH;
        let flags = a.comp_mask & CREATE_FLAGS == 0 || a.create_flags == 0;
        if !both
            || !flags
            || a.qp_type != crate::raw::IBV_QPT_RAW_PACKET
            || a.comp_mask & !(PD | CREATE_FLAGS | IND_TABLE | RX_HASH) != 0
        {
            return null_errno(libc::EINVAL);
        }
        return match crate::rss::create_rss_qp(a) {
            Ok(q) => q,
            Err(e) => null_errno(e),
        };
    }
    const BLOCK_SELF_MCAST_LB: u32 = 1 << 1;
    if a.comp_mask & !(PD | CREATE_FLAGS | SEND_OPS_FLAGS) != 0
        // BLOCK_SELF_MCAST_LB holds trivially: there is no multicast.
        || (a.comp_mask & CREATE_FLAGS != 0 && a.create_flags & !BLOCK_SELF_MCAST_LB != 0)
        || (a.comp_mask & SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !crate::qp_ex::SEND_OPS_SUPPORTED != 0)
    {
        tracing::debug!(
            "ibv_create_qp_ex: comp_mask {:#x} create_flags {:#x} send_ops_flags {:#x} not offered",
            a.comp_mask,
            a.create_flags,
            a.send_ops_flags
        );
        return null_errno(libc::EOPNOTSUPP);
    }
    if a.qp_type == crate::raw::IBV_QPT_RAW_PACKET && a.comp_mask & SEND_OPS_FLAGS != 0 {
        tracing::debug!("ibv_create_qp_ex: the ibv_wr_* API on a raw packet QP is not offered");
        return null_errno(libc::EOPNOTSUPP);
    }
    let mut base = base_of(a);
    let q = ibv_create_qp(a.pd, &mut base);
    a.cap = base.cap;
    q
}

/// The `ibv_qp_init_attr` of an `ibv_qp_init_attr_ex` (its PD aside).
pub(crate) fn base_of(a: &ibv_qp_init_attr_ex) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    }
}

/// `mlx5dv_create_qp` of an RC, UC or UD QP with `mlx5dv_qp_create_flags`
/// (scatter to CQE disabled or allowed: `verbs::scatter_cqe::dv_flags`)
/// and, on RC, the mkey builders (`mkey`: mlx5dv send operations asked).
pub(crate) fn create_dv(
    a: &mut ibv_qp_init_attr_ex,
    flags: u32,
    mkey: bool,
) -> Result<*mut ibv_qp, i32> {
    if a.comp_mask & PD == 0 {
        return Err(libc::EINVAL);
    }
    if a.comp_mask & !(PD | SEND_OPS_FLAGS) != 0
        || (a.comp_mask & SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !crate::qp_ex::SEND_OPS_SUPPORTED != 0)
    {
        return Err(libc::EOPNOTSUPP);
    }
    let qp_type = qp_type_of(a.qp_type).ok_or(libc::EOPNOTSUPP)?;
    if mkey && qp_type != QpType::Rc {
        return Err(libc::EOPNOTSUPP);
    }
    let mut base = base_of(a);
    let dv = if mkey { DvOps::Mkey } else { DvOps::None };
    let q = create_with(a.pd, &mut base, qp_type, dv, |pd, init| {
        pd.create_qp_dv(init, flags)
    })?;
    a.cap = base.cap;
    Ok(q)
}

fn attr_of(a: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, i32> {
    use verbs::qp::attr_mask as m;
    let mask = mask as u32;
    let av = if mask & m::AV != 0 {
        crate::objects::ah_attr_of(&a.ah_attr)?
    } else {
        Default::default()
    };
    Ok(QpAttr {
        qp_state: if mask & m::STATE != 0 {
            Some(state_of(a.qp_state).ok_or(libc::EINVAL)?)
        } else {
            None
        },
        cur_qp_state: if mask & m::CUR_STATE != 0 {
            Some(state_of(a.cur_qp_state).ok_or(libc::EINVAL)?)
        } else {
            None
        },
        path_mtu: a.path_mtu as u8,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags,
        ah_attr: av,
        pkey_index: a.pkey_index,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    })
}

/// Copies the fields `mask` names from `a` into the kept attributes.
fn merge(kept: &mut ibv_qp_attr, a: &ibv_qp_attr, mask: u32) {
    use verbs::qp::attr_mask as m;
    let cap = kept.cap;
    let state = kept.qp_state;
    let old = *kept;
    *kept = *a;
    kept.cap = cap;
    kept.qp_state = state;
    let keep = |bit: u32| mask & bit == 0;
    if keep(m::PATH_MTU) {
        kept.path_mtu = old.path_mtu;
    }
    if keep(m::QKEY) {
        kept.qkey = old.qkey;
    }
    if keep(m::RQ_PSN) {
        kept.rq_psn = old.rq_psn;
    }
    if keep(m::SQ_PSN) {
        kept.sq_psn = old.sq_psn;
    }
    if keep(m::DEST_QPN) {
        kept.dest_qp_num = old.dest_qp_num;
    }
    if keep(m::ACCESS_FLAGS) {
        kept.qp_access_flags = old.qp_access_flags;
    }
    if keep(m::AV) {
        kept.ah_attr = old.ah_attr;
    }
    if keep(m::PKEY_INDEX) {
        kept.pkey_index = old.pkey_index;
    }
    if keep(m::MAX_QP_RD_ATOMIC) {
        kept.max_rd_atomic = old.max_rd_atomic;
    }
    if keep(m::MAX_DEST_RD_ATOMIC) {
        kept.max_dest_rd_atomic = old.max_dest_rd_atomic;
    }
    if keep(m::MIN_RNR_TIMER) {
        kept.min_rnr_timer = old.min_rnr_timer;
    }
    if keep(m::PORT) {
        kept.port_num = old.port_num;
    }
    if keep(m::TIMEOUT) {
        kept.timeout = old.timeout;
    }
    if keep(m::RETRY_CNT) {
        kept.retry_cnt = old.retry_cnt;
    }
    if keep(m::RNR_RETRY) {
        kept.rnr_retry = old.rnr_retry;
    }
}

/// `ibv_modify_qp`: 0 or an errno.
#[no_mangle]
pub extern "C" fn ibv_modify_qp(p: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    if attr.is_null() {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let a = unsafe { &*attr };
    if crate::dc::is_dct(p) {
        return crate::dc::modify_dct(p, a, mask);
    }
    if let Some(q) = crate::raw::raw_of(p) {
        return crate::raw::modify(p, q, a, mask);
    }
    if let Some(q) = crate::rss::rss_of(p) {
        return crate::rss::modify_rss(p, q, a, mask);
    }
    let Some(q) = qp_of(p) else {
        return libc::EINVAL;
    };
    let va = match attr_of(a, mask) {
        Ok(v) => v,
        Err(e) => return ret_errno(e),
    };
    let mut g = q.qp.lock_control();
    if let Err(e) = g.modify(&va, mask as u32) {
        return ret_errno(crate::errno_of("ibv_modify_qp", &e));
    }
    let state = g.state() as c_int;
    drop(g);
    let mut kept = lock(&q.attr);
    merge(&mut kept, a, mask as u32);
    kept.qp_state = state;
    // SAFETY: `state` of the live QP's C struct, written under no lock
    // the C side would take (libibverbs writes it the same way).
    unsafe { (*p).state = state };
    0
}

/// `ibv_query_qp`: the current state and the attributes last set.
#[no_mangle]
pub extern "C" fn ibv_query_qp(
    p: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    if attr.is_null() || init.is_null() {
        return ret_errno(libc::EINVAL);
    }
    if crate::dc::is_dct(p) {
        // SAFETY: the caller's out attributes, non-NULL.
        crate::dc::query_dct(p, unsafe { &mut *attr }, unsafe { &mut *init });
        return 0;
    }
    if let Some(q) = crate::raw::raw_of(p) {
        // SAFETY: the caller's out attributes, non-NULL.
        crate::raw::query(q, unsafe { &mut *attr }, unsafe { &mut *init });
        return 0;
    }
    if let Some(q) = crate::rss::rss_of(p) {
        // SAFETY: the caller's out attributes, non-NULL.
        crate::rss::query_rss(q, unsafe { &mut *attr }, unsafe { &mut *init });
        return 0;
    }
    let Some(q) = qp_of(p) else {
        return libc::EINVAL;
    };
    let state = q.qp.lock_control().state() as c_int;
    let mut a = *lock(&q.attr);
    a.qp_state = state;
    a.cur_qp_state = state;
    let i = ibv_qp_init_attr {
        qp_context: q.c.qp_base.qp_context,
        send_cq: q.c.qp_base.send_cq,
        recv_cq: q.c.qp_base.recv_cq,
        srq: q.c.qp_base.srq,
        cap: a.cap,
        qp_type: q.c.qp_base.qp_type,
        sq_sig_all: q.sq_sig_all,
    };
    // SAFETY: the caller's out attributes, non-NULL.
    unsafe { attr.write(a) };
    // SAFETY: the caller's out init attributes, non-NULL.
    unsafe { init.write(i) };
    0
}

/// `ibv_destroy_qp`.
#[no_mangle]
pub extern "C" fn ibv_destroy_qp(p: *mut ibv_qp) -> c_int {
    if crate::dc::is_dct(p) {
        return crate::dc::destroy_dct(p);
    }
    if crate::raw::raw_of(p).is_some() {
        return crate::raw::destroy(p);
    }
    if crate::rss::rss_of(p).is_some() {
        return crate::rss::destroy_rss(p);
    }
    if !registry::remove(p, Kind::Qp) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut Qp) };
    lock(&b.shared.qps).remove(&b.c.qp_base.qp_num);
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let qp = b.qp.into_inner();
    let r = qp.destroy();
    // SAFETY: the CQs and PD are not destroyed while the QP counts on them.
    let scq = unsafe { &*b.send_cq };
    // SAFETY: as above.
    let rcq = unsafe { &*b.recv_cq };
    // SAFETY: as above.
    let pd = unsafe { &*b.pd };
    for u in [&scq.users, &rcq.users, &pd.users] {
        unuse(u);
    }
    if !b.srq.is_null() {
        // SAFETY: as above.
        unuse(unsafe { &(*b.srq).users });
    }
    match r {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_destroy_qp", &e)),
    }
}

/// `ibv_qp_to_qp_ex`: every QP of this library has its `ibv_qp_ex`.
#[no_mangle]
pub extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    if qp_of(qp).is_none() {
        return std::ptr::null_mut();
    }
    qp.cast()
}
