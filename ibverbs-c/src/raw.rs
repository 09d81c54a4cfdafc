//! Raw packet QPs and flow rules through C: `ibv_create_qp` with
//! `IBV_QPT_RAW_PACKET`, its `ibv_post_send` (whole Ethernet frames),
//! `ibv_post_recv`, `ibv_modify_qp` / `ibv_query_qp` / `ibv_destroy_qp`,
//! and `ibv_create_flow` / `ibv_destroy_flow`, which steer received frames
//! to it.
//!
//! The QP is the driver's raw packet QP polled through verbs CQs
//! (`verbs::raw_eth`'s polled mode): its completions come out of
//! `ibv_poll_cq` beside any other QP's, a send's with the QP's number, a
//! receive's with the flow tag (0) in `qp_num`, as libmlx5 reports them.
//! A send WR is one frame: its first 18 bytes (`eth_min_inline_size`,
//! `MLX5_ETH_L2_INLINE_HEADER_SIZE`) go inline in the WQE, gathered from
//! its SGEs as libmlx5's `set_eth_seg` copies them, the rest by pointer, a
//! data segment per SGE piece, or the whole frame inline with
//! `IBV_SEND_INLINE`; a receive WR's SGEs are one WQE's data segments,
//! which the frame fills in order. `IBV_SEND_IP_CSUM` asks the
//! device for the IPv4 and TCP/UDP checksums. The queues are ready from
//! creation (the driver moves SQ and RQ to RDY); the QP's state is kept
//! as verbs sees it, and posts are refused where verbs refuses them (no
//! send before RTS, no receive in RESET).
//!
//! Flow rules match the Ethernet, IPv4 (and its extended form), IPv6 and
//! TCP/UDP specs: each field's mask all ones (exact), all zeros (any), or
//! for MAC and IP addresses any bits (a prefix); other masks, other spec
//! types, flow tags and drop actions, and attributes other than a normal
//! rule on port 1 are EOPNOTSUPP. Every context of a device shares its
//! NIC receive table (made at the first rule, gone with the device's last
//! context). A QP with rules is not destroyed (EBUSY), as the kernel keeps
//! a QP its flows use.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use libc::{c_int, c_void, size_t};
use verbs::flow::{AddrMasks, FlowAction, FlowSpec};
use verbs::mr::Sge;
use verbs::qp::MAX_SGE;
use verbs::raw_eth::{RawPacketQp, RawQpCap, RawSendWr, RawSges, MAX_INLINE_HEADERS};

use crate::abi::*;
use crate::async_event::CtxShared;
use crate::objects::{cq_of, lock, pd_of, unuse, Cq, Pd};
use crate::registry::{self, Kind};
use crate::{null_errno, ret_errno};

/// `IBV_QPT_RAW_PACKET`.
pub(crate) const IBV_QPT_RAW_PACKET: c_int = 8;
/// `MLX5_ETH_L2_INLINE_HEADER_SIZE`: the frame bytes a send WQE carries
/// inline (the Ethernet header and a VLAN tag's room).
const L2_INLINE: usize = 18;
/// `IBV_WR_SEND`.
const WR_SEND: c_int = 2;
/// `enum ibv_send_flags`.
const SEND_SIGNALED: u32 = 1 << 1;
const SEND_INLINE: u32 = 1 << 3;
const SEND_IP_CSUM: u32 = 1 << 4;
/// The most WRs a queue takes: the driver's rings are at most 2^15.
const MAX_WR: u32 = 1 << 15;

/// A raw packet QP: its `ibv_qp` first, as C sees it.
#[repr(C)]
pub(crate) struct RawQp {
    pub c: ibv_qp,
    qp: Mutex<RawPacketQp>,
    scq: *const Cq,
    rcq: *const Cq,
    pd: *const Pd,
    shared: Arc<CtxShared>,
    /// The attributes verbs set, and the state.
    attr: Mutex<ibv_qp_attr>,
    sq_sig_all: bool,
    /// Flow rules steering to it.
    flows: AtomicUsize,
}

/// The `RawQp` of a live `ibv_qp`, if it is one.
pub(crate) fn raw_of<'a>(p: *mut ibv_qp) -> Option<&'a RawQp> {
    if !registry::is(p, Kind::RawQp) {
        return None;
    }
    // SAFETY: the registry holds `p`: a live RawQp box, `c` its first field.
    Some(unsafe { &*(p as *const RawQp) })
}

/// log2 of the ring for `n` WRs (at least `least`).
fn log_ring(n: u32, least: u32) -> u8 {
    n.max(least).next_power_of_two().trailing_zeros() as u8
}

/// `ibv_create_qp` of a raw packet QP on `p` with `a`'s CQs and
/// capacities (`a.cap` gets what was made).
pub(crate) fn create(p: *mut ibv_pd, a: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, c_int> {
    let pd = pd_of(p).ok_or(libc::EINVAL)?;
    let scq = cq_of(a.send_cq).ok_or(libc::EINVAL)?;
    let rcq = cq_of(a.recv_cq).ok_or(libc::EINVAL)?;
    let c = a.cap;
    if !a.srq.is_null()
        || c.max_send_wr > MAX_WR
        || c.max_recv_wr > MAX_WR
        || c.max_send_sge as usize > MAX_SGE
        || c.max_recv_sge as usize > MAX_SGE
        || c.max_inline_data as usize > MAX_INLINE_HEADERS
    {
        tracing::debug!(
            "ibv_create_qp(RAW_PACKET): an SRQ, or more than {MAX_WR} WRs, {MAX_SGE} SGEs or \
             {MAX_INLINE_HEADERS} inline bytes"
        );
        return Err(libc::EINVAL);
    }
    // A send WR's SGEs become data segments after the inline bytes; a
    // receive WQE holds a power of two of them.
    let sges = RawSges {
        send: (c.max_send_sge as usize).max(1),
        recv: (c.max_recv_sge as usize).max(1).next_power_of_two(),
    };
    let cap = RawQpCap {
        log_sq_bbs: log_ring(c.max_send_wr, 2),
        log_rq_wqes: log_ring(c.max_recv_wr, 1),
        strip_vlan: false,
        tunnel_offloads: false,
        striding: None,
    };
    // SAFETY: the PD's context is this library's (the PD is live).
    let ctx = unsafe { crate::device::ctx_of(pd.c.context) };
    let sg = scq.cq.lock_control();
    let rg = (!std::ptr::eq(scq, rcq)).then(|| rcq.cq.lock_control());
    let qp = ctx
        .vc
        .create_raw_packet_qp_polled(&pd.pd, &sg, rg.as_deref().unwrap_or(&sg), cap, sges)
        .map_err(|e| crate::errno_of("ibv_create_qp(RAW_PACKET)", &e))?;
    drop((sg, rg));
    a.cap = ibv_qp_cap {
        max_send_wr: 1 << cap.log_sq_bbs,
        max_recv_wr: 1 << cap.log_rq_wqes,
        max_send_sge: sges.send as u32,
        max_recv_sge: sges.recv as u32,
        max_inline_data: MAX_INLINE_HEADERS as u32,
    };
    for u in [&pd.users, &scq.users, &rcq.users] {
        u.fetch_add(1, Ordering::AcqRel);
    }
    pd.shared.objects.fetch_add(1, Ordering::AcqRel);
    let qpn = qp.sqn();
    let b = Box::into_raw(Box::new(RawQp {
        c: ibv_qp {
            context: pd.c.context,
            qp_context: a.qp_context,
            pd: p,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: std::ptr::null_mut(),
            handle: qpn,
            qp_num: qpn,
            state: 0,
            qp_type: IBV_QPT_RAW_PACKET,
            mutex: mutex_init(),
            cond: cond_init(),
            events_completed: 0,
        },
        qp: Mutex::new(qp),
        scq,
        rcq,
        pd,
        shared: pd.shared.clone(),
        attr: Mutex::new(ibv_qp_attr {
            cap: a.cap,
            ..Default::default()
        }),
        sq_sig_all: a.sq_sig_all != 0,
        flows: AtomicUsize::new(0),
    }));
    registry::add(b, Kind::RawQp);
    Ok(b.cast())
}

/// `IBV_QP_STATE`, `IBV_QP_PORT`.
const ATTR_STATE: u32 = 1 << 0;
const ATTR_PORT: u32 = 1 << 5;

/// `ibv_modify_qp` of a raw packet QP: the verbs state machine (RESET to
/// INIT with the port, INIT to RTR, RTR to RTS, to RESET or ERR from any);
/// the queues themselves are ready from creation. Other attributes are
/// kept for `ibv_query_qp`.
pub(crate) fn modify(p: *mut ibv_qp, q: &RawQp, a: &ibv_qp_attr, mask: c_int) -> c_int {
    let mask = mask as u32;
    let mut kept = lock(&q.attr);
    let from = kept.qp_state;
    let to = if mask & ATTR_STATE != 0 {
        a.qp_state
    } else {
        from
    };
    // RESET 0, INIT 1, RTR 2, RTS 3, ERR 6.
    let ok = match (from, to) {
        (_, 0) | (_, 6) => true,
        (0, 1) => mask & ATTR_PORT != 0 && a.port_num == 1,
        (1, 1) | (1, 2) | (2, 3) | (3, 3) => mask & ATTR_PORT == 0 || a.port_num == 1,
        _ => false,
    };
    if !ok {
        tracing::debug!("ibv_modify_qp(RAW_PACKET): {from} -> {to}, mask {mask:#x}");
        return ret_errno(libc::EINVAL);
    }
    if mask & ATTR_PORT != 0 {
        kept.port_num = a.port_num;
    }
    kept.qp_state = to;
    kept.cur_qp_state = to;
    // SAFETY: `state` of the live QP's C struct, `p` (libibverbs writes it
    // so).
    unsafe { (*p).state = to };
    0
}

/// `ibv_query_qp` of a raw packet QP.
pub(crate) fn query(q: &RawQp, attr: &mut ibv_qp_attr, init: &mut ibv_qp_init_attr) {
    *attr = *lock(&q.attr);
    *init = ibv_qp_init_attr {
        qp_context: q.c.qp_context,
        send_cq: q.c.send_cq,
        recv_cq: q.c.recv_cq,
        srq: std::ptr::null_mut(),
        cap: attr.cap,
        qp_type: IBV_QPT_RAW_PACKET,
        sq_sig_all: c_int::from(q.sq_sig_all),
    };
}

/// `ibv_destroy_qp` of a raw packet QP: EBUSY while flow rules steer to
/// it.
pub(crate) fn destroy(p: *mut ibv_qp) -> c_int {
    let Some(q) = raw_of(p) else {
        return ret_errno(libc::EINVAL);
    };
    if q.flows.load(Ordering::Acquire) > 0 {
        return ret_errno(libc::EBUSY);
    }
    if !registry::remove(p, Kind::RawQp) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live; the box is taken back once.
    let b = unsafe { Box::from_raw(p as *mut RawQp) };
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    let r =
        b.qp.into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .destroy();
    // SAFETY: the CQs and PD are not destroyed while the QP counts on them.
    unuse(unsafe { &(*b.scq).users });
    // SAFETY: as above.
    unuse(unsafe { &(*b.rcq).users });
    // SAFETY: as above.
    unuse(unsafe { &(*b.pd).users });
    match r {
        Ok(()) => 0,
        Err(e) => ret_errno(crate::errno_of("ibv_destroy_qp(RAW_PACKET)", &e)),
    }
}

/// The frame of a send WR as the driver sends it: its first
/// [`L2_INLINE`] bytes inline (all of it, with `IBV_SEND_INLINE`),
/// gathered from its SGEs in order, and the rest of the SGEs by pointer
/// (`pieces`), as libmlx5's `set_eth_seg` copies the headers and
/// `set_data_ptr_seg` points at the rest.
///
/// # Safety
///
/// The WR's SGEs lie in the caller's readable memory (ibv_post_send's
/// contract).
unsafe fn frame_of<'a>(
    w: &ibv_send_wr,
    inline: &'a mut [u8; MAX_INLINE_HEADERS],
    pieces: &'a mut [Sge; MAX_SGE],
) -> Result<RawSendWr<'a>, c_int> {
    let n = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if n == 0 || n > MAX_SGE || w.sg_list.is_null() {
        return Err(libc::EINVAL);
    }
    let all = w.send_flags & SEND_INLINE != 0;
    let want = if all { MAX_INLINE_HEADERS } else { L2_INLINE };
    let (mut at, mut k) = (0usize, 0usize);
    for i in 0..n {
        // SAFETY: `n` SGEs readable (the caller's contract).
        let s = unsafe { w.sg_list.wrapping_add(i).read() };
        let len = s.length as usize;
        let take = len.min(want - at);
        if take > 0 {
            // SAFETY: the SGE's bytes are the caller's readable memory.
            let src = unsafe { std::slice::from_raw_parts(s.addr as *const u8, take) };
            inline[at..at + take].copy_from_slice(src);
            at += take;
        }
        if take < len {
            if all {
                // More than fits inline.
                return Err(libc::EINVAL);
            }
            // SAFETY: the rest of the caller's SGE, in its MR.
            pieces[k] =
                unsafe { Sge::new_unchecked(s.addr + take as u64, (len - take) as u32, s.lkey) };
            k += 1;
        }
    }
    Ok(RawSendWr {
        wr_id: w.wr_id,
        headers: &inline[..at],
        payload: &pieces[..k],
        csum: w.send_flags & SEND_IP_CSUM != 0,
        signaled: false,
    })
}

/// `ibv_post_send` on a raw packet QP: each WR an `IBV_WR_SEND` of one
/// frame; one doorbell for the list.
///
/// # Safety
///
/// `wr` is the caller's list, its buffers as ibv_post_send requires.
pub(crate) unsafe fn post_send(
    q: &RawQp,
    wr: *mut ibv_send_wr,
) -> Result<(), (*mut ibv_send_wr, c_int)> {
    if lock(&q.attr).qp_state != 3 {
        return Err((wr, libc::EINVAL));
    }
    let mut g = lock(&q.qp);
    let mut cur = wr;
    let mut posted = 0;
    let r = loop {
        if cur.is_null() {
            break Ok(());
        }
        // SAFETY: the caller's WR list.
        let w = unsafe { &*cur };
        if w.opcode != WR_SEND {
            break Err((cur, libc::EINVAL));
        }
        let mut inline = [0u8; MAX_INLINE_HEADERS];
        // SAFETY: any SGE value; only the first `k` are read.
        let mut pieces = [unsafe { Sge::new_unchecked(0, 0, 0) }; MAX_SGE];
        // SAFETY: forwarded from this function's contract.
        let mut wr = match unsafe { frame_of(w, &mut inline, &mut pieces) } {
            Ok(p) => p,
            Err(e) => break Err((cur, e)),
        };
        wr.signaled = q.sq_sig_all || w.send_flags & SEND_SIGNALED != 0;
        if let Err(e) = g.post_send_wr(&wr) {
            break Err((cur, wr_errno(&e)));
        }
        posted += 1;
        cur = w.next;
    };
    if posted > 0 {
        g.ring_sends();
    }
    r
}

/// `ibv_post_recv` on a raw packet QP: each WR one receive WQE of its
/// buffers (at most the QP's receive SGEs).
///
/// # Safety
///
/// `wr` is the caller's list; its SGEs lie in live MRs.
pub(crate) unsafe fn post_recv(
    q: &RawQp,
    wr: *mut ibv_recv_wr,
) -> Result<(), (*mut ibv_recv_wr, c_int)> {
    if lock(&q.attr).qp_state == 0 {
        return Err((wr, libc::EINVAL));
    }
    let mut g = lock(&q.qp);
    // SAFETY: forwarded from this function's contract.
    unsafe { post_eth_recv(wr, |bufs, wr_id| g.post_recv_wr(bufs, wr_id)) }
}

/// The errno of an Ethernet queue's refused work request: ENOMEM for a
/// full ring, EINVAL for anything else.
fn wr_errno(e: &verbs::Error) -> c_int {
    match e {
        verbs::Error::QueueFull(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// Posts each receive WR of the list from `wr` through `post` (its SGEs,
/// its wr_id): a raw packet QP's receive queue or a WQ. The WR that
/// failed and its errno; those before it posted.
///
/// # Safety
///
/// `wr` is the caller's list; its SGEs lie in live MRs.
pub(crate) unsafe fn post_eth_recv(
    wr: *mut ibv_recv_wr,
    mut post: impl FnMut(&[Sge], u64) -> verbs::Result<()>,
) -> Result<(), (*mut ibv_recv_wr, c_int)> {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller's WR list.
        let w = unsafe { &*cur };
        let mut sg = [const { std::mem::MaybeUninit::uninit() }; MAX_SGE];
        // SAFETY: the caller's SGEs (this function's contract).
        let bufs = match unsafe { crate::datapath::sges(w.sg_list, w.num_sge, &mut sg) } {
            Ok(b) => b,
            Err(e) => return Err((cur, e)),
        };
        post(bufs, w.wr_id).map_err(|e| (cur, wr_errno(&e)))?;
        cur = w.next;
    }
    Ok(())
}

/// A flow rule: its `ibv_flow` first.
#[repr(C)]
struct Flow {
    c: ibv_flow,
    flow: Option<verbs::flow::Flow>,
    /// The QP's count of rules (a raw packet QP's or an RSS QP's), which
    /// outlives the rule; NULL for a rule that drops.
    flows: *const AtomicUsize,
    shared: Arc<CtxShared>,
}

/// `enum ibv_flow_spec_type`.
mod spec {
    pub const ETH: i32 = 0x20;
    pub const IPV4: i32 = 0x30;
    pub const IPV6: i32 = 0x31;
    pub const IPV4_EXT: i32 = 0x32;
    pub const TCP: i32 = 0x40;
    pub const UDP: i32 = 0x41;
}

/// A spec field's match: all-ones mask exact, zero any, else refused.
fn exact<T: PartialEq + Copy>(val: T, mask: T, zero: T, ones: T) -> Result<Option<T>, c_int> {
    if mask == zero {
        Ok(None)
    } else if mask == ones {
        Ok(Some(val))
    } else {
        Err(libc::EOPNOTSUPP)
    }
}

/// An address field: any mask (`None` when zero).
fn masked<const N: usize>(val: [u8; N], mask: [u8; N]) -> (Option<[u8; N]>, Option<[u8; N]>) {
    if mask == [0; N] {
        (None, None)
    } else {
        (Some(val), Some(mask))
    }
}

/// Reads spec `T` at `at` if its header says `size` bytes hold one.
///
/// # Safety
///
/// `at` is readable for `size` bytes.
unsafe fn read_spec<T: Copy>(at: *const u8, size: usize) -> Result<T, c_int> {
    if size < std::mem::size_of::<T>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: `size_of::<T>()` bytes readable (the caller's contract and
    // the test above); any bytes are a valid T (integers).
    Ok(unsafe { at.cast::<T>().read_unaligned() })
}

/// The driver's rule for `ibv_flow_attr` `a` and the specs after it.
///
/// # Safety
///
/// `a` is followed by its `num_of_specs` specs, each `size` bytes long.
unsafe fn spec_of(a: *const ibv_flow_attr) -> Result<FlowSpec, c_int> {
    // SAFETY: the caller's attributes.
    let attr = unsafe { a.read() };
    if attr.comp_mask != 0 || attr.flags != 0 || attr.type_ != 0 || attr.port != 1 {
        tracing::debug!(
            "ibv_create_flow: type {}, port {}, flags {:#x}: only a normal rule on port 1",
            attr.type_,
            attr.port,
            attr.flags
        );
        return Err(libc::EOPNOTSUPP);
    }
    // libibverbs walks the specs by their own sizes; `size` is not read
    // (pyverbs sets it to the attributes' own size, others leave it 0).
    let mut off = std::mem::size_of::<ibv_flow_attr>();
    let mut f = FlowSpec::default();
    let mut m = AddrMasks::default();
    for _ in 0..attr.num_of_specs {
        let at = a.cast::<u8>().wrapping_add(off);
        // SAFETY: the caller's spec (this function's contract).
        let h = unsafe { at.cast::<ibv_flow_spec_hdr>().read_unaligned() };
        let size = usize::from(h.size);
        if size < std::mem::size_of::<ibv_flow_spec_hdr>() {
            return Err(libc::EINVAL);
        }
        match h.type_ {
            spec::ETH => {
                // SAFETY: the spec's `size` bytes are the caller's.
                let s: ibv_flow_spec_eth = unsafe { read_spec(at, size) }?;
                (f.dmac, m.dmac) = masked(s.val.dst_mac, s.mask.dst_mac);
                (f.smac, m.smac) = masked(s.val.src_mac, s.mask.src_mac);
                let et = exact(s.val.ether_type, s.mask.ether_type, 0, 0xffff)?;
                f.ethertype = et.map(u16::from_be);
                let vlan = u16::from_be(s.mask.vlan_tag);
                f.vlan_id = exact(u16::from_be(s.val.vlan_tag) & 0xfff, vlan, 0, 0xfff)?;
            }
            spec::IPV4 => {
                // SAFETY: as above.
                let s: ibv_flow_spec_ipv4 = unsafe { read_spec(at, size) }?;
                ipv4(
                    &mut f,
                    &mut m,
                    [s.val.src_ip, s.val.dst_ip],
                    [s.mask.src_ip, s.mask.dst_ip],
                );
            }
            spec::IPV4_EXT => {
                // SAFETY: as above.
                let s: ibv_flow_spec_ipv4_ext = unsafe { read_spec(at, size) }?;
                ipv4(
                    &mut f,
                    &mut m,
                    [s.val.src_ip, s.val.dst_ip],
                    [s.mask.src_ip, s.mask.dst_ip],
                );
                f.ip_protocol = exact(s.val.proto, s.mask.proto, 0, 0xff)?;
                if (s.mask.tos, s.mask.ttl, s.mask.flags) != (0, 0, 0) {
                    return Err(libc::EOPNOTSUPP);
                }
            }
            spec::IPV6 => {
                // SAFETY: as above.
                let s: ibv_flow_spec_ipv6 = unsafe { read_spec(at, size) }?;
                (f.src_ipv6, m.src_ipv6) = masked(s.val.src_ip, s.mask.src_ip);
                (f.dst_ipv6, m.dst_ipv6) = masked(s.val.dst_ip, s.mask.dst_ip);
                f.ip_protocol = exact(s.val.next_hdr, s.mask.next_hdr, 0, 0xff)?;
                if (s.mask.flow_label, s.mask.traffic_class, s.mask.hop_limit) != (0, 0, 0) {
                    return Err(libc::EOPNOTSUPP);
                }
            }
            t @ (spec::TCP | spec::UDP) => {
                // SAFETY: as above.
                let s: ibv_flow_spec_tcp_udp = unsafe { read_spec(at, size) }?;
                let sport = exact(s.val.src_port, s.mask.src_port, 0, 0xffff)?.map(u16::from_be);
                let dport = exact(s.val.dst_port, s.mask.dst_port, 0, 0xffff)?.map(u16::from_be);
                if t == spec::TCP {
                    (f.tcp_sport, f.tcp_dport) = (sport, dport);
                    f.ip_protocol = f.ip_protocol.or(Some(6));
                } else {
                    (f.udp_sport, f.udp_dport) = (sport, dport);
                    f.ip_protocol = f.ip_protocol.or(Some(17));
                }
            }
            t => {
                tracing::debug!("ibv_create_flow: spec type {t:#x} not offered");
                return Err(libc::EOPNOTSUPP);
            }
        }
        off += size;
    }
    f.masks = m;
    Ok(f)
}

/// An IPv4 spec's source and destination addresses and their masks
/// (network order) into `f`.
fn ipv4(f: &mut FlowSpec, m: &mut AddrMasks, [src, dst]: [u32; 2], [src_m, dst_m]: [u32; 2]) {
    (f.src_ipv4, m.src_ipv4) = masked(src.to_ne_bytes(), src_m.to_ne_bytes());
    (f.dst_ipv4, m.dst_ipv4) = masked(dst.to_ne_bytes(), dst_m.to_ne_bytes());
}

/// `verbs_context.ibv_create_flow` (`ibv_create_flow`): a rule steering
/// the frames the specs match to the raw packet QP or the RSS QP `p`.
pub(crate) unsafe extern "C" fn create_flow(
    p: *mut ibv_qp,
    a: *mut ibv_flow_attr,
) -> *mut ibv_flow {
    let raw = raw_of(p);
    let rss = crate::rss::rss_of(p);
    let (context, flows, shared) = match (raw, rss) {
        (Some(q), _) => (q.c.context, &q.flows, q.shared.clone()),
        (_, Some(q)) => (q.c.context, &q.flows, q.shared_of()),
        _ => {
            tracing::debug!("ibv_create_flow: only toward a raw packet or RSS QP");
            return null_errno(if registry::is(p, Kind::Qp) {
                libc::EOPNOTSUPP
            } else {
                libc::EINVAL
            });
        }
    };
    if a.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes and specs.
    let spec = match unsafe { spec_of(a) } {
        Ok(s) => s,
        Err(e) => return null_errno(e),
    };
    // SAFETY: the QP's context is this library's and outlives it.
    let ctx = unsafe { crate::device::ctx_of(context) };
    let r = match (raw, rss) {
        (Some(q), _) => {
            let g = lock(&q.qp);
            crate::device::with_steering(ctx, |st| st.create_flow(&spec, FlowAction::Queue(&g)))
        }
        (_, Some(q)) => {
            crate::device::with_steering(ctx, |st| st.create_flow(&spec, FlowAction::Rss(&q.rss)))
        }
        _ => unreachable!("one of the two, matched above"),
    };
    let flow = match r {
        Ok(f) => f,
        Err(e) => return null_errno(crate::errno_of("ibv_create_flow", &e)),
    };
    flows.fetch_add(1, Ordering::AcqRel);
    shared.objects.fetch_add(1, Ordering::AcqRel);
    let b = Box::into_raw(Box::new(Flow {
        c: ibv_flow {
            comp_mask: 0,
            context,
            handle: 0,
        },
        flow: Some(flow),
        flows,
        shared,
    }));
    registry::add(b, Kind::Flow);
    b.cast()
}

/// `verbs_context.ibv_destroy_flow` (`ibv_destroy_flow`).
pub(crate) unsafe extern "C" fn destroy_flow(p: *mut ibv_flow) -> c_int {
    if !registry::remove(p, Kind::Flow) {
        return libc::EINVAL;
    }
    // SAFETY: was live; the box is taken back once.
    let mut b = unsafe { Box::from_raw(p as *mut Flow) };
    // SAFETY: as in create_flow.
    let ctx = unsafe { crate::device::ctx_of(b.c.context) };
    let r = match b.flow.take() {
        Some(f) => crate::device::with_steering(ctx, |st| st.destroy_flow(f)),
        None => Ok(()),
    };
    if !b.flows.is_null() {
        // SAFETY: the QP is not destroyed while its rules live.
        unsafe { &*b.flows }.fetch_sub(1, Ordering::AcqRel);
    }
    b.shared.objects.fetch_sub(1, Ordering::AcqRel);
    match r {
        Ok(()) => 0,
        Err(e) => crate::errno_of("ibv_destroy_flow", &e),
    }
}

/// `MLX5DV_FLOW_MATCHER_MASK_FT_TYPE`.
const MATCHER_MASK_FT_TYPE: u64 = 1 << 0;
/// `MLX5DV_FLOW_TABLE_TYPE_NIC_RX`.
const FT_NIC_RX: c_int = 0;
/// `enum mlx5dv_flow_action_type`.
const DV_DEST_IBV_QP: c_int = 0;
const DV_DROP: c_int = 1;

/// An mlx5dv flow matcher: the mask every flow of it matches under, in
/// the device's format (`fte_match_param`), and which parts it covers.
struct Matcher {
    ctx: *mut ibv_context,
    mask: Vec<u8>,
    criteria: u8,
}

/// The `match_sz` bytes after a `mlx5dv_flow_match_parameters`.
///
/// # Safety
///
/// `p` is NULL or the caller's parameters with `match_sz` bytes after.
unsafe fn match_bytes<'a>(p: *const mlx5dv_flow_match_parameters) -> Result<&'a [u8], c_int> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's parameters, non-NULL.
    let n = unsafe { (*p).match_sz };
    if n > mlx5_hw::ifc::fte_match_param::SIZE_BYTES {
        return Err(libc::EINVAL);
    }
    // The bytes right after the header: `match_buf`'s place.
    let buf = p.cast::<u8>().wrapping_add(std::mem::offset_of!(
        mlx5dv_flow_match_parameters,
        match_buf
    ));
    // SAFETY: `match_sz` bytes follow the header (this function's contract).
    Ok(unsafe { std::slice::from_raw_parts(buf, n) })
}

/// `mlx5dv_create_flow_matcher`: a matcher of the NIC receive table (a
/// normal rule, no flags); its flow group is made with its first flow.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow_matcher(
    c: *mut ibv_context,
    a: *mut mlx5dv_flow_matcher_attr,
) -> *mut c_void {
    if crate::device::checked_ctx(c).is_none() {
        return std::ptr::null_mut();
    }
    if a.is_null() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: the caller's attributes, non-NULL.
    let at = unsafe { *a };
    let ft = if at.comp_mask & MATCHER_MASK_FT_TYPE != 0 {
        at.ft_type
    } else {
        FT_NIC_RX
    };
    if at.comp_mask & !MATCHER_MASK_FT_TYPE != 0
        || at.type_ != 0
        || at.flags != 0
        || ft != FT_NIC_RX
    {
        tracing::debug!(
            "mlx5dv_create_flow_matcher: type {}, flags {:#x}, table type {ft}: NIC RX only",
            at.type_,
            at.flags
        );
        return null_errno(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's mask parameters.
    let mask = match unsafe { match_bytes(at.match_mask) } {
        Ok(m) => m.to_vec(),
        Err(e) => return null_errno(e),
    };
    let b = Box::into_raw(Box::new(Matcher {
        ctx: c,
        mask,
        criteria: at.match_criteria_enable,
    }));
    registry::add(b, Kind::Matcher);
    b.cast()
}

/// `mlx5dv_destroy_flow_matcher`.
#[no_mangle]
pub extern "C" fn mlx5dv_destroy_flow_matcher(m: *mut c_void) -> c_int {
    if !registry::remove(m, Kind::Matcher) {
        return ret_errno(libc::EINVAL);
    }
    // SAFETY: was live; the box is taken back once.
    drop(unsafe { Box::from_raw(m as *mut Matcher) });
    0
}

/// `mlx5dv_create_flow`: a rule of `matcher` matching `value` (the
/// device's format), forwarding to a raw packet or RSS QP
/// (`MLX5DV_FLOW_ACTION_DEST_IBV_QP`) or dropping; one action. Destroyed
/// by `ibv_destroy_flow`.
#[no_mangle]
pub unsafe extern "C" fn mlx5dv_create_flow(
    m: *mut c_void,
    value: *mut mlx5dv_flow_match_parameters,
    n: size_t,
    actions: *mut mlx5dv_flow_action_attr,
) -> *mut ibv_flow {
    if !registry::is(m, Kind::Matcher) {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: live (the registry holds it).
    let matcher = unsafe { &*(m as *const Matcher) };
    if n != 1 || actions.is_null() {
        tracing::debug!("mlx5dv_create_flow: one action only");
        return null_errno(if n == 0 {
            libc::EINVAL
        } else {
            libc::EOPNOTSUPP
        });
    }
    // SAFETY: the caller's one action.
    let act = unsafe { actions.read() };
    // SAFETY: the caller's value parameters.
    let value = match unsafe { match_bytes(value) } {
        Ok(v) => v,
        Err(e) => return null_errno(e),
    };
    // The matcher's context, if it is still open.
    let Some(ctx) = crate::device::checked_ctx(matcher.ctx) else {
        return std::ptr::null_mut();
    };
    let (qp, drop_it) = match act.type_ {
        DV_DEST_IBV_QP => (act.obj.cast::<ibv_qp>(), false),
        DV_DROP => (std::ptr::null_mut(), true),
        t => {
            tracing::debug!("mlx5dv_create_flow: action {t} not offered");
            return null_errno(libc::EOPNOTSUPP);
        }
    };
    let raw = raw_of(qp);
    let rss = crate::rss::rss_of(qp);
    let flows: Option<&AtomicUsize> = match (raw, rss) {
        (Some(q), _) => Some(&q.flows),
        (_, Some(q)) => Some(&q.flows),
        _ if drop_it => None,
        _ => return null_errno(libc::EINVAL),
    };
    let r = match (raw, rss) {
        (Some(q), _) => {
            let g = lock(&q.qp);
            crate::device::with_steering(ctx, |st| {
                st.create_flow_matched(
                    &matcher.mask,
                    value,
                    matcher.criteria,
                    FlowAction::Queue(&g),
                )
            })
        }
        (_, Some(q)) => crate::device::with_steering(ctx, |st| {
            st.create_flow_matched(
                &matcher.mask,
                value,
                matcher.criteria,
                FlowAction::Rss(&q.rss),
            )
        }),
        _ => crate::device::with_steering(ctx, |st| {
            st.create_flow_matched(&matcher.mask, value, matcher.criteria, FlowAction::Drop)
        }),
    };
    let flow = match r {
        Ok(f) => f,
        Err(e) => return null_errno(crate::errno_of("mlx5dv_create_flow", &e)),
    };
    let counter = flows.map_or(std::ptr::null(), |f| {
        f.fetch_add(1, Ordering::AcqRel);
        f as *const AtomicUsize
    });
    ctx.shared.objects.fetch_add(1, Ordering::AcqRel);
    let b = Box::into_raw(Box::new(Flow {
        c: ibv_flow {
            comp_mask: 0,
            context: matcher.ctx,
            handle: 0,
        },
        flow: Some(flow),
        flows: counter,
        shared: ctx.shared.clone(),
    }));
    registry::add(b, Kind::Flow);
    b.cast()
}
