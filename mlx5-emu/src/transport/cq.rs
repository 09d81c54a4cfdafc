//! Completion queues as the data path writes them: 64-byte CQEs (or 64
//! bytes in the second half of a 128-byte entry) with the owner bit
//! written last, error CQEs, overrun detection against the consumer
//! counter in the doorbell record, and arming (UAR 0x20 or the doorbell
//! record's arm word) that turns the next CQE, or the next solicited or
//! error CQE, into a completion EQE.
//!
//! Event moderation (`cq_moderation`: the context's `cq_period` in
//! microseconds and `cq_max_count` in CQEs, set at CREATE_CQ or by
//! MODIFY_CQ, what mlx5e's DIM and `ibv_modify_cq` change): an armed CQ
//! raises its event once `cq_max_count` CQEs were written since the last
//! event, or once `cq_period` has run, from the first CQE after the last
//! event (`cq_period_mode` start-from-CQE) or from the last event
//! (start-from-EQE), whichever comes first; a value of 0 turns its half
//! off, both 0 raise the event on the first CQE. A solicited or error CQE
//! raises it at once where `scqe_break_moderation_en` asks for that. An
//! arm that finds CQEs already there raises it at once. A
//! period not yet run waits on the function's clock ([`CQ_MODERATION`]);
//! each data-path pass raises the events whose period has run
//! ([`moderation_timers`]).

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mlx5_hw::cqe::{self, CqeOpcode};
use mlx5_hw::event::EventType;
use mlx5_hw::event::EQE_RESOURCE_NUMBER_MASK;
use mlx5_hw::ifc::{Cqe64, EqeComp, EqeCqErr, ErrCqe};
use vfio::clock::{later, Deadline};
use vfio::IovaMemory;
use zerocopy::{FromZeros, IntoBytes};

use super::cqe_comp::{self, Compression, Sequel, Session};
use super::lro::Sender;
use super::mem;
use super::qp::Buf;
use super::{PendingEvent, Rdma};
use crate::lock;

/// `cq_err` syndrome: CQ overrun (`MLX5_CQ_ERROR_SYNDROME_CQ_OVERRUN`).
const CQ_ERROR_OVERRUN: u8 = 1;
/// `cq_err` syndrome: access violation, a CQE write faulted
/// (`MLX5_CQ_ERROR_SYNDROME_CQ_ACCESS_VIOLATION_ERROR`).
const CQ_ERROR_ACCESS_VIOLATION: u8 = 2;
/// `flags_rqpn` bits 29:28: a GRH is present.
const FLAGS_GRH: u32 = 1 << cqe::CQE_GRH_SHIFT;

/// Names an armed CQ's wait for its moderation period, for a test's
/// `ManualClock::wait_armed`.
pub const CQ_MODERATION: &str = "CQ event moderation";

/// Where `op_own` (opcode and owner bit) sits in a CQE.
const OP_OWN_AT: u64 = cqe::CQE_OP_OWN_OFFSET as u64;

/// One completion queue.
#[derive(Debug)]
pub(crate) struct Cq {
    pub cqn: u32,
    pub eqn: u8,
    pub uar: u32,
    pub dbr: u64,
    /// CQE compression (`cqe_comp_en`), fixed at creation.
    pub comp: Option<Compression>,
    pub st: Mutex<CqState>,
}

/// Why the CQ stopped taking CQEs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// No free slot (`MLX5_CQ_ERROR_SYNDROME_CQ_OVERRUN`).
    Overrun,
    /// A CQE write faulted.
    Fault,
}

/// Producer side of a CQ, and its ring (which MODIFY_CQ's resize
/// replaces).
#[derive(Debug, Default)]
pub(crate) struct CqState {
    pub log_size: u8,
    /// Bytes per entry (64 or 128).
    pub stride: u64,
    pub buf: Buf,
    pub pi: u32,
    /// Consumer counter last read from the doorbell record.
    pub ci: u32,
    /// Armed: `Some(solicited_only)`.
    pub armed: Option<bool>,
    /// Last arm word acted on (`None` before the first).
    pub last_arm: Option<u32>,
    /// Producer index after the last solicited or error CQE.
    pub last_sol: u32,
    /// Overrun: no more CQEs.
    pub error: bool,
    /// Event moderation: `cq_period` (microseconds, 0: off).
    pub period: u16,
    /// Event moderation: `cq_max_count` (CQEs, 0: off).
    pub max_count: u16,
    /// `cq_period_mode` start-from-CQE: the period runs from the first
    /// CQE after the last event (else from the last event).
    pub period_from_cqe: bool,
    /// `scqe_break_moderation_en`: a solicited CQE raises the event at
    /// once.
    pub sol_breaks: bool,
    /// CQEs written since the last completion event.
    pub since_event: u32,
    /// When the last completion event was raised.
    pub last_event: Option<Instant>,
    /// When the first CQE after the last event was written (armed).
    pub first_cqe: Option<Instant>,
    /// The armed CQ's moderation period, not yet run (counted in
    /// [`Rdma::cq_timers`]).
    pub timer: Option<Deadline>,
    /// The compression session being gathered ([`cqe_comp`]).
    pub session: Option<Session>,
}

/// Why a resize was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResizeError {
    /// The CQ is in error (overrun or a faulted write).
    InError,
    /// The new ring cannot hold the CQEs not yet polled, or the old one
    /// has no room for the RESIZE_CQ CQE.
    TooSmall,
    /// The old ring's entry could not be written.
    Fault,
}

/// What one CQE says.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Completion {
    pub opcode: u8,
    pub qpn: u32,
    /// The WQE's index; a striding RQ's first stride of the frame.
    pub wqe_counter: u16,
    /// Send WQE opcode (requester CQEs).
    pub s_wqe_opcode: u8,
    pub byte_cnt: u32,
    pub imm: u32,
    /// Remote QP number and flags (responder CQEs).
    pub flags_rqpn: u32,
    pub srqn: u32,
    /// `(syndrome, vendor syndrome)` for an error CQE.
    pub error: Option<(u8, u8)>,
    pub solicited: bool,
    /// l4_l3_hdr_type byte (RoCE L3 type of a UD receive).
    pub l3: u8,
    /// Data scattered to the CQE instead of the buffer (qpc `cs_res`).
    pub inline: Option<InlineScatter>,
    /// A striding RQ's WQE index (`wqe_id`).
    pub wqe_id: u16,
    /// A packet merged by LRO from several TCP segments
    /// ([`super::lro`]).
    pub lro: Option<super::lro::LroCqe>,
    /// Ethernet receives (transport/eth_rx.rs): `hds_ip_ext` (checksums
    /// good), `rss_hash_type`, `rss_hash_result`, `vlan_info`.
    pub eth: Option<EthCqe>,
}

/// What an Ethernet receive CQE carries beyond a responder CQE's fields.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EthCqe {
    pub hds_ip_ext: u8,
    pub rss_hash_type: u8,
    pub rss_hash_result: u32,
    pub vlan_info: u16,
    /// The one's-complement sum of the frame from its IP header on.
    pub check_sum: u16,
    /// `tls_outer_l3_tunneled`: `CQE_RX_TUNNEL_PACKET`, `CQE_RX_OUTER_IPV6`.
    pub tunneled: u8,
}

/// Up to 64 bytes of a message written into its CQE: 32 into the CQE's
/// first 32 bytes (CQE format 1, `MLX5_INLINE_SCATTER_32`), or 64 into
/// the first half of a 128-byte entry (format 2,
/// `MLX5_INLINE_SCATTER_64`), as rdma-core's `handle_responder` reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InlineScatter {
    pub data: [u8; 64],
    /// Bytes valid in `data`.
    pub len: u8,
}

impl Completion {
    /// A responder completion with a GRH (UD receives): the GRH flag and
    /// the RoCE v2 packet's network header (`flags_rqpn` bits 25:24, as
    /// mlx5_ib's `handle_responder` reads `wc->network_hdr_type`; ib_core
    /// then finds an IPv4 packet's addresses in the buffer's last 20
    /// bytes), and the same in `l4_l3_hdr_type`'s l3 field.
    pub(crate) fn with_grh(mut self, ipv4: bool) -> Self {
        let ty = if ipv4 {
            cqe::CQE_ROCE_L3_HEADER_TYPE_IPV4
        } else {
            cqe::CQE_ROCE_L3_HEADER_TYPE_IPV6
        };
        self.flags_rqpn |= FLAGS_GRH | ty << cqe::CQE_ROCE_L3_HEADER_TYPE_SHIFT;
        self.l3 = if ipv4 { 2 << 2 } else { 1 << 2 };
        self
    }
}

/// CQE `c` stamped `ts`, and its `op_own` without format and owner bit.
fn encode(c: &Completion, ts: u64) -> (Cqe64, u8) {
    let sop_qpn =
        u32::from(c.s_wqe_opcode) << cqe::CQE_S_WQE_OPCODE_SHIFT | (c.qpn & cqe::CQE_QPN_MASK);
    let mut e = Cqe64::new_zeroed();
    match c.error {
        Some((synd, vendor)) => {
            let err: &mut ErrCqe = zerocopy::transmute_mut!(&mut e);
            err.srqn.set(c.srqn);
            err.vendor_err_synd = vendor;
            err.syndrome = synd;
            err.s_wqe_opcode_qpn.set(sop_qpn);
        }
        None => {
            e.flags_rqpn.set(c.flags_rqpn);
            e.l4_l3_hdr_type = c.l3;
            let segs = c
                .lro
                .map_or(0, |l| u32::from(l.num_seg) << cqe::CQE_LRO_NUM_SEG_SHIFT);
            e.srqn.set(c.srqn & cqe::CQE_QPN_MASK | segs);
            if let Some(l) = c.lro {
                e.tcppsh_abort_dupack = l.tcppsh_abort_dupack;
                e.min_ttl = l.min_ttl;
                e.tcp_win.set(l.tcp_win);
                e.ack_seq_num.set(l.ack_seq_num);
            }
            e.immediate.set(c.imm);
            e.byte_cnt.set(c.byte_cnt);
            e.timestamp_h.set((ts >> 32) as u32);
            e.timestamp_l.set(ts as u32);
            e.sop_drop_qpn.set(sop_qpn);
            if let Some(x) = c.eth {
                e.hds_ip_ext = x.hds_ip_ext;
                e.rss_hash_type = x.rss_hash_type;
                e.rss_hash_result.set(x.rss_hash_result);
                e.vlan_info.set(x.vlan_info);
                e.check_sum.set(x.check_sum);
                e.tls_outer_l3_tunneled = x.tunneled;
            }
        }
    }
    e.wqe_counter.set(c.wqe_counter);
    e.wqe_id.set(c.wqe_id);
    let op_own = c.opcode << cqe::CQE_OPCODE_SHIFT | if c.solicited { cqe::CQE_SE_MASK } else { 0 };
    (e, op_own)
}

/// Whether `c` fires a CQ armed for solicited CQEs only.
fn sol(c: &Completion) -> bool {
    c.solicited
        || c.error.is_some()
        || c.opcode == CqeOpcode::ReqErr.to_raw()
        || c.opcode == CqeOpcode::RespErr.to_raw()
}

impl Cq {
    /// Raises the CQ error event (`cqn`, then the syndrome at byte 11).
    fn cq_error(&self, rdma: &Rdma, syndrome: u8) {
        let mut d = EqeCqErr::new_zeroed();
        d.cqn.set(self.cqn & EQE_RESOURCE_NUMBER_MASK);
        d.syndrome = syndrome;
        let data = zerocopy::transmute!(d);
        rdma.event(PendingEvent {
            eqn: None,
            ty: EventType::CqError.to_raw(),
            sub: 0,
            data,
        });
    }

    /// Bytes per entry (64 or 128).
    pub(crate) fn stride(&self) -> u64 {
        lock(&self.st).stride
    }

    /// The CQ stops: in error, with its event (an overrun or a faulted
    /// write, `c` the CQE that found it); false.
    fn stop(
        &self,
        rdma: &Rdma,
        mut st: std::sync::MutexGuard<'_, CqState>,
        why: Stop,
        c: Option<&Completion>,
    ) -> bool {
        st.error = true;
        drop(st);
        let syndrome = match why {
            Stop::Overrun => {
                tracing::warn!(
                    cqn = self.cqn,
                    qpn = c.map(|c| c.qpn),
                    opcode = c.map(|c| c.opcode),
                    error = ?c.and_then(|c| c.error),
                    "CQ overrun"
                );
                CQ_ERROR_OVERRUN
            }
            Stop::Fault => {
                tracing::warn!(cqn = self.cqn, "CQE write faulted");
                CQ_ERROR_ACCESS_VIOLATION
            }
        };
        self.cq_error(rdma, syndrome);
        false
    }

    /// Writes one CQE; false if the CQ overran (or is in error). An open
    /// compression session is written before it.
    pub(crate) fn push(&self, rdma: &Rdma, mem: &IovaMemory, c: &Completion) -> bool {
        let mut st = lock(&self.st);
        if st.error {
            return false;
        }
        let mut fire = match self.close_session(rdma, mem, &mut st) {
            Ok(f) => f,
            Err(why) => return self.stop(rdma, st, why, Some(c)),
        };
        let (e, op_own) = encode(c, rdma.ticks());
        match self.put(rdma, mem, &mut st, &e, op_own, c.inline.as_ref(), sol(c)) {
            Ok(f) => fire |= f,
            Err(why) => return self.stop(rdma, st, why, Some(c)),
        }
        self.fired(rdma, st, fire);
        true
    }

    /// Writes a receive CQE of an RQ whose CQEs follow as `sequel` says,
    /// delivered by `held`'s burst: on a CQ with compression, into the
    /// open session where it can join ([`cqe_comp`]); otherwise as
    /// [`Cq::push`]. False if the CQ overran (or is in error).
    pub(crate) fn push_rx(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        c: &Completion,
        sequel: Option<Sequel>,
        held: Option<Sender>,
    ) -> bool {
        let (Some(comp), Some(sequel), Some(_)) = (self.comp, sequel, held) else {
            return self.push(rdma, mem, c);
        };
        if !cqe_comp::compressible(c) {
            return self.push(rdma, mem, c);
        }
        let mut st = lock(&self.st);
        if st.error {
            return false;
        }
        let (e, _) = encode(c, rdma.ticks());
        let mut fire = false;
        // The session starts at the producer index (any other CQE closes
        // it first) and never runs past the ring's end: readers walk its
        // slots without wrapping (DPDK's vectorized `rxq_cq_decompress_v`).
        let n = 1u32 << st.log_size;
        let to_end = n - (st.pi & (n - 1));
        if let Some(s) = st.session.as_mut() {
            if (s.cqes.len() as u32) < to_end && s.join(&e, sequel, held) {
                super::eth_rx::note_held();
                if s.cqes.len() as u32 >= comp.max {
                    match self.close_session(rdma, mem, &mut st) {
                        Ok(f) => fire = f,
                        Err(why) => return self.stop(rdma, st, why, Some(c)),
                    }
                }
                self.fired(rdma, st, fire);
                return true;
            }
            match self.close_session(rdma, mem, &mut st) {
                Ok(f) => fire = f,
                Err(why) => return self.stop(rdma, st, why, Some(c)),
            }
        }
        st.session = Some(Session::start(e, sequel, held));
        rdma.cq_sessions.fetch_add(1, Ordering::AcqRel);
        super::eth_rx::note_held();
        self.fired(rdma, st, fire);
        true
    }

    /// Writes the open compression session if `burst_end` names the
    /// burst that holds it, or (`None`) if it has been idle long enough or
    /// no burst holds it; whether one stays open.
    pub(crate) fn flush_session(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        burst_end: Option<Sender>,
    ) -> bool {
        let mut st = lock(&self.st);
        let Some(s) = st.session.as_mut() else {
            return false;
        };
        match burst_end {
            Some(b) if s.held != Some(b) => return true,
            Some(_) => {}
            None if s.held.is_some() => {
                s.idle += 1;
                if s.idle < cqe_comp::HELD_IDLE_PASSES {
                    return true;
                }
            }
            None => {}
        }
        match self.close_session(rdma, mem, &mut st) {
            Ok(fire) => self.fired(rdma, st, fire),
            Err(why) => {
                self.stop(rdma, st, why, None);
            }
        }
        false
    }

    /// Raises the events of `rdma`'s armed CQs whose moderation period
    /// has run (one data-path pass; nothing to do while none waits).
    pub(crate) fn moderation_timers(rdma: &Rdma) {
        if rdma.cq_timers.load(Ordering::Acquire) == 0 {
            return;
        }
        let cqs: Vec<std::sync::Arc<Cq>> = super::rlock(&rdma.cqs).values().cloned().collect();
        for cq in cqs {
            cq.moderation_timer(rdma);
        }
    }

    /// Drops the open session unwritten (the CQ is destroyed).
    pub(crate) fn drop_session(&self, rdma: &Rdma) {
        let mut st = lock(&self.st);
        drop(self.take_session(rdma, &mut st));
    }

    /// Writes the open session, if any ([`Cq::put_session`]): whether the
    /// armed CQ fires.
    fn close_session(&self, rdma: &Rdma, mem: &IovaMemory, st: &mut CqState) -> Result<bool, Stop> {
        match self.take_session(rdma, st) {
            Some(s) => self.put_session(rdma, mem, st, s),
            None => Ok(false),
        }
    }

    /// Takes the open session out of the CQ (and the function's count).
    fn take_session(&self, rdma: &Rdma, st: &mut CqState) -> Option<Session> {
        let s = st.session.take()?;
        rdma.cq_sessions.fetch_sub(1, Ordering::AcqRel);
        Some(s)
    }

    /// Raises the completion event when a CQE written under `st` fired
    /// the armed CQ.
    fn fired(&self, rdma: &Rdma, st: std::sync::MutexGuard<'_, CqState>, fire: bool) {
        drop(st);
        if fire {
            self.completion_event(rdma);
        }
    }

    /// Free slots of the ring, the consumer counter read again when fewer
    /// than `want`.
    fn room(&self, mem: &IovaMemory, st: &mut CqState, want: u32) -> u32 {
        let n = 1u32 << st.log_size;
        let used = st.pi.wrapping_sub(st.ci) & 0xff_ffff;
        if n.saturating_sub(used) >= want {
            return n - used;
        }
        if let Ok(ci) = mem::load_be32(mem, self.dbr) {
            st.ci = ci & 0xff_ffff;
        }
        n.saturating_sub(st.pi.wrapping_sub(st.ci) & 0xff_ffff)
    }

    /// Where the 64-byte CQE of ring slot `pi` lies (the second half of a
    /// 128-byte entry).
    fn slot(st: &CqState, pi: u32) -> Option<u64> {
        let index = pi & ((1u32 << st.log_size) - 1);
        st.buf
            .addr(u64::from(index) * st.stride + (st.stride - cqe::CQE_SIZE as u64))
    }

    /// Writes CQE `e` at the producer index: `op_own` (opcode and `se`;
    /// the format and owner bit added here) last; `inline`: data scattered
    /// to the CQE. Whether the armed CQ fires (`sol`: a solicited or error
    /// CQE).
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        st: &mut CqState,
        e: &Cqe64,
        op_own: u8,
        inline: Option<&InlineScatter>,
        sol: bool,
    ) -> Result<bool, Stop> {
        if self.room(mem, st, 1) == 0 {
            return Err(Stop::Overrun);
        }
        let at = Self::slot(st, st.pi).ok_or(Stop::Fault)?;
        let owner = ((st.pi >> st.log_size) & 1) as u8;
        let mut e = *e;
        let format = match inline {
            Some(s) if s.len > 32 && st.stride >= 128 => {
                // The entry's first 64 bytes, before the CQE itself.
                mem::write(mem, at - 64, &s.data).map_err(|_| Stop::Fault)?;
                cqe::CQE_FORMAT_INLINE_DATA64_SEG
            }
            Some(s) => {
                e.as_mut_bytes()[..32].copy_from_slice(&s.data[..32]);
                cqe::CQE_FORMAT_INLINE_DATA32_SEG
            }
            None => cqe::CQE_FORMAT_NO_INLINE_DATA,
        };
        let op_own = op_own | format << cqe::CQE_FORMAT_SHIFT | owner;
        // Everything but op_own, then op_own (the owner bit) last.
        let body = &e.as_bytes()[..cqe::CQE_OP_OWN_OFFSET];
        if mem::write(mem, at, body).is_err()
            || mem::store_u8_release(mem, at + OP_OWN_AT, op_own).is_err()
        {
            return Err(Stop::Fault);
        }
        st.pi = st.pi.wrapping_add(1);
        rdma.counters.cqes.fetch_add(1, Ordering::Relaxed);
        if sol {
            st.last_sol = st.pi;
        }
        Ok(self.arm_fires(rdma, st, sol))
    }

    /// Whether the armed CQ fires on a CQE just written (disarming it):
    /// at once for an arm on solicited CQEs that this one answers, else
    /// as moderation allows (`sol`: a solicited or error CQE).
    fn arm_fires(&self, rdma: &Rdma, st: &mut CqState, sol: bool) -> bool {
        st.since_event = st.since_event.saturating_add(1);
        let fire = match st.armed {
            Some(false) => (sol && st.sol_breaks) || Self::moderation_done(rdma, st),
            Some(true) => sol,
            None => false,
        };
        if fire {
            Self::event_raised(rdma, st);
        }
        fire
    }

    /// Whether an armed CQ's moderation lets its event go now; if only
    /// its period holds it, the period's timer is set.
    fn moderation_done(rdma: &Rdma, st: &mut CqState) -> bool {
        if st.period == 0 && st.max_count == 0 {
            return true;
        }
        if st.max_count != 0 && st.since_event >= u32::from(st.max_count) {
            return true;
        }
        if st.period == 0 {
            return false;
        }
        let now = rdma.clock.now();
        let first = *st.first_cqe.get_or_insert(now);
        let start = match (st.period_from_cqe, st.last_event) {
            (false, Some(e)) => e,
            _ => first,
        };
        let at = later(start, Duration::from_micros(u64::from(st.period)));
        if now >= at {
            return true;
        }
        if st.timer.is_none() {
            st.timer = Some(Deadline::until(&rdma.clock, at, CQ_MODERATION));
            rdma.cq_timers.fetch_add(1, Ordering::AcqRel);
        }
        false
    }

    /// The completion event is raised (or the arm answered): disarmed,
    /// moderation starts again.
    fn event_raised(rdma: &Rdma, st: &mut CqState) {
        st.armed = None;
        st.since_event = 0;
        st.first_cqe = None;
        if st.period != 0 {
            st.last_event = Some(rdma.clock.now());
        }
        Self::cancel_timer(rdma, st);
    }

    /// Drops the moderation timer, if set.
    fn cancel_timer(rdma: &Rdma, st: &mut CqState) {
        if st.timer.take().is_some() {
            rdma.cq_timers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Raises the event whose moderation period has run.
    fn moderation_timer(&self, rdma: &Rdma) {
        let mut st = lock(&self.st);
        if !st.timer.as_ref().is_some_and(Deadline::passed) {
            return;
        }
        let fire = st.armed == Some(false) && !st.error;
        Self::event_raised(rdma, &mut st);
        self.fired(rdma, st, fire);
    }

    /// The CQ is destroyed: its moderation timer goes.
    pub(crate) fn drop_timer(&self, rdma: &Rdma) {
        Self::cancel_timer(rdma, &mut lock(&self.st));
    }

    /// Writes compression session `s` ([`cqe_comp`]): one CQE alone as
    /// itself, more as a title and mini CQE arrays. Where the ring has
    /// room for fewer, those are written and the CQ overruns.
    fn put_session(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        st: &mut CqState,
        s: Session,
    ) -> Result<bool, Stop> {
        let Some(comp) = self.comp else {
            return Err(Stop::Fault);
        };
        let want = s.cqes.len() as u32;
        let n = self.room(mem, st, want).min(want);
        let op = CqeOpcode::RespSend.to_raw() << cqe::CQE_OPCODE_SHIFT;
        let fire = match n {
            0 => return Err(Stop::Overrun),
            1 => self.put(rdma, mem, st, &s.cqes[0], op, None, false)?,
            _ => {
                let cqes = &s.cqes[..n as usize];
                for k in 0..(n as usize).div_ceil(cqe::MINI_CQE_ARRAY_SIZE) {
                    let at = Self::slot(st, st.pi.wrapping_add(cqe_comp::array_slot(k)))
                        .ok_or(Stop::Fault)?;
                    mem::write(mem, at, &cqe_comp::mini_array(cqes, k, comp.format))
                        .map_err(|_| Stop::Fault)?;
                }
                let at = Self::slot(st, st.pi).ok_or(Stop::Fault)?;
                let owner = ((st.pi >> st.log_size) & 1) as u8;
                let t = cqe_comp::title(&cqes[0], n);
                let op_own = op | cqe::CQE_FORMAT_COMPRESSED << cqe::CQE_FORMAT_SHIFT | owner;
                if mem::write(mem, at, &t.as_bytes()[..cqe::CQE_OP_OWN_OFFSET]).is_err()
                    || mem::store_u8_release(mem, at + OP_OWN_AT, op_own).is_err()
                {
                    return Err(Stop::Fault);
                }
                st.pi = st.pi.wrapping_add(n);
                let c = &rdma.counters;
                c.cqes.fetch_add(u64::from(n), Ordering::Relaxed);
                c.cqes_compressed.fetch_add(u64::from(n), Ordering::Relaxed);
                c.compressed_sessions.fetch_add(1, Ordering::Relaxed);
                st.since_event = st.since_event.saturating_add(n - 1);
                self.arm_fires(rdma, st, false)
            }
        };
        tracing::trace!(cqn = self.cqn, cqes = n, "compressed session");
        if n < want {
            return Err(Stop::Overrun);
        }
        Ok(fire)
    }

    /// MODIFY_CQ's resize to `log_size` entries of `stride` bytes in
    /// `buf`: a RESIZE_CQ CQE goes into the old ring at the producer index
    /// (the old ring's owner bit), and the CQEs after it into the new ring
    /// from the next index on. The consumer copies what it had not polled
    /// into the new ring up to that CQE (libmlx5's
    /// `mlx5_cq_resize_copy_cqes`, mlx5_ib's `copy_resize_cqes`), each one
    /// index later. Refused if the new ring cannot hold what is
    /// outstanding, or the old one has no room for the RESIZE_CQ CQE.
    /// An open compression session is written into the old ring first.
    pub(crate) fn resize(
        &self,
        rdma: &Rdma,
        mem: &IovaMemory,
        log_size: u8,
        stride: u64,
        buf: Buf,
    ) -> Result<(), ResizeError> {
        let mut st = lock(&self.st);
        if st.error {
            return Err(ResizeError::InError);
        }
        let fire = match self.close_session(rdma, mem, &mut st) {
            Ok(f) => f,
            Err(why) => {
                self.stop(rdma, st, why, None);
                return Err(ResizeError::InError);
            }
        };
        if let Ok(ci) = mem::load_be32(mem, self.dbr) {
            st.ci = ci & 0xff_ffff;
        }
        let outstanding = st.pi.wrapping_sub(st.ci) & 0xff_ffff;
        if outstanding >= 1 << st.log_size || outstanding >= 1 << log_size {
            return Err(ResizeError::TooSmall);
        }
        let n = 1u32 << st.log_size;
        let at = st
            .buf
            .addr(u64::from(st.pi & (n - 1)) * st.stride + (st.stride - cqe::CQE_SIZE as u64))
            .ok_or(ResizeError::Fault)?;
        let owner = ((st.pi >> st.log_size) & 1) as u8;
        let e = Cqe64::new_zeroed();
        let op_own = CqeOpcode::ResizeCq.to_raw() << cqe::CQE_OPCODE_SHIFT | owner;
        mem::write(mem, at, &e.as_bytes()[..cqe::CQE_OP_OWN_OFFSET])
            .and_then(|()| mem::store_u8_release(mem, at + OP_OWN_AT, op_own))
            .map_err(|_| ResizeError::Fault)?;
        tracing::debug!(
            cqn = self.cqn,
            from = st.log_size,
            to = log_size,
            pi = st.pi,
            "CQ resized"
        );
        st.pi = st.pi.wrapping_add(1);
        st.log_size = log_size;
        st.stride = stride;
        st.buf = buf;
        self.fired(rdma, st, fire);
        Ok(())
    }

    fn completion_event(&self, rdma: &Rdma) {
        tracing::trace!(cqn = self.cqn, "completion event");
        let mut d = EqeComp::new_zeroed();
        d.cqn.set(self.cqn & EQE_RESOURCE_NUMBER_MASK);
        let data = zerocopy::transmute!(d);
        rdma.event(PendingEvent {
            eqn: Some(self.eqn),
            ty: EventType::Comp.to_raw(),
            sub: 0,
            data,
        });
    }

    /// An arm word (`sn << 28 | cmd << 24 | ci`): the next CQE (cmd 0) or
    /// the next solicited or error CQE (cmd 1) after `ci` raises an event;
    /// one already there raises it now.
    pub(crate) fn arm(&self, rdma: &Rdma, word: u32) {
        let mut st = lock(&self.st);
        // An arm repeating the last one's word (same cmd_sn and consumer
        // index) is stale: the same request seen twice, through the UAR
        // and the doorbell-record sweep. It is ignored, as the hardware
        // ignores an arm whose cmd_sn it already acted on, so one arm
        // gives at most one completion event.
        tracing::trace!(cqn = self.cqn, word = format_args!("{word:#x}"), last = ?st.last_arm, pi = st.pi, "arm");
        if st.last_arm == Some(word) {
            return;
        }
        st.last_arm = Some(word);
        let ci = word & 0xff_ffff;
        let sol_only = (word >> 24) & 0xf == 1;
        let pending = if sol_only {
            st.last_sol.wrapping_sub(ci) & 0xff_ffff != 0
                && st.last_sol.wrapping_sub(ci) & 0xff_ffff <= st.pi.wrapping_sub(ci) & 0xff_ffff
        } else {
            st.pi.wrapping_sub(ci) & 0xff_ffff != 0
        };
        if pending {
            Self::event_raised(rdma, &mut st);
            drop(st);
            self.completion_event(rdma);
        } else {
            // Nothing after `ci`: a period set for CQEs the consumer has
            // since polled waits for the next CQE instead.
            Self::cancel_timer(rdma, &mut st);
            st.first_cqe = None;
            st.armed = Some(sol_only);
        }
    }

    /// Reads the arm word of the doorbell record (a UAR arm overwritten by
    /// another before the worker saw it).
    pub(crate) fn sweep_arm(&self, rdma: &Rdma, mem: &IovaMemory) {
        let Ok(word) = mem::load_be32(mem, self.dbr + 4) else {
            return;
        };
        let last = lock(&self.st).last_arm;
        if Some(word) != last && word != 0 {
            tracing::trace!(
                cqn = self.cqn,
                dbr = format_args!("{:#x}", self.dbr),
                word = format_args!("{word:#x}"),
                "arm from the doorbell record"
            );
            self.arm(rdma, word);
        }
    }
}
