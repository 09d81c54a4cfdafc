//! Receive-side scaling through C: `ibv_create_wq` / `ibv_modify_wq` /
//! `ibv_destroy_wq` and `ibv_post_wq_recv` (receive work queues),
//! `ibv_create_rwq_ind_table` / `ibv_destroy_rwq_ind_table`, and the RSS
//! raw packet QP (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_IND_TABLE` and
//! `IBV_QP_INIT_ATTR_RX_HASH`), which flow rules steer to: the way DPDK's
//! mlx5 PMD spreads its receive queues through verbs.
//!
//! A WQ is the driver's work queue polled through its verbs CQ
//! (`verbs::rss`): its receive completions come out of `ibv_poll_cq`
//! beside any other queue's (their `qp_num` the flow tag, 0, as libmlx5
//! reports). Its queue is ready from creation; the state verbs sees moves
//! RESET -> RDY -> ERR / RESET as `ibv_modify_wq` asks, and a receive is
//! refused in RESET. The RSS QP hashes with Toeplitz under the caller's
//! 40-byte key over the `rx_hash_fields_mask` fields; it receives only
//! (posts are EINVAL) and is destroyed only without flow rules (EBUSY), as
//! a table is only without RSS QPs and a WQ only without tables.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use libc::c_int;
use verbs::qp::MAX_SGE;
use verbs::rss::{RssQp as DrvRss, RwqIndTable, RxHashConf, Wq, WqCap, RSS_KEY_LEN};

use crate::abi::*;
use crate::async_event::CtxShared;
use crate::device::{checked_ctx, ctx_of};
use crate::objects::{cq_of, lock, pd_of, unuse, Cq, Pd};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno};

/// `IBV_WQT_RQ`.
const WQT_RQ: c_int = 0;
/// `enum ibv_wq_state`.
const WQS_RESET: c_int = 0;
const WQS_RDY: c_int = 1;
const WQS_ERR: c_int = 2;
/// `IBV_WQ_ATTR_STATE`, `IBV_WQ_ATTR_CURR_STATE`.
const WQ_ATTR_STATE: u32 = 1 << 0;
const WQ_ATTR_CURR_STATE: u32 = 1 << 1;
/// `IBV_RX_HASH_FUNC_TOEPLITZ`.
const HASH_TOEPLITZ: u8 = 1;
/// The most WRs a WQ takes (the driver's rings are at most 2^15).
const MAX_WR: u32 = 1 << 15;

/// A receive work queue: its `ibv_wq` first.
#[repr(C)]
pub(crate) struct CWq {
    pub c: ibv_wq,
    wq: Mutex<Wq>,
    cq: *const Cq,
    pd: *const Pd,
    shared: Arc<CtxShared>,
    /// Indirection tables listing it.
    tables: AtomicUsize,
}

/// An indirection table: its `ibv_rwq_ind_table` first.
#[repr(C)]
struct CTable {
    c: ibv_rwq_ind_table,
    table: Option<RwqIndTable>,
    wqs: Vec<*const CWq>,
    shared: Arc<CtxShared>,
    /// RSS QPs over it.
    qps: AtomicUsize,
}

/// An RSS raw packet QP: its `ibv_qp` first.
#[repr(C)]
pub(crate) struct CRss {
    pub c: ibv_qp,
    pub rss: DrvRss,
    table: *const CTable,
    pd: *const Pd,
    shared: Arc<CtxShared>,
    state: Mutex<ibv_qp_attr>,
    /// Flow rules steering to it.
    pub flows: AtomicUsize,
}

fn wq_of<'a>(p: *mut ibv_wq) -> Option<&'a CWq> {
    if !registry::is(p, Kind::Wq) {
        return None;
    }
    // SAFETY: the registry holds `p`: a live CWq box, `c` its first field.
    Some(unsafe { &*(p as *const CWq) })
}

/// The RSS QP of a live `ibv_qp`, if it is one.
pub(crate) fn rss_of<'a>(p: *mut ibv_qp) -> Option<&'a CRss> {
    if !registry::is(p, Kind::RssQp) {
        return None;
    }
    // SAFETY: the registry holds `p`: a live CRss box, `c` its first field.
    Some(unsafe { &*(p as *const CRss) })
}

/// `verbs_context.create_wq` (`ibv_create_wq`): an RQ-type WQ on the
/// attributes' PD and CQ (up to 2^15 WRs and `MAX_SGE` SGEs; no flags).
pub(crate) unsafe extern "C" fn create_wq(
    c: *mut ibv_context,
    a: *mut ibv_wq_init_attr,
) -> *mut ibv_wq {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    if a.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let at = unsafe { &mut *a };
    if at.wq_type != WQT_RQ || at.comp_mask != 0 || at.create_flags != 0 {
        tracing::debug!(
            "ibv_create_wq: type {}, flags {:#x}",
            at.wq_type,
            at.create_flags
        );
        return null_errno(libc::EOPNOTSUPP);
    }
    let (Some(pd), Some(cq)) = (pd_of(at.pd), cq_of(at.cq)) else {
        return null_errno(libc::EINVAL);
    };
    if at.max_wr == 0 || at.max_wr > MAX_WR || at.max_sge as usize > MAX_SGE {
        return null_errno(libc::EINVAL);
    }
    let sges = (at.max_sge as usize).max(1).next_power_of_two();
    let cap = WqCap {
        log_wqes: at.max_wr.next_power_of_two().trailing_zeros() as u8,
        strip_vlan: false,
    };
    let g = cq.cq.lock_control();
    let wq = match ctx.vc.create_wq_polled(&pd.pd, &g, cap, sges) {
        Ok(w) => w,
        Err(e) => return null_errno(crate::errno_of("ibv_create_wq", &e)),
    };
    drop(g);
    at.max_wr = 1 << cap.log_wqes;
    at.max_sge = sges as u32;
    for u in [&pd.users, &cq.users] {
        u.fetch_add(1, Ordering::AcqRel);
    }
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let wqn = wq.wqn();
    let b = Box::into_raw(Box::new(CWq {
        c: ibv_wq {
            context: c,
            wq_context: at.wq_context,
            pd: at.pd,
            cq: at.cq,
            wq_num: wqn,
            handle: wqn,
            state: WQS_RESET,
            wq_type: WQT_RQ,
            post_recv: Some(post_wq_recv),
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
            comp_mask: 0,
        },
        wq: Mutex::new(wq),
        cq,
        pd,
        shared: ctx.shared.clone(),
        tables: AtomicUsize::new(0),
    }));
    registry::add(b, Kind::Wq);
    b.cast()
}

/// `verbs_context.modify_wq` (`ibv_modify_wq`): the state verbs sees
/// (RESET, RDY, ERR; `curr_wq_state` must be the current one if given);
/// no flags.
pub(crate) unsafe extern "C" fn modify_wq(p: *mut ibv_wq, a: *mut ibv_wq_attr) -> c_int {
    let Some(w) = wq_of(p) else {
        return libc::EINVAL;
    };
    if a.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's attributes, non-NULL.
    let at = unsafe { *a };
    if at.attr_mask & !(WQ_ATTR_STATE | WQ_ATTR_CURR_STATE) != 0 {
        return libc::EOPNOTSUPP;
    }
    let _g = lock(&w.wq);
    let cur = w.c.state;
    if at.attr_mask & WQ_ATTR_CURR_STATE != 0 && at.curr_wq_state != cur {
        return libc::EINVAL;
    }
    if at.attr_mask & WQ_ATTR_STATE != 0 {
        if !matches!(at.wq_state, WQS_RESET | WQS_RDY | WQS_ERR) {
            return libc::EINVAL;
        }
        // SAFETY: `state` of the live WQ, written under its lock.
        unsafe { (*p).state = at.wq_state };
    }
    0
}

/// `verbs_context.destroy_wq` (`ibv_destroy_wq`): EBUSY while a table
/// lists it.
pub(crate) unsafe extern "C" fn destroy_wq(p: *mut ibv_wq) -> c_int {
    let Some(w) = wq_of(p) else {
        return libc::EINVAL;
    };
    if w.tables.load(Ordering::Acquire) > 0 {
        return libc::EBUSY;
    }
    if !registry::remove(p, Kind::Wq) {
        return libc::EINVAL;
    }
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut CWq) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let r =
        b.wq.into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .destroy();
    // SAFETY: the CQ and PD are not destroyed while the WQ counts on them.
    unuse(unsafe { &(*b.cq).users });
    // SAFETY: as above.
    unuse(unsafe { &(*b.pd).users });
    match r {
        Ok(()) => 0,
        Err(e) => crate::errno_of("ibv_destroy_wq", &e),
    }
}

/// `ibv_wq.post_recv` (`ibv_post_wq_recv`): each WR one receive WQE of its
/// SGEs; EINVAL in RESET, ENOMEM when the ring is full.
unsafe extern "C" fn post_wq_recv(
    p: *mut ibv_wq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    let fail = |at: *mut ibv_recv_wr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: the caller's out pointer, non-NULL.
            unsafe { *bad = at };
        }
        e
    };
    let Some(w) = wq_of(p) else {
        return fail(wr, libc::EINVAL);
    };
    let mut g = lock(&w.wq);
    if w.c.state == WQS_RESET {
        return fail(wr, libc::EINVAL);
    }
    // SAFETY: the caller's WR list and buffers (ibv_post_wq_recv's
    // contract).
    match unsafe { crate::raw::post_eth_recv(wr, |bufs, wr_id| g.post_recv_wr(bufs, wr_id)) } {
        Ok(()) => 0,
        Err((at, e)) => fail(at, e),
    }
}

/// `verbs_context.create_rwq_ind_table` (`ibv_create_rwq_ind_table`):
/// 2^`log_ind_tbl_size` WQs of this context as one table.
pub(crate) unsafe extern "C" fn create_rwq_ind_table(
    c: *mut ibv_context,
    a: *mut ibv_rwq_ind_table_init_attr,
) -> *mut ibv_rwq_ind_table {
    let Some(ctx) = checked_ctx(c) else {
        return std::ptr::null_mut();
    };
    if a.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let at = unsafe { *a };
    if at.comp_mask != 0 || at.log_ind_tbl_size > 16 || at.ind_tbl.is_null() {
        return null_errno(libc::EINVAL);
    }
    let n = 1usize << at.log_ind_tbl_size;
    let mut ws = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller's table of 2^log entries.
        let p = unsafe { at.ind_tbl.wrapping_add(i).read() };
        match wq_of(p) {
            Some(w) if w.c.context == c => ws.push(w),
            _ => return null_errno(libc::EINVAL),
        }
    }
    let guards: Vec<_> = ws.iter().map(|w| lock(&w.wq)).collect();
    let refs: Vec<&Wq> = guards.iter().map(|g| &**g).collect();
    let r = ctx.vc.create_rwq_ind_table(&refs);
    drop(guards);
    let table = match r {
        Ok(t) => t,
        Err(e) => return null_errno(crate::errno_of("ibv_create_rwq_ind_table", &e)),
    };
    for w in &ws {
        w.tables.fetch_add(1, Ordering::AcqRel);
    }
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let num = table.rqtn() as c_int;
    let b = Box::into_raw(Box::new(CTable {
        c: ibv_rwq_ind_table {
            context: c,
            ind_tbl_handle: num,
            ind_tbl_num: num,
            comp_mask: 0,
        },
        table: Some(table),
        wqs: ws.iter().map(|w| *w as *const CWq).collect(),
        shared: ctx.shared.clone(),
        qps: AtomicUsize::new(0),
    }));
    registry::add(b, Kind::IndTable);
    b.cast()
}

/// `verbs_context.destroy_rwq_ind_table`: EBUSY while an RSS QP uses it.
pub(crate) unsafe extern "C" fn destroy_rwq_ind_table(p: *mut ibv_rwq_ind_table) -> c_int {
    if !registry::is(p, Kind::IndTable) {
        return libc::EINVAL;
    }
    // SAFETY: live (the registry holds it).
    if unsafe { (*(p as *const CTable)).qps.load(Ordering::Acquire) } > 0 {
        return libc::EBUSY;
    }
    registry::remove(p, Kind::IndTable);
    // SAFETY: was live; the box is taken back once.
    let mut b = unsafe { Box::from_raw(p as *mut CTable) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let r = b.table.take().map_or(Ok(()), RwqIndTable::destroy);
    for w in &b.wqs {
        // SAFETY: a WQ is not destroyed while a table lists it.
        unuse(unsafe { &(**w).tables });
    }
    match r {
        Ok(()) => 0,
        Err(e) => crate::errno_of("ibv_destroy_rwq_ind_table", &e),
    }
}

/// `ibv_create_qp_ex` of an RSS raw packet QP (the caller checked the
/// type and that the table and hash are asked for): Toeplitz with a
/// 40-byte key over the table, no send or receive queue of its own.
pub(crate) fn create_rss_qp(a: &mut ibv_qp_init_attr_ex) -> Result<*mut ibv_qp, c_int> {
    let pd = pd_of(a.pd).ok_or(libc::EINVAL)?;
    let tp = a.rwq_ind_tbl as *mut ibv_rwq_ind_table;
    if !registry::is(tp, Kind::IndTable) {
        return Err(libc::EINVAL);
    }
    // SAFETY: live (the registry holds it).
    let t = unsafe { &*(tp as *const CTable) };
    let h = a.rx_hash_conf;
    if h.rx_hash_function != HASH_TOEPLITZ
        || usize::from(h.rx_hash_key_len) != RSS_KEY_LEN
        || h.rx_hash_key.is_null()
        || h.rx_hash_fields_mask >> 32 != 0
    {
        tracing::debug!("ibv_create_qp_ex(RSS): Toeplitz with a 40-byte key only");
        return Err(libc::EINVAL);
    }
    if a.cap.max_send_wr != 0 || a.cap.max_recv_wr != 0 || !a.srq.is_null() {
        return Err(libc::EINVAL);
    }
    let mut key = [0u8; RSS_KEY_LEN];
    // SAFETY: the caller's key of `rx_hash_key_len` (40) bytes.
    key.copy_from_slice(unsafe { std::slice::from_raw_parts(h.rx_hash_key, RSS_KEY_LEN) });
    // SAFETY: the PD's context is this library's.
    let ctx = unsafe { ctx_of(pd.c.context) };
    let Some(table) = t.table.as_ref() else {
        return Err(libc::EINVAL);
    };
    let conf = RxHashConf {
        table,
        key,
        fields: h.rx_hash_fields_mask as u32,
    };
    let rss = ctx
        .vc
        .create_rss_qp(&conf)
        .map_err(|e| crate::errno_of("ibv_create_qp_ex(RSS)", &e))?;
    t.qps.fetch_add(1, Ordering::AcqRel);
    pd.users.fetch_add(1, Ordering::AcqRel);
    pd.shared.objects.fetch_add(1, Ordering::AcqRel);
    let num = rss.tirn();
    let b = Box::into_raw(Box::new(CRss {
        c: ibv_qp {
            context: pd.c.context,
            qp_context: a.qp_context,
            pd: a.pd,
            send_cq: std::ptr::null_mut(),
            recv_cq: std::ptr::null_mut(),
            srq: std::ptr::null_mut(),
            handle: num,
            qp_num: num,
            state: 0,
            qp_type: crate::raw::IBV_QPT_RAW_PACKET,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        },
        rss,
        table: t,
        pd,
        shared: pd.shared.clone(),
        state: Mutex::new(ibv_qp_attr::default()),
        flows: AtomicUsize::new(0),
    }));
    registry::add(b, Kind::RssQp);
    Ok(b.cast())
}

impl CRss {
    /// Its context's shared state.
    pub(crate) fn shared_of(&self) -> Arc<CtxShared> {
        self.shared.clone()
    }
}

/// `ibv_modify_qp` of an RSS QP: the state verbs sees (its TIR needs
/// none).
pub(crate) fn modify_rss(p: *mut ibv_qp, q: &CRss, a: &ibv_qp_attr, mask: c_int) -> c_int {
    let mut st = lock(&q.state);
    if mask & 1 != 0 {
        st.qp_state = a.qp_state;
        st.cur_qp_state = a.qp_state;
        // SAFETY: `state` of the live QP's C struct, `p`.
        unsafe { (*p).state = a.qp_state };
    }
    0
}

/// `ibv_query_qp` of an RSS QP.
pub(crate) fn query_rss(q: &CRss, attr: &mut ibv_qp_attr, init: &mut ibv_qp_init_attr) {
    *attr = *lock(&q.state);
    *init = ibv_qp_init_attr {
        qp_context: q.c.qp_context,
        send_cq: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        cap: ibv_qp_cap::default(),
        qp_type: crate::raw::IBV_QPT_RAW_PACKET,
        sq_sig_all: 0,
    };
}

/// `ibv_destroy_qp` of an RSS QP: EBUSY while flow rules steer to it.
pub(crate) fn destroy_rss(p: *mut ibv_qp) -> c_int {
    let Some(q) = rss_of(p) else {
        return ret_errno(libc::EINVAL);
    };
    if q.flows.load(Ordering::Acquire) > 0 {
        return ret_errno(libc::EBUSY);
    }
    registry::remove(p, Kind::RssQp);
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut CRss) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let r = b.rss.destroy();
    // SAFETY: the table and PD are not destroyed while the QP counts on
    // them.
    unuse(unsafe { &(*b.table).qps });
    // SAFETY: as above.
    unuse(unsafe { &(*b.pd).users });
    match r {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_destroy_qp(RSS)", &e)),
    }
}
