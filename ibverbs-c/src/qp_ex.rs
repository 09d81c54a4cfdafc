//! `ibv_qp_ex`: the `ibv_wr_*` batch API (`wr_start`, an operation, its
//! data, ... `wr_complete`), which the header's inline functions call
//! through the QP's function pointers, and perftest uses by default.
//!
//! Each WR is written when its data is set (`wr_set_sge`,
//! `wr_set_sge_list`, `wr_set_inline_data(_list)`; at once for
//! `wr_local_inv`) with `Qp::post_send_deferred`; `wr_complete` rings once,
//! or, if any WR of the batch failed, winds the ring back to where
//! `wr_start` found it and returns that WR's errno (`wr_abort` winds back
//! too). A UD WR takes its address from `wr_set_ud_addr`, which comes
//! before the data setter. `wr_bind_mw` is a whole WR (a type-2 window's
//! bind, as `ibv_post_send`'s BIND_MW). TSO, XRC and atomic writes are
//! `EOPNOTSUPP` at `wr_complete`.

use std::mem::MaybeUninit;

use libc::{c_int, c_void};
use verbs::mr::Sge;
use verbs::qp::{Payload, SendOp, SendWr, UdDest, MAX_INLINE, MAX_SGE};

use crate::abi::*;
use crate::objects::{ah_of, lock};
use crate::qp::Qp;

/// The `IBV_QP_EX_WITH_*` operations offered: RDMA write (with
/// immediate), send (with immediate), RDMA read, both atomics, local
/// invalidate, memory-window bind, send with invalidate.
pub(crate) const SEND_OPS_SUPPORTED: u64 = 0x7f | (1 << 7) | (1 << 8) | (1 << 9);

/// The `IBV_QP_EX_WITH_*` operations a DCI offers (libmlx5's
/// `MLX5_SUPPORTED_SEND_OPS_FLAGS_DCI`): RDMA write (with immediate),
/// send (with immediate), RDMA read, both atomics.
pub(crate) const SEND_OPS_DCI: u64 = 0x7f;

/// The batch under way on one QP.
#[derive(Debug, Default)]
pub(crate) struct WrState {
    op: Option<SendOp>,
    wr_id: u64,
    flags: u32,
    ud: Option<(usize, u32, u32)>,
    /// A DCI's target for the current WR (`mlx5dv_wr_set_dc_addr`), or
    /// `Some(None)` when it named no live AH.
    dc: Option<Option<verbs::dc::DcAv>>,
    /// An mkey configuration waiting for its setters (`crate::mkey`).
    carry: verbs::wr::WrCarry,
    /// The first failure of the batch (an errno).
    err: c_int,
    start_pc: u32,
}

impl WrState {
    /// Records a failure of the batch (the first one counts).
    pub(crate) fn fail(&mut self, e: c_int) {
        if self.err == 0 {
            self.err = e;
        }
    }

    /// Where the batch began in the send ring.
    pub(crate) fn start_pc(&self) -> u32 {
        self.start_pc
    }

    /// What the last mkey step left (`crate::mkey`).
    pub(crate) fn take_carry(&mut self) -> verbs::wr::WrCarry {
        std::mem::take(&mut self.carry)
    }

    /// What this mkey step leaves for the next.
    pub(crate) fn put_carry(&mut self, c: verbs::wr::WrCarry) {
        self.carry = c;
    }

    /// A WR other than an mkey setter begins: a configuration still
    /// waiting for setters fails the batch (libmlx5's EINVAL).
    fn end_mkey(&mut self) {
        if self.take_carry().mkey_pending() {
            self.fail(libc::EINVAL);
        }
    }
}

/// Which `mlx5dv_qp_ex` builders a QP has, as libmlx5 fills them: a
/// DCI's DC address setters, or an RC QP's mkey builders (made with
/// mlx5dv send operations).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DvOps {
    /// None (a QP made by plain verbs).
    None,
    /// `wr_set_dc_addr[_stream]`.
    Dc,
    /// `wr_mkey_configure`, its setters, `wr_mr_list`, `wr_mr_interleaved`.
    Mkey,
}

/// The `mlx5dv_qp_ex` of a QP with `ops` (the rest NULL: raw WQEs, memcpy,
/// signature and crypto are not offered).
pub(crate) fn dv_qp_ex(ops: DvOps) -> mlx5dv_qp_ex {
    let dc = ops == DvOps::Dc;
    let mk = ops == DvOps::Mkey;
    mlx5dv_qp_ex {
        comp_mask: 0,
        wr_set_dc_addr: dc.then_some(crate::dc::wr_set_dc_addr as _),
        wr_mr_interleaved: mk.then_some(crate::mkey::wr_mr_interleaved as _),
        wr_mr_list: mk.then_some(crate::mkey::wr_mr_list as _),
        wr_mkey_configure: mk.then_some(crate::mkey::wr_mkey_configure as _),
        wr_set_mkey_access_flags: mk.then_some(crate::mkey::wr_set_mkey_access_flags as _),
        wr_set_mkey_layout_list: mk.then_some(crate::mkey::wr_set_mkey_layout_list as _),
        wr_set_mkey_layout_interleaved: mk
            .then_some(crate::mkey::wr_set_mkey_layout_interleaved as _),
        wr_set_mkey_sig_block: None,
        wr_raw_wqe: None,
        wr_set_dc_addr_stream: dc.then_some(crate::dc::wr_set_dc_addr_stream as _),
        wr_memcpy: None,
        wr_set_mkey_crypto: None,
    }
}

/// The `ibv_qp_ex` of a new QP, its `wr_*` pointers filled.
pub(crate) fn qp_ex(base: ibv_qp) -> ibv_qp_ex {
    ibv_qp_ex {
        qp_base: base,
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        wr_atomic_cmp_swp: Some(wr_atomic_cmp_swp),
        wr_atomic_fetch_add: Some(wr_atomic_fetch_add),
        wr_bind_mw: Some(wr_bind_mw),
        wr_local_inv: Some(wr_local_inv),
        wr_rdma_read: Some(wr_rdma_read),
        wr_rdma_write: Some(wr_rdma_write),
        wr_rdma_write_imm: Some(wr_rdma_write_imm),
        wr_send: Some(wr_send),
        wr_send_imm: Some(wr_send_imm),
        wr_send_inv: Some(wr_send_inv),
        wr_send_tso: Some(wr_send_tso),
        wr_set_ud_addr: Some(wr_set_ud_addr),
        wr_set_xrc_srqn: Some(wr_set_xrc_srqn),
        wr_set_inline_data: Some(wr_set_inline_data),
        wr_set_inline_data_list: Some(wr_set_inline_data_list),
        wr_set_sge: Some(wr_set_sge),
        wr_set_sge_list: Some(wr_set_sge_list),
        wr_start: Some(wr_start),
        wr_complete: Some(wr_complete),
        wr_abort: Some(wr_abort),
        wr_atomic_write: Some(wr_atomic_write),
    }
}

/// The QP of `qpx`, or `None` for NULL.
fn qp<'a>(qpx: *mut ibv_qp_ex) -> Option<&'a Qp> {
    if qpx.is_null() {
        return None;
    }
    // SAFETY: an ibv_qp_ex of this library (the data path's contract) is
    // the first field of its Qp box.
    Some(unsafe { &*(qpx as *const Qp) })
}

unsafe extern "C" fn wr_start(qpx: *mut ibv_qp_ex) {
    let Some(q) = qp(qpx) else { return };
    let pc = q.qp.lock().send_ring().pc();
    *lock(&q.wr) = WrState {
        start_pc: pc,
        ..Default::default()
    };
}

unsafe extern "C" fn wr_complete(qpx: *mut ibv_qp_ex) -> c_int {
    let Some(q) = qp(qpx) else {
        return libc::EINVAL;
    };
    let mut st = lock(&q.wr);
    st.end_mkey();
    let mut g = q.qp.lock();
    if st.err != 0 {
        g.send_ring().rewind(st.start_pc);
        return std::mem::take(&mut st.err);
    }
    g.ring_send();
    0
}

unsafe extern "C" fn wr_abort(qpx: *mut ibv_qp_ex) {
    let Some(q) = qp(qpx) else { return };
    let mut st = lock(&q.wr);
    q.qp.lock().send_ring().rewind(st.start_pc);
    st.err = 0;
    st.op = None;
    st.take_carry();
}

/// Records operation `op` with the WR id and flags the caller set.
fn set_op(qpx: *mut ibv_qp_ex, op: SendOp) {
    let Some(q) = qp(qpx) else { return };
    let mut st = lock(&q.wr);
    st.end_mkey();
    st.op = Some(op);
    st.wr_id = q.c.wr_id;
    st.flags = q.c.wr_flags & 0x7;
    st.ud = None;
    st.dc = None;
}

/// A DCI's target for the current WR (`crate::dc`'s
/// `mlx5dv_wr_set_dc_addr`): `None` for an AH that is not live.
pub(crate) fn set_dc(q: &Qp, dc: Option<verbs::dc::DcAv>) {
    lock(&q.wr).dc = Some(dc);
}

/// Records a failure of the batch (the first one counts).
fn fail(qpx: *mut ibv_qp_ex, e: c_int) {
    if let Some(q) = qp(qpx) {
        lock(&q.wr).fail(e);
    }
}

/// Writes the pending WR with `payload`.
fn post(qpx: *mut ibv_qp_ex, payload: Payload<'_>) {
    let Some(q) = qp(qpx) else { return };
    let mut st = lock(&q.wr);
    let Some(op) = st.op.take() else {
        if st.err == 0 {
            st.err = libc::EINVAL; // data with no operation before it
        }
        return;
    };
    if q.c.qp_base.qp_type == crate::dc::IBV_QPT_DRIVER {
        // A DCI: the WR goes to the DCT its `mlx5dv_wr_set_dc_addr` named.
        let r = match st.dc.take() {
            Some(Some(dc)) if crate::dc::dci_sends(&op) => {
                let wr = SendWr {
                    wr_id: st.wr_id,
                    op,
                    payload,
                    flags: st.flags,
                    ud: None,
                };
                q.qp.lock().post_send_deferred_dc(&wr, &dc)
            }
            _ => Err(verbs::wr::PostError::BadOp),
        };
        if let Err(e) = r {
            if st.err == 0 {
                st.err = crate::datapath::post_errno(e);
            }
        }
        return;
    }
    let ud = q.c.qp_base.qp_type == 4;
    let dest = match (ud, st.ud) {
        (false, _) => None,
        (true, Some((ah, qpn, qkey))) => ah_of(ah as *mut ibv_ah).map(|a| UdDest {
            ah: &a.ah,
            remote_qpn: qpn,
            remote_qkey: qkey,
        }),
        (true, None) => None,
    };
    if ud && dest.is_none() {
        if st.err == 0 {
            st.err = libc::EINVAL;
        }
        return;
    }
    let wr = SendWr {
        wr_id: st.wr_id,
        op,
        payload,
        flags: st.flags,
        ud: dest,
    };
    if let Err(e) = q.qp.lock().post_send_deferred(&wr) {
        if st.err == 0 {
            st.err = crate::datapath::post_errno(e);
        }
    }
}

unsafe extern "C" fn wr_send(qpx: *mut ibv_qp_ex) {
    set_op(qpx, SendOp::Send);
}

unsafe extern "C" fn wr_send_imm(qpx: *mut ibv_qp_ex, imm: u32) {
    set_op(qpx, SendOp::SendImm(u32::from_be(imm)));
}

unsafe extern "C" fn wr_send_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    set_op(qpx, SendOp::SendInv { rkey });
}

unsafe extern "C" fn wr_rdma_write(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    set_op(qpx, SendOp::RdmaWrite { raddr, rkey });
}

unsafe extern "C" fn wr_rdma_write_imm(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64, imm: u32) {
    set_op(
        qpx,
        SendOp::RdmaWriteImm {
            raddr,
            rkey,
            imm: u32::from_be(imm),
        },
    );
}

unsafe extern "C" fn wr_rdma_read(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64) {
    set_op(qpx, SendOp::RdmaRead { raddr, rkey });
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    qpx: *mut ibv_qp_ex,
    rkey: u32,
    raddr: u64,
    compare: u64,
    swap: u64,
) {
    set_op(
        qpx,
        SendOp::AtomicCmpSwp {
            raddr,
            rkey,
            compare,
            swap,
        },
    );
}

unsafe extern "C" fn wr_atomic_fetch_add(qpx: *mut ibv_qp_ex, rkey: u32, raddr: u64, add: u64) {
    set_op(qpx, SendOp::AtomicFetchAdd { raddr, rkey, add });
}

unsafe extern "C" fn wr_local_inv(qpx: *mut ibv_qp_ex, rkey: u32) {
    set_op(qpx, SendOp::LocalInv { rkey });
    post(qpx, Payload::Sges(&[]));
}

/// `ibv_wr_bind_mw`: a type-2 window bound to `rkey` over `bind`, a
/// whole WR (no data setter follows), as `ibv_post_send`'s BIND_MW.
unsafe extern "C" fn wr_bind_mw(
    qpx: *mut ibv_qp_ex,
    mw: *mut c_void,
    rkey: u32,
    bind: *const ibv_mw_bind_info,
) {
    if bind.is_null() {
        return fail(qpx, libc::EINVAL);
    }
    // SAFETY: the caller's bind information, non-NULL.
    let info = unsafe { &*bind };
    match crate::mw::wr_bind_op(mw.cast(), rkey, info) {
        Ok(op) => {
            set_op(qpx, op);
            post(qpx, Payload::Sges(&[]));
        }
        Err(e) => fail(qpx, e),
    }
}

unsafe extern "C" fn wr_send_tso(qpx: *mut ibv_qp_ex, _hdr: *mut c_void, _sz: u16, _mss: u16) {
    fail(qpx, libc::EOPNOTSUPP);
}

unsafe extern "C" fn wr_set_xrc_srqn(qpx: *mut ibv_qp_ex, _srqn: u32) {
    fail(qpx, libc::EOPNOTSUPP);
}

unsafe extern "C" fn wr_atomic_write(
    qpx: *mut ibv_qp_ex,
    _rkey: u32,
    _raddr: u64,
    _v: *const c_void,
) {
    fail(qpx, libc::EOPNOTSUPP);
}

unsafe extern "C" fn wr_set_ud_addr(qpx: *mut ibv_qp_ex, ah: *mut ibv_ah, qpn: u32, qkey: u32) {
    if let Some(q) = qp(qpx) {
        lock(&q.wr).ud = Some((ah as usize, qpn, qkey));
    }
}

unsafe extern "C" fn wr_set_sge(qpx: *mut ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    // SAFETY: the ibv_wr_set_sge contract: the buffer lies in the MR of
    // `lkey` until the WR completes.
    let s = [unsafe { Sge::new_unchecked(addr, length, lkey) }];
    post(qpx, Payload::Sges(&s));
}

unsafe extern "C" fn wr_set_sge_list(qpx: *mut ibv_qp_ex, n: usize, list: *const ibv_sge) {
    let mut sg = [const { MaybeUninit::uninit() }; MAX_SGE];
    let Ok(n) = libc::c_int::try_from(n) else {
        return fail(qpx, libc::EINVAL);
    };
    // SAFETY: the caller's list of `n` entries.
    match unsafe { crate::datapath::sges(list, n, &mut sg) } {
        Ok(s) => post(qpx, Payload::Sges(s)),
        Err(e) => fail(qpx, e),
    }
}

unsafe extern "C" fn wr_set_inline_data(qpx: *mut ibv_qp_ex, addr: *mut c_void, len: usize) {
    if len > MAX_INLINE || (len > 0 && addr.is_null()) {
        return fail(qpx, libc::EINVAL);
    }
    let b: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's buffer of `len` bytes, read during the call.
        unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }
    };
    post(qpx, Payload::Inline(b));
}

unsafe extern "C" fn wr_set_inline_data_list(
    qpx: *mut ibv_qp_ex,
    n: usize,
    bufs: *const ibv_data_buf,
) {
    let mut buf = [0u8; MAX_INLINE];
    let mut at = 0usize;
    for i in 0..n {
        // SAFETY: the caller's list of `n` buffers.
        let d = unsafe { bufs.wrapping_add(i).read() };
        if at + d.length > MAX_INLINE || (d.length > 0 && d.addr.is_null()) {
            return fail(qpx, libc::EINVAL);
        }
        // SAFETY: the caller's buffer of `d.length` bytes; `buf` has room.
        unsafe {
            std::ptr::copy_nonoverlapping(d.addr.cast::<u8>(), buf[at..].as_mut_ptr(), d.length)
        };
        at += d.length;
    }
    post(qpx, Payload::Inline(&buf[..at]));
}
