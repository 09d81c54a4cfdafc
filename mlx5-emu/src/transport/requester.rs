//! The requester: a QP's send queue executed from its doorbell record.
//!
//! WQEs are read by DMA from the send queue (control segment, then the
//! remote-address, atomic or datagram segment the opcode calls for, then
//! data or inline segments), local keys are checked (PD, local read or
//! write, bounds), and the message goes out as packets of at most the path
//! MTU. RC SENDs and WRITEs go out back to back and their ACKs are
//! coalesced: the responder answers once the burst ends (or every
//! [`super::responder::ACK_COALESCE`] messages), and one ACK completes
//! every message up to its PSN, in order. A READ, an atomic or a NOP waits
//! for the messages before it to be acknowledged, then for its own
//! response (they come back synchronously, see [`crate::fabric`]; read
//! responses in PSN order: after a gap the READ counts as unanswered). A NAK
//! acknowledges what precedes its PSN; a PSN sequence error NAK sends the
//! queue back to the oldest unacknowledged message at once, an RNR NAK or
//! silence leaves the unacknowledged WQE at the head with a timer (the RNR
//! timer, the ACK timeout), until `rnr_retry` or `retry_count` is used up. A WQE that fails completes
//! with an error CQE and moves the QP to ERR (RC) or SQE (UC, UD); in ERR
//! every posted WQE, send and receive, completes as flushed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_hw::cqe::{CqeOpcode, CqeSyndrome};
use mlx5_hw::ifc::{wqe_datagram_seg, wqe_xrc_seg, WqeDatagramSeg};
use mlx5_hw::wqe::{WqeOpcode, INLINE_SEG, WQE_INLINE_SEG_BYTE_COUNT_MASK};
use vfio::IovaMemory;
use vm_memory::{GuestAddress, GuestMemoryBackend, VolatileSlice};
use zerocopy::FromBytes;

use super::cq::{Completion, InlineScatter};
use super::dc::{self, DcLink, Target};
use super::mem::{self, access, Extent, Hinted, KeyError};
use super::packet::{self, aeth, op, svc, AtomicEth, Bth, Deth, Headers, Reth, RoceAddr};
use super::qp::{self, state, Peer, Qp, Retry, Sq};
use super::{rlock, Rdma};
use crate::fabric::{self, Dest, Packet, Payload};
use crate::lock;
use crate::wire::Until;

/// Largest message (`log_max_msg` = 30).
pub(crate) const MAX_MSG: u64 = 1 << 30;

/// Vendor syndromes of the error CQEs this model writes (stable values).
pub(crate) mod vendor {
    pub const BAD_LKEY: u8 = 0x51;
    pub const PD_MISMATCH: u8 = 0x52;
    pub const NO_ACCESS: u8 = 0x53;
    pub const OUT_OF_BOUNDS: u8 = 0x54;
    pub const LENGTH: u8 = 0x55;
    pub const OPCODE: u8 = 0x56;
    pub const WQE_FAULT: u8 = 0x57;
    pub const DMA_FAULT: u8 = 0x58;
    /// A page not present (ODP) that no page-fault EQ takes, or whose
    /// fault the driver resumed with an error.
    pub const PAGE_FAULT: u8 = 0x59;
    pub const NAK: u8 = 0x60;
    pub const RNR_EXCEEDED: u8 = 0x61;
    pub const RETRY_EXCEEDED: u8 = 0x62;
    pub const FLUSH: u8 = 0xf9;
}

/// What became of a WQE.
enum Outcome {
    Done(u32),
    /// RC: sent, its ACK owed (coalesced): length, first and last PSN.
    Sent(u32, u32, u32),
    Retry(Instant),
    Error(CqeSyndrome, u8),
    /// A page of the WQE's local data is not present (ODP): the page-fault
    /// type (`MLX5_WQE_PF_TYPE_REQ_*`).
    PageFault(u8),
}

/// `a` is at or before `b` in PSN order (24-bit, half the space ahead).
fn psn_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) & 0xff_ffff < 0x80_0000
}

/// The WQE an outcome belongs to: index, basic blocks, opcode, signaled.
#[derive(Clone, Copy)]
struct Head {
    index: u16,
    nbb: u16,
    opcode: u8,
    signaled: bool,
}

impl Head {
    /// The head of WQE `w` at index `ci`; one that could not be read is
    /// one signaled basic block.
    fn of(w: Option<&Wqe>, ci: u16) -> Self {
        match w {
            Some(w) => Head {
                index: w.index,
                nbb: w.nbb,
                opcode: w.opcode.to_raw(),
                signaled: w.signaled,
            },
            None => Head {
                index: ci,
                nbb: 1,
                opcode: 0,
                signaled: true,
            },
        }
    }
}

/// The RNR timer (IBTA table 45), in microseconds.
pub(crate) fn rnr_timer_us(code: u8) -> u64 {
    const T: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
        5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
        245_760, 327_680, 491_520,
    ];
    T[usize::from(code & 31)]
}

/// The local ACK timeout: 4.096 us << ack_timeout (0: none).
fn ack_timeout(code: u8) -> Option<Duration> {
    (code != 0).then(|| Duration::from_nanos(4096u64 << code.min(31)))
}

pub(crate) fn key_error(e: KeyError) -> u8 {
    match e {
        KeyError::Invalid => vendor::BAD_LKEY,
        KeyError::Pd => vendor::PD_MISMATCH,
        KeyError::Access => vendor::NO_ACCESS,
        KeyError::Bounds => vendor::OUT_OF_BOUNDS,
        KeyError::NotPresent => vendor::PAGE_FAULT,
    }
}

/// A parsed send WQE.
struct Wqe {
    opcode: WqeOpcode,
    index: u16,
    nbb: u16,
    signaled: bool,
    solicited: bool,
    imm: u32,
    raddr: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
    av: Option<Av>,
    /// An XRC initiator's WQE: the XRC SRQ it names (`mlx5_wqe_xrc_seg`).
    xrc_srqn: Option<u32>,
    /// Message length.
    len: u64,
    inline: bool,
}

impl Wqe {
    /// A place to parse WQEs into.
    const EMPTY: Self = Self {
        opcode: WqeOpcode::Nop,
        index: 0,
        nbb: 0,
        signaled: false,
        solicited: false,
        imm: 0,
        raddr: 0,
        rkey: 0,
        swap_add: 0,
        compare: 0,
        av: None,
        xrc_srqn: None,
        len: 0,
        inline: false,
    };
}

#[derive(Clone, Copy)]
struct Av {
    qkey: u32,
    /// The whole `key` union: a DC WQE's DC access key.
    dc_key: u64,
    dqpn: u32,
    rmac: [u8; 6],
    tclass: u8,
    hop_limit: u8,
    sgid_index: u8,
    flow_label: u32,
    udp_sport: u16,
    rgid: [u8; 16],
}

#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}
#[inline]
fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// Runs what a QP's send side has to do; true if it did something.
pub(crate) fn run(rdma: &Rdma, qp: &Arc<Qp>, mem: &IovaMemory) -> bool {
    if qp.no_sq {
        // No send side (an XRC target).
        return qp.state() == state::ERR && flush_rq(rdma, qp, mem);
    }
    match qp.state() {
        state::RTS => execute(rdma, qp, mem),
        state::ERR => {
            let a = flush_sq(rdma, qp, mem);
            let b = flush_rq(rdma, qp, mem);
            a || b
        }
        state::SQER => flush_sq(rdma, qp, mem),
        _ => false,
    }
}

/// The producer counter when the send queue has work: WQEs posted, or
/// messages sent and not yet acknowledged; `None` while its retry timer
/// runs, and for an idle queue (thousands of them in a sweep), before
/// anything of a burst is set up.
fn work(rdma: &Rdma, qp: &Qp, sq: &mut Sq, mem: &IovaMemory) -> Option<u16> {
    if let Some(r) = sq.retry {
        if rdma.clock.now() < r.at {
            rdma.timer(qp.qpn, r.at);
            return None;
        }
        sq.retry = None;
    }
    if rdma.odp.requester_waits(qp.qpn) {
        // A page fault holds the queue until PAGE_FAULT_RESUME.
        return None;
    }
    let pi = qp.sq_pi(mem).ok()?;
    (sq.ci != pi || !sq.unacked.is_empty()).then_some(pi)
}

fn execute(rdma: &Rdma, qp: &Arc<Qp>, mem: &IovaMemory) -> bool {
    let mut sq = lock(&qp.sq);
    let Some(pi) = work(rdma, qp, &mut sq, mem) else {
        return false;
    };
    if sq.ci != pi {
        if let Some(p) = sq.peer.as_mut() {
            // The remote memory as it is now, for this burst.
            p.mem = p.rdma.dma.memory();
        }
    }
    let dmem = sq.peer.as_ref().map(|p| p.mem.clone());
    let dh = dmem.as_deref().map(Hinted::new);
    let sh = Hinted::new(mem);
    let burst = Burst {
        src: &sh,
        dst: dh.as_ref().zip(dmem.as_ref()),
    };
    let mut busy = false;
    let mut s = Scratch {
        wqe: [0u8; mlx5_hw::wqe::SEND_WQE_MAX_SIZE],
        w: Wqe::EMPTY,
        run: Run::default(),
        slow_at: None,
        sqs: sq_ring(qp, mem),
        pi,
    };
    loop {
        if sq.ci == pi || qp.state() != state::RTS {
            // The burst ends: the responder sends the ACK it holds back.
            if !sq.unacked.is_empty() && !drain(rdma, qp, &mut sq, mem) {
                rewind(rdma, qp, &mut sq, mem, None);
            }
            // An idle DCI disconnects.
            dci_disconnect(rdma, qp, &mut sq);
            break;
        }
        busy = true;
        let ci = sq.ci;
        let parsed = read_wqe(qp, mem, s.sqs.as_ref(), ci, pi, &mut s.wqe, &mut s.w);
        // Only RC SENDs and WRITEs (a DCI's to the target it is connected
        // to) complete by a later, coalesced ACK; anything else completes
        // after the messages before it.
        let target = parsed
            .is_ok()
            .then(|| dci_target(qp, &s.w, &s.wqe))
            .flatten();
        let same = target.is_some() && sq.dc.conn.map(|c| c.0) == target;
        let coalesced = (qp.st == qp::st::RC || qp.st == qp::st::XRC || same)
            && parsed.is_ok()
            && matches!(
                s.w.opcode,
                WqeOpcode::Send
                    | WqeOpcode::SendImm
                    | WqeOpcode::SendInval
                    | WqeOpcode::RdmaWrite
                    | WqeOpcode::RdmaWriteImm
            );
        if !coalesced && !sq.unacked.is_empty() {
            if !drain(rdma, qp, &mut sq, mem) {
                rewind(rdma, qp, &mut sq, mem, None);
                break;
            }
            if qp.state() != state::RTS {
                break;
            }
        }
        if target.is_some() && !same {
            // The DCI's next target: it leaves the one it is connected to.
            dci_disconnect(rdma, qp, &mut sq);
        }
        let (head, outcome) = match parsed {
            Ok(()) => {
                let head = Head::of(Some(&s.w), ci);
                match take_wqe(rdma, qp, &mut sq, mem, &burst, &mut s) {
                    Step::One(o) => (head, o),
                    // It went in a run, with the WQEs after it.
                    Step::Run => continue,
                    Step::Stop => break,
                }
            }
            Err(v) => (
                Head::of(None, ci),
                Outcome::Error(CqeSyndrome::LocalQpOpErr, v),
            ),
        };
        // What this exchange acknowledged of the messages before it.
        let acked = sq.acked.take();
        if !sq.unacked.is_empty() && !settle(rdma, qp, &mut sq, mem, acked) {
            break;
        }
        if let Outcome::Sent(bytes, first_psn, last_psn) = outcome {
            sq.ci = ci.wrapping_add(head.nbb);
            sq.unacked.push_back(qp::Unacked {
                index: head.index,
                nbb: head.nbb,
                opcode: head.opcode,
                signaled: head.signaled,
                bytes,
                first_psn,
                last_psn,
            });
            // Across a link, at most a window in flight.
            if window_full(&sq) && !drain(rdma, qp, &mut sq, mem) {
                rewind(rdma, qp, &mut sq, mem, None);
                break;
            }
            continue;
        }
        if !sq.unacked.is_empty() {
            // This WQE's fate is known but earlier messages are still
            // unacknowledged (a packet was lost): they go first.
            if let Outcome::Retry(at) = outcome {
                // A PSN sequence NAK: resend from the oldest.
                rewind(rdma, qp, &mut sq, mem, Some(at));
                break;
            }
            if !drain(rdma, qp, &mut sq, mem) {
                rewind(rdma, qp, &mut sq, mem, None);
                break;
            }
        }
        if !finish(rdma, qp, &mut sq, mem, head, outcome) {
            break;
        }
    }
    flush_tally(rdma, &sq);
    busy
}

/// The send queue when it is in one piece of memory (looked up once per
/// burst).
fn sq_ring<'m>(qp: &Qp, mem: &'m IovaMemory) -> Option<VolatileSlice<'m>> {
    let sq_bytes = u64::from(qp.sq_entries()) * 64;
    let b = qp.buf.contig?;
    if qp.sq_offset + sq_bytes > (qp.buf.pas.len() as u64) << qp.buf.log_page {
        return None;
    }
    mem.get_slice(GuestAddress(b + qp.sq_offset), sq_bytes as usize)
        .ok()
}

/// What a burst parses WQEs into and runs collect in (no move of them
/// per WQE), and where it reads them: the send queue in one piece of
/// memory, if it is, and the producer counter.
struct Scratch<'m> {
    wqe: [u8; mlx5_hw::wqe::SEND_WQE_MAX_SIZE],
    w: Wqe,
    run: Run<'m>,
    /// The WQE a run's responder did not take: it goes on its own.
    slow_at: Option<u16>,
    sqs: Option<VolatileSlice<'m>>,
    pi: u16,
}

/// What became of a WQE [`take_wqe`] was given.
enum Step {
    /// Its outcome.
    One(Outcome),
    /// It went in a run of WRITEs, with those after it ([`write_run`]).
    Run,
    /// The queue stops (a run met a CQ overrun).
    Stop,
}

/// Executes the WQE parsed into `s` (at the consumer counter): alone, or
/// as the first of a run of single-packet WRITEs.
fn take_wqe<'m>(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    mem: &IovaMemory,
    burst: &Burst<'m>,
    s: &mut Scratch<'m>,
) -> Step {
    if let Some(o) = dci_flushed(qp, sq, &s.wqe) {
        return Step::One(o);
    }
    if let Err(o) = prepare(rdma, qp, sq, mem, &mut s.w, &s.wqe) {
        return Step::One(o);
    }
    if s.slow_at == Some(sq.ci) || !run_start(rdma, qp, sq, burst, &s.w, &mut s.run) {
        return Step::One(send_wqe(rdma, qp, sq, mem, burst, &s.w));
    }
    let go = Ahead {
        sqs: s.sqs.as_ref(),
        pi: s.pi,
    };
    if !write_run(
        rdma,
        qp,
        sq,
        mem,
        burst,
        go,
        (&mut s.wqe, &mut s.w),
        &mut s.run,
    ) {
        return Step::Stop;
    }
    s.slow_at = s.run.refused;
    Step::Run
}

/// Whether the messages in flight to a peer across a link fill its
/// window ([`crate::wire::WINDOW`] messages, or the link's packets).
fn window_full(sq: &Sq) -> bool {
    let Some(l) = sq.peer.as_ref().and_then(|p| p.link.as_ref()) else {
        return false;
    };
    let (Some(first), Some(last)) = (sq.unacked.front(), sq.unacked.back()) else {
        return false;
    };
    let packets = last.last_psn.wrapping_sub(first.first_psn) & 0xff_ffff;
    sq.unacked.len() >= crate::wire::WINDOW || packets + 1 >= l.window_packets()
}

/// Applies a WQE's final outcome (CQE, counters, state); false when the
/// queue stops here (retry timer, error).
fn finish(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    mem: &IovaMemory,
    head: Head,
    outcome: Outcome,
) -> bool {
    match outcome {
        Outcome::Done(bytes) | Outcome::Sent(bytes, _, _) => {
            sq.ci = head.index.wrapping_add(head.nbb);
            complete(rdma, qp, sq, mem, head, bytes)
        }
        Outcome::PageFault(ty) => {
            let f = super::odp::WqeFault {
                qpn: qp.qpn,
                wq: qp.qpn,
                wqe_index: head.index,
                ty,
                side: super::odp::Side::Requester,
                packet_length: 0,
            };
            if rdma.wqe_fault(f) == super::odp::Hold::Failed {
                let o = Outcome::Error(CqeSyndrome::LocalProtErr, vendor::PAGE_FAULT);
                return finish(rdma, qp, sq, mem, head, o);
            }
            // Held at this WQE (nothing of it went out) until the resume.
            false
        }
        Outcome::Retry(at) => {
            sq.retry = Some(Retry { at });
            rdma.counters.retries.fetch_add(1, Ordering::Relaxed);
            rdma.timer(qp.qpn, at);
            false
        }
        Outcome::Error(synd, v) => {
            flush_tally(rdma, sq);
            sq.cqe_data = None;
            sq.ci = head.index.wrapping_add(head.nbb);
            let c = Completion {
                opcode: CqeOpcode::ReqErr.to_raw(),
                qpn: qp.qpn,
                srqn: qp.cqe_srqn(),
                wqe_counter: head.index,
                s_wqe_opcode: head.opcode,
                error: Some((synd.to_raw(), v)),
                ..Completion::default()
            };
            rdma.counters.error_cqes.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(qpn = qp.qpn, %synd, vendor = v, "requester error");
            qp.scq.push(rdma, mem, &c);
            if qp.st == qp::st::DCI {
                return dci_failed(rdma, qp, sq);
            }
            if matches!(qp.st, qp::st::RC | qp::st::XRC | qp::st::REG_UMR) {
                qp.to_error(rdma);
            } else {
                qp.set_state(state::SQER);
                rdma.attend(qp.qpn);
            }
            false
        }
    }
}

/// A WQE completed successfully: counters, and its CQE if signaled; false
/// if the CQ overran (the QP is then in error).
fn complete(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    mem: &IovaMemory,
    head: Head,
    bytes: u32,
) -> bool {
    sq.retries_left = sq.retry_count;
    sq.rnr_left = sq.rnr_retry;
    sq.tally.messages.set(sq.tally.messages.get() + 1);
    let inline = sq.cqe_data.take();
    if head.signaled {
        flush_tally(rdma, sq);
        let c = Completion {
            opcode: CqeOpcode::Req.to_raw(),
            qpn: qp.qpn,
            srqn: qp.cqe_srqn(),
            wqe_counter: head.index,
            s_wqe_opcode: head.opcode,
            byte_cnt: bytes,
            inline,
            ..Completion::default()
        };
        if !qp.scq.push(rdma, mem, &c) {
            qp.to_error(rdma);
            rdma.qp_event(mlx5_hw::event::EventType::WqCatasError, qp.qpn, false);
            return false;
        }
    }
    true
}

/// Adds the burst's tally to the counters (this function's, and the
/// peer's packets received).
fn flush_tally(rdma: &Rdma, sq: &Sq) {
    let t = &sq.tally;
    let (p, b, m) = (t.packets.take(), t.bytes.take(), t.messages.take());
    let c = &rdma.counters;
    if m != 0 {
        c.messages_sent.fetch_add(m, Ordering::Relaxed);
    }
    if p != 0 {
        c.packets_sent.fetch_add(p, Ordering::Relaxed);
        c.bytes_sent.fetch_add(b, Ordering::Relaxed);
        if let Some(peer) = sq.peer.as_ref().filter(|p| p.link.is_none()) {
            peer.rdma
                .counters
                .packets_received
                .fetch_add(p, Ordering::Relaxed);
            peer.rdma
                .counters
                .bytes_received
                .fetch_add(b, Ordering::Relaxed);
        }
    }
}

/// Completes, in order, the unacknowledged messages up to PSN `acked`;
/// false if the CQ overran (the rest are then left for the flush).
fn settle(rdma: &Rdma, qp: &Arc<Qp>, sq: &mut Sq, mem: &IovaMemory, acked: Option<u32>) -> bool {
    let Some(p) = acked else {
        return true;
    };
    while let Some(u) = sq.unacked.front().copied() {
        if !psn_le(u.last_psn, p) {
            break;
        }
        sq.unacked.pop_front();
        let head = Head {
            index: u.index,
            nbb: u.nbb,
            opcode: u.opcode,
            signaled: u.signaled,
        };
        if !complete(rdma, qp, sq, mem, head, u.bytes) {
            // Flushed from the oldest not completed.
            if let Some(n) = sq.unacked.front() {
                sq.ci = n.index;
            }
            sq.unacked.clear();
            return false;
        }
    }
    true
}

/// Asks the responder for the ACK it holds back and completes what it
/// acknowledges; true if nothing is left unacknowledged.
fn drain(rdma: &Rdma, qp: &Arc<Qp>, sq: &mut Sq, mem: &IovaMemory) -> bool {
    let mut ans = Answer::default();
    if let Some(p) = &sq.peer {
        let reply = &mut |r: &Packet<'_>| note(&mut ans, r, 0, 0, mem, &[]);
        match (&p.link, sq.unacked.back()) {
            // Across a link: the ACK of the last message in flight.
            (Some(l), Some(u)) => l.collect(rdma, qp.qpn, Until::Ack(u.last_psn), reply),
            (Some(_), None) => {}
            (None, _) if qp.st == qp::st::DCI => {
                let ids = (sq.remote_qpn, qp.qpn);
                fabric::dc_drained(rdma, &p.rdma, &p.addr, ids, false, reply);
            }
            (None, _) => fabric::drained(rdma, &p.rdma, &p.addr, sq.remote_qpn, reply),
        }
    }
    if ans.acks != 0 {
        rdma.counters.acks.fetch_add(ans.acks, Ordering::Relaxed);
    }
    if !settle(rdma, qp, sq, mem, ans.acked) {
        return false;
    }
    if sq.unacked.is_empty() {
        return true;
    }
    nak_at_drain(rdma, qp, sq, mem, &ans);
    false
}

/// A NAK or an RNR NAK that came while the burst waited for its ACK (the
/// responses from across a link come when they come): it names the oldest
/// message still unacknowledged, which then meets the NAK's outcome as it
/// would have on its own (go back now, after the RNR timer, or an error
/// CQE); nothing to do without one (the caller's ACK timeout follows).
fn nak_at_drain(rdma: &Rdma, qp: &Arc<Qp>, sq: &mut Sq, mem: &IovaMemory, ans: &Answer) {
    let Some(u) = sq.unacked.front().copied() else {
        return;
    };
    let o = match (ans.nak, ans.rnr) {
        (Some(code), _) => nak_outcome(rdma, sq, u.first_psn, code),
        (None, Some(t)) => rnr_outcome(rdma, qp, sq, u.first_psn, t),
        (None, None) => return,
    };
    match o {
        Outcome::Retry(at) => rewind(rdma, qp, sq, mem, Some(at)),
        o => {
            sq.unacked.clear();
            sq.ci = u.index;
            let head = Head {
                index: u.index,
                nbb: u.nbb,
                opcode: u.opcode,
                signaled: u.signaled,
            };
            finish(rdma, qp, sq, mem, head, o);
        }
    }
}

/// Nobody acknowledged the oldest unacknowledged message (or a PSN
/// sequence NAK named it): the send queue goes back to it, after the ACK
/// timeout (or at `at`, a timer already counted).
fn rewind(rdma: &Rdma, qp: &Arc<Qp>, sq: &mut Sq, mem: &IovaMemory, at: Option<Instant>) {
    let Some(u) = sq.unacked.front().copied() else {
        return;
    };
    sq.unacked.clear();
    sq.ci = u.index;
    sq.psn = u.first_psn;
    let head = Head {
        index: u.index,
        nbb: u.nbb,
        opcode: u.opcode,
        signaled: u.signaled,
    };
    let o = match at {
        Some(at) => Outcome::Retry(at),
        None => {
            flush_tally(rdma, sq);
            sq.peer = None;
            retry_after_timeout(rdma, sq, u.first_psn)
        }
    };
    finish(rdma, qp, sq, mem, head, o);
}

/// Reads basic block `i` of the send queue (`sqs`: the whole queue).
fn read_bb(
    qp: &Qp,
    mem: &IovaMemory,
    sqs: Option<&VolatileSlice<'_>>,
    i: u16,
    out: &mut [u8],
) -> Result<(), u8> {
    if let Some(s) = sqs {
        let off = (usize::from(i) & (qp.sq_entries() as usize - 1)) * 64;
        s.subslice(off, 64)
            .map_err(|_| vendor::WQE_FAULT)?
            .copy_to(out);
        return Ok(());
    }
    let at = qp.sq_bb(i).ok_or(vendor::WQE_FAULT)?;
    mem::read(mem, at, out).map_err(|_| vendor::WQE_FAULT)
}

/// The WQE at `ci`, which must end at or before the producer counter
/// `pi`: a WQE that reaches past it (the driver rang before writing all of
/// it, or its ds count is garbage) is malformed.
fn read_wqe(
    qp: &Qp,
    mem: &IovaMemory,
    sqs: Option<&VolatileSlice<'_>>,
    ci: u16,
    pi: u16,
    buf: &mut [u8],
    out: &mut Wqe,
) -> Result<(), u8> {
    // The queue in one piece: the first two blocks (most WQEs take one or
    // two) in one copy where they do not wrap, both posted.
    let ahead = match sqs {
        Some(s) if pi.wrapping_sub(ci) >= 2 => {
            let off = usize::from(ci) & (qp.sq_entries() as usize - 1);
            s.subslice(off * 64, 128)
                .map(|b| b.copy_to(&mut buf[..128]))
                .map_or(1, |_| 2)
        }
        _ => 1,
    };
    if ahead == 1 {
        read_bb(qp, mem, sqs, ci, &mut buf[..64])?;
    }
    let w0 = be32(buf, 0);
    let w1 = be32(buf, 4);
    let ds = (w1 & 0x3f) as usize;
    let index = (w0 >> 8) as u16;
    let opcode = WqeOpcode::from((w0 & 0xff) as u8);
    let nbb = mlx5_hw::wqe::wqebbs_for_ds(ds).max(1);
    if nbb > usize::from(pi.wrapping_sub(ci)) {
        tracing::debug!(
            qpn = qp.qpn,
            ci,
            pi,
            ds,
            "WQE reaches past the producer counter"
        );
        return Err(vendor::WQE_FAULT);
    }
    for i in ahead..nbb {
        read_bb(
            qp,
            mem,
            sqs,
            ci.wrapping_add(i as u16),
            &mut buf[i * 64..(i + 1) * 64],
        )?;
    }
    if ds == 0 || index != ci {
        tracing::debug!(qpn = qp.qpn, ci, index, ds, "malformed WQE");
        return Err(vendor::WQE_FAULT);
    }
    let fm = buf[11];
    *out = Wqe {
        opcode,
        index,
        nbb: nbb as u16,
        signaled: fm & 0x0c == mlx5_hw::wqe::WQE_CTRL_CQ_UPDATE
            || fm & 0x0c == mlx5_hw::wqe::WQE_CTRL_CQ_UPDATE_AND_EQE,
        solicited: fm & mlx5_hw::wqe::WQE_CTRL_SOLICITED != 0,
        imm: be32(buf, 12),
        raddr: 0,
        rkey: 0,
        swap_add: 0,
        compare: 0,
        av: None,
        xrc_srqn: None,
        len: ds as u64 * 16,
        inline: false,
    };
    Ok(())
}

/// Parses the segments after the control segment and resolves the local
/// data into `sq.ext` / `sq.inline` (`w.len` then the message length):
/// what is to be sent. The WQE's outcome instead where it is known
/// without sending anything: a NOP, a UMR (executed here), a malformed
/// WQE, a bad key, a page fault.
fn prepare(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    mem: &IovaMemory,
    w: &mut Wqe,
    buf: &[u8],
) -> Result<(), Outcome> {
    use WqeOpcode as W;
    let end = w.len as usize;
    let mut at = 16usize;
    if !opcode_allowed(qp.st, w.opcode) {
        return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::OPCODE));
    }
    if w.opcode == W::Nop {
        return Err(Outcome::Done(0));
    }
    if w.opcode == W::Umr {
        let by = super::umr::Poster {
            qpn: qp.qpn,
            pd: qp.pd,
            privileged: qp.st == qp::st::REG_UMR,
        };
        return Err(match super::umr::execute(rdma, by, mem, w.imm, buf, end) {
            Ok(()) => Outcome::Done(0),
            Err((synd, v)) => {
                tracing::debug!(
                    qpn = qp.qpn,
                    mkey = format_args!("{:#x}", w.imm),
                    ?synd,
                    vendor = v,
                    "UMR refused"
                );
                Outcome::Error(synd, v)
            }
        });
    }
    if matches!(qp.st, qp::st::UD | qp::st::QP1 | qp::st::DCI) {
        let seg = buf
            .get(at..end)
            .and_then(|b| WqeDatagramSeg::ref_from_prefix(b).ok());
        let Some((seg, _)) = seg else {
            return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT));
        };
        w.av = Some(datagram_av(seg));
        at += wqe_datagram_seg::SIZE_BYTES;
    }
    if qp.st == qp::st::XRC {
        // The XRC segment after the control segment names the target's
        // XRC SRQ (its first word's 24 bits).
        if end < at + wqe_xrc_seg::SIZE_BYTES {
            return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT));
        }
        w.xrc_srqn = Some(wqe_xrc_seg::XRC_SRQN.get(&buf[at..]) as u32 & 0xff_ffff);
        at += wqe_xrc_seg::SIZE_BYTES;
    }
    if matches!(
        w.opcode,
        W::RdmaWrite | W::RdmaWriteImm | W::RdmaRead | W::AtomicCs | W::AtomicFa
    ) {
        if end < at + 16 {
            return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT));
        }
        w.raddr = be64(buf, at);
        w.rkey = be32(buf, at + 8);
        at += 16;
    }
    if matches!(w.opcode, W::AtomicCs | W::AtomicFa) {
        if end < at + 16 {
            return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT));
        }
        w.swap_add = be64(buf, at);
        w.compare = be64(buf, at + 8);
        at += 16;
    }
    let len = gather(rdma, qp, sq, w, buf, at)?;
    w.len = len;
    if len > MAX_MSG {
        return Err(Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH));
    }
    Ok(())
}

/// Sends the message a WQE [`prepare`]d.
fn send_wqe(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    mem: &IovaMemory,
    burst: &Burst<'_>,
    w: &Wqe,
) -> Outcome {
    match qp.st {
        qp::st::UD | qp::st::QP1 => ud_send(rdma, qp, sq, mem, w),
        _ => connected(rdma, qp, sq, mem, burst, w),
    }
}

/// Whether a QP of transport service `st` carries `opcode` (NOP on every
/// one; UD only sends).
fn opcode_allowed(st: u8, opcode: WqeOpcode) -> bool {
    use WqeOpcode as W;
    match st {
        // An XRC initiator sends what an RC QP sends.
        qp::st::RC | qp::st::XRC => matches!(
            opcode,
            W::Nop
                | W::Send
                | W::SendImm
                | W::SendInval
                | W::RdmaWrite
                | W::RdmaWriteImm
                | W::RdmaRead
                | W::AtomicCs
                | W::AtomicFa
                | W::Umr
        ),
        qp::st::REG_UMR => matches!(opcode, W::Nop | W::Umr),
        qp::st::UC => matches!(
            opcode,
            W::Nop | W::Send | W::SendImm | W::RdmaWrite | W::RdmaWriteImm
        ),
        qp::st::UD | qp::st::QP1 => matches!(opcode, W::Nop | W::Send | W::SendImm),
        qp::st::DCI => matches!(
            opcode,
            W::Nop
                | W::Send
                | W::SendImm
                | W::RdmaWrite
                | W::RdmaWriteImm
                | W::RdmaRead
                | W::AtomicCs
                | W::AtomicFa
        ),
        _ => matches!(opcode, W::Nop),
    }
}

/// The address vector of a UD WQE's datagram segment (its 48 bytes).
fn datagram_av(seg: &WqeDatagramSeg) -> Av {
    let a = &seg.av;
    let gf = a.grh_gid_fl.get();
    Av {
        // The UD qkey is the upper half of the `key` union (qkey.qkey).
        qkey: (a.dc_key.get() >> 32) as u32,
        dc_key: a.dc_key.get(),
        dqpn: a.dqp_dct.get() & 0xff_ffff,
        rmac: a.rmac,
        tclass: a.tclass,
        hop_limit: a.hop_limit,
        sgid_index: (gf >> 20) as u8,
        flow_label: gf & 0xf_ffff,
        // `rlid` is `udp_sport` on RoCE v2.
        udp_sport: a.rlid.get(),
        rgid: a.rgid,
    }
}

/// The data segments from `at` to the WQE's end: scatter/gather entries
/// resolved into `sq.ext` (local write access for what a READ or atomic
/// lands in, else local read), inline data copied into `sq.inline`. The
/// message length, or the error completion.
fn gather(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    w: &mut Wqe,
    buf: &[u8],
    mut at: usize,
) -> Result<u64, Outcome> {
    use WqeOpcode as W;
    let end = w.len as usize;
    let need = if matches!(w.opcode, W::RdmaRead | W::AtomicCs | W::AtomicFa) {
        access::LW
    } else {
        access::LR
    };
    sq.ext.clear();
    sq.inline.clear();
    let mut len = 0u64;
    while at + 4 <= end {
        let bc = be32(buf, at);
        if bc & INLINE_SEG != 0 {
            let n = (bc & WQE_INLINE_SEG_BYTE_COUNT_MASK) as usize;
            if at + 4 + n > end.max(at + 4) && at + 4 + n > buf.len() {
                return Err(Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH));
            }
            let n = n.min(buf.len() - at - 4);
            sq.inline.extend_from_slice(&buf[at + 4..at + 4 + n]);
            w.inline = true;
            len += n as u64;
            at += (4 + n).div_ceil(16) * 16;
            continue;
        }
        if at + 16 > end {
            break;
        }
        let lkey = be32(buf, at + 4);
        let addr = be64(buf, at + 8);
        let n = if bc == 0 { 1u64 << 31 } else { u64::from(bc) };
        at += 16;
        local_data(rdma, qp, sq, need, lkey, addr, n)?;
        len += n;
    }
    if w.inline && !sq.ext.is_empty() {
        return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT));
    }
    Ok(len)
}

/// The `n` bytes at `addr` of a data segment's `lkey` (the reserved lkey:
/// the address itself), checked for the access `need`, added to
/// `sq.ext`; the WQE's outcome where the key refuses them.
fn local_data(
    rdma: &Rdma,
    qp: &Qp,
    sq: &mut Sq,
    need: u8,
    lkey: u32,
    addr: u64,
    n: u64,
) -> Result<(), Outcome> {
    if lkey == rdma.resd_lkey {
        mem::push(&mut sq.ext, addr, n);
        return Ok(());
    }
    match rdma.resolve_cached(lkey, &mut sq.lkeys, qp.pd, need, addr, n, &mut sq.ext) {
        Ok(()) => Ok(()),
        Err(KeyError::NotPresent) => Err(Outcome::PageFault(if need == access::LW {
            mlx5_hw::event::WQE_PF_TYPE_REQ_READ_OR_ATOMIC
        } else {
            mlx5_hw::event::WQE_PF_TYPE_REQ_SEND_OR_WRITE
        })),
        Err(e) => Err(Outcome::Error(CqeSyndrome::LocalProtErr, key_error(e))),
    }
}

/// The addressing of a connected QP's packets.
fn path_addr(rdma: &Rdma, sq: &Sq) -> Option<RoceAddr> {
    address(
        rdma,
        sq.path.sgid_index,
        &AddrIn {
            dmac: sq.path.dmac,
            dgid: sq.path.dgid,
            tclass: sq.path.tclass,
            flow_label: sq.path.flow_label,
            hop_limit: sq.path.hop_limit,
            udp_sport: sq.path.udp_sport,
        },
    )
}

/// The local GID and addressing for a packet to `dgid` from `sgid_index`.
fn address(rdma: &Rdma, sgid_index: u8, p: &AddrIn) -> Option<RoceAddr> {
    let g = rlock(&rdma.gids)
        .get(usize::from(sgid_index))
        .copied()
        .flatten()?;
    Some(RoceAddr {
        dst_mac: p.dmac,
        src_mac: g.mac,
        src_gid: g.gid,
        dst_gid: p.dgid,
        tclass: p.tclass,
        flow_label: p.flow_label,
        hop_limit: p.hop_limit,
        udp_sport: p.udp_sport,
    })
}

struct AddrIn {
    dmac: [u8; 6],
    dgid: [u8; 16],
    tclass: u8,
    flow_label: u32,
    hop_limit: u8,
    udp_sport: u16,
}

fn ud_send(rdma: &Rdma, qp: &Qp, sq: &mut Sq, mem: &IovaMemory, w: &Wqe) -> Outcome {
    let Some(av) = w.av else {
        return Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::WQE_FAULT);
    };
    if w.len > u64::from(sq.mtu.max(256)) {
        return Outcome::Error(CqeSyndrome::LocalLengthErr, vendor::LENGTH);
    }
    let Some(addr) = address(
        rdma,
        av.sgid_index,
        &AddrIn {
            dmac: av.rmac,
            dgid: av.rgid,
            tclass: av.tclass,
            flow_label: av.flow_label,
            hop_limit: av.hop_limit,
            udp_sport: av.udp_sport,
        },
    ) else {
        return Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::OPCODE);
    };
    // A Q_Key with the high bit set means "use the QP's".
    let qkey = if av.qkey & 0x8000_0000 != 0 {
        sq.qkey
    } else {
        av.qkey
    };
    let imm = w.opcode == WqeOpcode::SendImm;
    let h = Headers {
        bth: Bth {
            opcode: svc::UD
                | if imm {
                    op::SEND_ONLY_IMM
                } else {
                    op::SEND_ONLY
                },
            se: w.solicited,
            pkey: packet::DEFAULT_PKEY,
            dest_qp: av.dqpn,
            psn: sq.psn,
            ..Bth::default()
        },
        deth: Some(Deth {
            qkey,
            src_qp: if qp.st == qp::st::QP1 { 1 } else { qp.qpn },
        }),
        imm: imm.then_some(w.imm),
        ..Headers::default()
    };
    sq.psn = (sq.psn + 1) & 0xff_ffff;
    let payload = payload(sq, mem, 0, w.len);
    let pkt = Packet {
        addr: &addr,
        hdr: &h,
        payload,
    };
    if packet::is_multicast_gid(&addr.dst_gid) {
        multicast(rdma, qp, mem, &pkt);
        return Outcome::Done(w.len as u32);
    }
    match rdma.route(&addr.dst_gid) {
        Some(dst) => datagram_to(rdma, qp, &dst, &pkt),
        // Out on the link to another process, if any.
        None => datagram_on_link(rdma, qp, mem, &pkt),
    }
    Outcome::Done(w.len as u32)
}

/// A UD datagram to the port of `dst` on this fabric (nothing comes back).
fn datagram_to(rdma: &Rdma, qp: &Qp, dst: &Rdma, pkt: &Packet<'_>) {
    let (dmem, wire) = (dst.dma.memory(), fabric::wire_of(rdma));
    let to = Dest {
        rdma: dst,
        mem: &dmem,
        hint: None,
        tally: None,
        routed: true,
        wire: wire.as_deref(),
        qp: None,
        link: None,
        src_qpn: qp.qpn,
    };
    fabric::transmit(rdma, &to, pkt, &mut |_| {});
}

/// A UD datagram onto the link to another process, if the port has one
/// (nothing comes back).
fn datagram_on_link(rdma: &Rdma, qp: &Qp, mem: &IovaMemory, pkt: &Packet<'_>) {
    let Some(l) = fabric::link_of(rdma) else {
        return;
    };
    let to = Dest {
        rdma,
        mem,
        hint: None,
        tally: None,
        routed: false,
        wire: None,
        qp: None,
        link: Some(&l),
        src_qpn: qp.qpn,
    };
    fabric::transmit(rdma, &to, pkt, &mut |_| {});
}

/// A UD SEND to a multicast group: every function of the cable takes a
/// copy, this one included unless the QP blocks multicast loopback
/// (`qpc.block_lb_mc`; each port's responder hands it to the QPs its
/// ATTACH_TO_MCG put in the group), and the link to another process
/// carries one.
fn multicast(rdma: &Rdma, qp: &Qp, mem: &IovaMemory, pkt: &Packet<'_>) {
    let wire = fabric::wire_of(rdma);
    let mut ports = wire.as_ref().map(|w| w.peers(rdma)).unwrap_or_default();
    if !qp.block_lb_mc {
        ports.extend(rdma.me.upgrade());
    }
    for dst in &ports {
        datagram_to(rdma, qp, dst, pkt);
    }
    datagram_on_link(rdma, qp, mem, pkt);
}

fn payload<'a>(sq: &'a Sq, mem: &'a IovaMemory, skip: u64, len: u64) -> Payload<'a> {
    if len == 0 {
        return Payload::None;
    }
    if !sq.inline.is_empty() {
        let s = skip as usize;
        return Payload::Bytes(&sq.inline[s..s + len as usize]);
    }
    Payload::Mem {
        mem,
        ext: &sq.ext,
        skip,
        len,
    }
}

/// What the responder's answers said.
#[derive(Default)]
struct Answer {
    /// The latest PSN acknowledged (an ACK's PSN, the PSN before a NAK's,
    /// a read response's or atomic acknowledgement's).
    acked: Option<u32>,
    nak: Option<u8>,
    rnr: Option<u8>,
    fault: bool,
    /// Plain ACKs among the responses.
    acks: u64,
    /// The PSN of the next read response expected (none yet: the READ's
    /// first PSN); after a gap (a response lost) the rest are ignored and
    /// the READ is sent again.
    read_next: Option<u32>,
    read_gap: bool,
    /// The message's response data goes to its CQE (qpc `cs_req`), not
    /// to the local buffer.
    scatter: Option<InlineScatter>,
    /// An atomic's original value lands in host byte order
    /// ([`Rdma::host_endian_atomics`]), not network order.
    host_atomics: bool,
}

impl Answer {
    fn new(rdma: &Rdma) -> Self {
        Self {
            host_atomics: rdma.host_endian_atomics.load(Ordering::Acquire),
            ..Self::default()
        }
    }

    fn ack(&mut self, psn: u32) {
        if self.acked.is_none_or(|a| psn_le(a, psn)) {
            self.acked = Some(psn);
        }
    }
}

/// Takes one response into `ans`: read response payload lands in `ext`
/// (the READ's local buffer, its first packet PSN `first_psn`, `mtu`
/// bytes a packet), an atomic's original value at its start.
fn note(
    ans: &mut Answer,
    r: &Packet<'_>,
    first_psn: u32,
    mtu: u64,
    mem: &IovaMemory,
    ext: &[Extent],
) {
    let h = r.hdr;
    let o = h.bth.opcode & 0x1f;
    // RC's responses, or XRC's (an XRC initiator's: the same operations).
    if !matches!(h.bth.opcode & 0xe0, svc::RC | svc::XRC) {
        return;
    }
    let psn = h.bth.psn;
    if let Some(a) = h.aeth {
        match a.syndrome & 0x60 {
            aeth::RNR_NAK => {
                ans.rnr = Some(a.syndrome & 0x1f);
                ans.ack(psn.wrapping_sub(1) & 0xff_ffff);
                return;
            }
            aeth::NAK => {
                ans.nak = Some(a.syndrome & 0x1f);
                ans.ack(psn.wrapping_sub(1) & 0xff_ffff);
                return;
            }
            _ => {}
        }
    }
    match o {
        op::ACKNOWLEDGE => {
            ans.acks += 1;
            ans.ack(psn);
        }
        op::READ_RESPONSE_FIRST
        | op::READ_RESPONSE_MIDDLE
        | op::READ_RESPONSE_LAST
        | op::READ_RESPONSE_ONLY => {
            let expected = ans.read_next.unwrap_or(first_psn);
            if !ans.read_gap && psn != expected && psn_le(first_psn, psn) && !psn_le(expected, psn)
            {
                // A duplicate of a response already taken (the wire
                // doubled it, or the try before sent it): dropped, as IBA
                // has a requester drop duplicate responses.
                return;
            }
            if ans.read_gap || psn != expected {
                ans.read_gap = true;
                return;
            }
            ans.read_next = Some((psn + 1) & 0xff_ffff);
            let off = u64::from(psn.wrapping_sub(first_psn) & 0xff_ffff) * mtu;
            let landed = match ans.scatter.as_mut() {
                Some(s) => scatter_response(s, &r.payload, off),
                None => r.payload.copy_to(mem, ext, off).is_ok(),
            };
            if !landed {
                ans.fault = true;
            }
            if matches!(o, op::READ_RESPONSE_LAST | op::READ_RESPONSE_ONLY) {
                ans.ack(psn);
            }
        }
        op::ATOMIC_ACKNOWLEDGE => {
            let orig = h.atomic_ack.unwrap_or_default();
            let bytes = if ans.host_atomics {
                orig.to_le_bytes()
            } else {
                orig.to_be_bytes()
            };
            let landed = match ans.scatter.as_mut() {
                Some(s) => {
                    s.data[..8].copy_from_slice(&bytes);
                    true
                }
                None => mem::write_bytes(mem, ext, 0, &bytes).is_ok(),
            };
            if !landed {
                ans.fault = true;
            }
            ans.ack(psn);
        }
        _ => {}
    }
}

/// Copies a READ response's payload, `off` bytes into the message, into
/// the CQE's bytes; false if it does not fit (the message was measured
/// to fit, so a peer that sent more).
fn scatter_response(s: &mut InlineScatter, payload: &Payload<'_>, off: u64) -> bool {
    let (off, n) = (off as usize, payload.len() as usize);
    if off + n > usize::from(s.len) {
        return false;
    }
    payload.read(&mut s.data[off..off + n]).is_ok()
}

/// Whether the response data of READ or atomic `w` goes to its CQE
/// (PRM "Scatter to CQE", requester side): the QP asks for it (`cs_req`,
/// which Linux sets only for QPs whose sends are all signaled or that
/// allow it), the WQE is signaled (only a CQE can carry the bytes) and
/// they fit the send CQ's entry. A local buffer in device memory (a
/// MEMIC key's extents, `local`) takes the bytes through its key: the
/// driver's copy out of the CQE (libmlx5's `mlx5_copy_to_send_wqe`) goes
/// through the data segment's address as a host pointer, which a
/// zero-based device-memory key's is not; rdma-core's DM atomic tests
/// pass on cards with such QPs.
fn requester_scatter(qp: &Qp, w: &Wqe, local: &[Extent]) -> Option<InlineScatter> {
    use WqeOpcode as W;
    let len = match w.opcode {
        W::RdmaRead => w.len,
        W::AtomicCs | W::AtomicFa => 8,
        _ => return None,
    };
    if local
        .iter()
        .any(|e| e.iova >= crate::fw::memic::DEVMEM_IOVA)
    {
        return None;
    }
    // The CQE size matters only to the 64-byte mode (read under the CQ's
    // lock only then).
    let cqe_bytes = match qp.cs_req {
        mlx5_hw::qp::REQ_SCAT_DATA64_CQE => qp.scq.stride(),
        _ => 64,
    };
    let limit = mlx5_hw::qp::req_scatter_limit(qp.cs_req, cqe_bytes);
    (w.signaled && len > 0 && len <= limit).then_some(InlineScatter {
        data: [0; 64],
        len: len as u8,
    })
}

/// Where `sq`'s messages go: its peer, with the burst's hint to the
/// peer's memory unless the peer was found again since; across the
/// peer's link only if `link`.
fn peer_dest<'a, 'b: 'a>(
    p: &'a qp::Peer,
    sq: &'a Sq,
    burst: &Burst<'b>,
    src_qpn: u32,
    link: bool,
) -> Dest<'a, 'b> {
    let hint = burst
        .dst
        .filter(|(_, m)| Arc::ptr_eq(&p.mem, m))
        .map(|(h, _)| h);
    Dest {
        rdma: &p.rdma,
        mem: &p.mem,
        hint,
        tally: Some(&sq.tally),
        routed: true,
        wire: p.wire.as_deref(),
        qp: p.qp.as_ref(),
        link: if link { p.link.as_deref() } else { None },
        src_qpn,
    }
}

/// The memories of one burst, with their region hints: this function's,
/// and the peer's as the burst began.
struct Burst<'a> {
    src: &'a Hinted<'a>,
    dst: Option<(&'a Hinted<'a>, &'a Arc<IovaMemory>)>,
}

/// A message's place in the PSN space: its first and last PSN, its
/// packets, and the path MTU in bytes.
#[derive(Clone, Copy)]
struct Span {
    first_psn: u32,
    last_psn: u32,
    npkts: u64,
    mtu: u64,
}

/// An RC or UC message (IBA 9.7.4 requester side): the peer found, the
/// packets built and sent per opcode ([`send_request`] for a READ or an
/// atomic, [`send_data`] for a SEND or a WRITE), the PSNs taken; for RC
/// the responses then decide its outcome ([`rc_outcome`]).
fn connected(
    rdma: &Rdma,
    qp: &Qp,
    sq: &mut Sq,
    mem: &IovaMemory,
    burst: &Burst<'_>,
    w: &Wqe,
) -> Outcome {
    use WqeOpcode as W;
    let rc = matches!(qp.st, qp::st::RC | qp::st::DCI | qp::st::XRC);
    if qp.st == qp::st::DCI {
        dci_connect(sq, w);
    }
    if let Err(o) = find_peer(rdma, sq) {
        return o;
    }
    let mtu = u64::from(sq.mtu.max(256));
    let npkts = if matches!(w.opcode, W::AtomicCs | W::AtomicFa) {
        1
    } else {
        w.len.div_ceil(mtu).max(1)
    };
    let first_psn = sq.psn;
    let s = Span {
        first_psn,
        last_psn: (first_psn + npkts as u32 - 1) & 0xff_ffff,
        npkts,
        mtu,
    };
    let mut ans = Answer {
        scatter: requester_scatter(qp, w, &sq.ext),
        ..Answer::new(rdma)
    };
    let has_peer = sq.peer.is_some();
    if let Some(mut link) = Link::new(rdma, qp.qpn, sq, mem, burst, s) {
        link.dc = (qp.st == qp::st::DCI)
            .then_some(sq.dc.conn)
            .flatten()
            .map(|(t, first_psn)| DcLink {
                key: t.key,
                dci: qp.qpn,
                first_psn,
            });
        link.xrc = w.xrc_srqn;
        if matches!(w.opcode, W::RdmaRead | W::AtomicCs | W::AtomicFa) {
            send_request(&link, sq, w, rc, &mut ans);
        } else {
            send_data(&link, sq, burst, w, rc, &mut ans);
        }
    }
    if ans.acks != 0 {
        rdma.counters.acks.fetch_add(ans.acks, Ordering::Relaxed);
    }
    if !rc {
        // UC: nothing comes back; the message is done once sent.
        sq.psn = (first_psn + npkts as u32) & 0xff_ffff;
        return Outcome::Done(w.len as u32);
    }
    sq.acked = ans.acked;
    let o = rc_outcome(rdma, qp, sq, w, s, &ans, has_peer);
    if matches!(o, Outcome::Done(_)) {
        sq.cqe_data = ans.scatter;
    }
    o
}

/// How many single-packet WRITEs a run holds at most: as many as the
/// responder acknowledges at once ([`super::responder::ACK_COALESCE`]).
const RUN_MAX: usize = super::responder::ACK_COALESCE as usize;

/// Consecutive single-packet RC RDMA WRITEs, collected from the send
/// queue and handed to the responder in one call ([`write_run`]).
#[derive(Default)]
struct Run<'m> {
    msgs: Vec<Pending<'m>>,
    /// The inline data of the messages, one after another.
    bytes: Vec<u8>,
    /// The WQE the responder did not take as part of the run (it goes
    /// on its own, and meets whatever it meets).
    refused: Option<u16>,
}

/// One WRITE of a [`Run`]: its WQE, its PSN, its RETH and its data.
struct Pending<'m> {
    head: Head,
    psn: u32,
    va: u64,
    rkey: u32,
    len: u32,
    src: Src<'m>,
}

/// Where a [`Pending`] WRITE's data is.
#[derive(Clone, Copy)]
enum Src<'m> {
    None,
    /// Inline, at this offset of [`Run::bytes`].
    Inline(usize),
    /// One piece of local memory.
    Slice(VolatileSlice<'m>),
}

impl<'m> Run<'m> {
    /// Adds WRITE `w` (prepared: its data in `sq.ext` / `sq.inline`) at
    /// PSN `psn`; false, with nothing added, if its data is not inline,
    /// nothing or in one piece of memory (it then goes on its own).
    fn push(&mut self, sq: &Sq, burst: &Burst<'m>, w: &Wqe, psn: u32) -> bool {
        let len = w.len as u32;
        let src = if !sq.inline.is_empty() {
            // The run slices its bytes by the WQE's length.
            if sq.inline.len() != w.len as usize {
                return false;
            }
            let at = self.bytes.len();
            self.bytes.extend_from_slice(&sq.inline);
            Src::Inline(at)
        } else if len == 0 {
            Src::None
        } else {
            match sq.ext.as_slice() {
                [e] if e.len == len => match burst.src.slice(e.iova, e.len as usize) {
                    Ok(s) => Src::Slice(s),
                    Err(_) => return false,
                },
                _ => return false,
            }
        };
        self.msgs.push(Pending {
            head: Head::of(Some(w), w.index),
            psn,
            va: w.raddr,
            rkey: w.rkey,
            len,
            src,
        });
        true
    }
}

/// The WQE at `ci` as a [`Pending`] WRITE at PSN `psn`, if it is one
/// [`write_run`] takes as it reads it, straight from the send queue in one
/// piece (`ring`), without a copy of the WQE or of its inline data: an
/// RDMA WRITE, whole before the producer counter `pi` and not wrapping
/// around the ring's end, its remote-address segment then one segment,
/// inline data inside the WQE or a data segment whose key gives one
/// piece of memory, of at most the path MTU `mtu`. What [`read_wqe`],
/// [`prepare`] and [`Run::push`] make of such a WQE; `None` for any other
/// (they then read it, and take it or not).
#[allow(clippy::too_many_arguments)]
fn simple_write<'m>(
    rdma: &Rdma,
    qp: &Qp,
    sq: &mut Sq,
    burst: &Burst<'m>,
    ring: &VolatileSlice<'m>,
    (ci, pi): (u16, u16),
    psn: u32,
    mtu: u64,
) -> Option<Pending<'m>> {
    use mlx5_hw::wqe::{WQE_CTRL_CQ_UPDATE, WQE_CTRL_CQ_UPDATE_AND_EQE};
    // The control segment, the remote-address segment and the start of
    // the next: 48 bytes, in the WQE's first basic block.
    let entries = qp.sq_entries() as usize;
    let at = (usize::from(ci) & (entries - 1)) * 64;
    let mut h = [0u8; 48];
    ring.subslice(at, 48).ok()?.copy_to(&mut h);
    let (w0, w1) = (be32(&h, 0), be32(&h, 4));
    let ds = (w1 & 0x3f) as usize;
    let nbb = mlx5_hw::wqe::wqebbs_for_ds(ds).max(1);
    if (w0 & 0xff) as u8 != WqeOpcode::RdmaWrite.to_raw()
        || ds == 0
        || (w0 >> 8) as u16 != ci
        || nbb > usize::from(pi.wrapping_sub(ci))
        || at + nbb * 64 > entries * 64
    {
        return None;
    }
    let end = ds * 16;
    let bc = be32(&h, 32);
    let (len, src) = if bc & INLINE_SEG != 0 {
        // One inline segment, its data inside the WQE, nothing after it.
        let n = (bc & WQE_INLINE_SEG_BYTE_COUNT_MASK) as usize;
        if end < 36 + n || 32 + (4 + n).div_ceil(16) * 16 + 4 <= end {
            return None;
        }
        let src = match n {
            0 => Src::None,
            _ => Src::Slice(ring.subslice(at + 36, n).ok()?),
        };
        (n as u64, src)
    } else {
        // One data segment, nothing after it.
        if end != 48 {
            return None;
        }
        let n = if bc == 0 { 1u64 << 31 } else { u64::from(bc) };
        sq.ext.clear();
        local_data(rdma, qp, sq, access::LR, be32(&h, 36), be64(&h, 40), n).ok()?;
        let src = match sq.ext.as_slice() {
            [e] if u64::from(e.len) == n => {
                Src::Slice(burst.src.slice(e.iova, e.len as usize).ok()?)
            }
            _ => return None,
        };
        (n, src)
    };
    if len > mtu {
        return None;
    }
    let fm = h[11] & 0x0c;
    Some(Pending {
        head: Head {
            index: ci,
            nbb: nbb as u16,
            opcode: WqeOpcode::RdmaWrite.to_raw(),
            signaled: fm == WQE_CTRL_CQ_UPDATE || fm == WQE_CTRL_CQ_UPDATE_AND_EQE,
        },
        psn,
        va: be64(&h, 16),
        rkey: be32(&h, 24),
        len: len as u32,
        src,
    })
}

/// Where a run finds the WQEs after its first: the send queue in one
/// piece, if it is, and the producer counter.
#[derive(Clone, Copy)]
struct Ahead<'s, 'm> {
    sqs: Option<&'s VolatileSlice<'m>>,
    pi: u16,
}

/// Starts a run with prepared WQE `w` if it is a single-packet RC RDMA
/// WRITE to a peer on this fabric that delivers packets as they are:
/// what [`connected`] would send as one WRITE_ONLY packet. False
/// otherwise (it goes on its own).
fn run_start<'m>(
    rdma: &Rdma,
    qp: &Qp,
    sq: &mut Sq,
    burst: &Burst<'m>,
    w: &Wqe,
    run: &mut Run<'m>,
) -> bool {
    if qp.st != qp::st::RC
        || w.opcode != WqeOpcode::RdmaWrite
        || w.len > u64::from(sq.mtu.max(256))
        || find_peer(rdma, sq).is_err()
    {
        return false;
    }
    let Some(p) = sq.peer.as_ref() else {
        return false;
    };
    if p.link.is_some() || !fabric::delivers_as_is(p.wire.as_deref()) {
        return false;
    }
    run.msgs.clear();
    run.msgs.reserve(RUN_MAX);
    run.bytes.clear();
    run.refused = None;
    run.push(sq, burst, w, sq.psn)
}

/// A run of single-packet RC RDMA WRITEs from the one [`run_start`]
/// took: the WQEs after it join while they are such WRITEs too (up to
/// [`RUN_MAX`]), then the responder takes them in one call, each as it
/// would take its WRITE_ONLY packet ([`fabric::write_run`]). Each WRITE
/// taken is sent and owes its ACK, as [`connected`] leaves it; an ACK
/// the responder sends ends its call, and what it acknowledges completes
/// before the rest of the run goes, as after a message on its own. The
/// first WRITE the responder did not take is left in `run.refused`, at
/// the head of the queue. False when the queue stops (a CQ overrun).
#[allow(clippy::too_many_arguments)]
fn write_run<'m>(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    sq: &mut Sq,
    mem: &IovaMemory,
    burst: &Burst<'m>,
    go: Ahead<'_, 'm>,
    (wqe, w): (&mut [u8; mlx5_hw::wqe::SEND_WQE_MAX_SIZE], &mut Wqe),
    run: &mut Run<'m>,
) -> bool {
    let mtu = u64::from(sq.mtu.max(256));
    while let Some(last) = run.msgs.last().filter(|_| run.msgs.len() < RUN_MAX) {
        let ci = last.head.index.wrapping_add(last.head.nbb);
        let psn = (last.psn + 1) & 0xff_ffff;
        if ci == go.pi || qp.state() != state::RTS {
            break;
        }
        let ring = go.sqs;
        if let Some(p) =
            ring.and_then(|r| simple_write(rdma, qp, sq, burst, r, (ci, go.pi), psn, mtu))
        {
            run.msgs.push(p);
            continue;
        }
        if read_wqe(qp, mem, go.sqs, ci, go.pi, wqe, w).is_err()
            || w.opcode != WqeOpcode::RdmaWrite
            || prepare(rdma, qp, sq, mem, w, wqe).is_err()
            || w.len > mtu
            || !run.push(sq, burst, w, psn)
        {
            break;
        }
    }
    let writes: Vec<_> = run
        .msgs
        .iter()
        .map(|m| fabric::OneWrite {
            psn: m.psn,
            va: m.va,
            rkey: m.rkey,
            payload: match m.src {
                Src::None => Payload::None,
                Src::Inline(at) => Payload::Bytes(&run.bytes[at..at + m.len as usize]),
                Src::Slice(s) => Payload::Slice(s),
            },
        })
        .collect();
    let mut from = 0;
    loop {
        let (k, ans) = send_run(qp, sq, mem, burst, &writes[from..]);
        for m in &run.msgs[from..from + k] {
            sq.ci = m.head.index.wrapping_add(m.head.nbb);
            sq.psn = (m.psn + 1) & 0xff_ffff;
            sq.unacked.push_back(qp::Unacked {
                index: m.head.index,
                nbb: m.head.nbb,
                opcode: m.head.opcode,
                signaled: m.head.signaled,
                bytes: m.len,
                first_psn: m.psn,
                last_psn: m.psn,
            });
        }
        from += k;
        if ans.acks != 0 {
            rdma.counters.acks.fetch_add(ans.acks, Ordering::Relaxed);
        }
        if !settle(rdma, qp, sq, mem, ans.acked) {
            return false;
        }
        if from == run.msgs.len() {
            return true;
        }
        if ans.acks == 0 {
            run.refused = Some(run.msgs[from].head.index);
            return true;
        }
    }
}

/// Hands `writes` of a run to the responder of `sq`'s peer: how many it
/// took, and its answers.
fn send_run(
    qp: &Qp,
    sq: &Sq,
    mem: &IovaMemory,
    burst: &Burst<'_>,
    writes: &[fabric::OneWrite<'_>],
) -> (usize, Answer) {
    let mut ans = Answer::default();
    let Some(p) = sq.peer.as_ref() else {
        return (0, ans);
    };
    // A run never crosses a link (its WRITEs are taken in this process).
    let dst = peer_dest(p, sq, burst, qp.qpn, false);
    let k = fabric::write_run(&dst, &p.addr, sq.remote_qpn, writes, &mut |r| {
        note(&mut ans, r, 0, 0, mem, &[])
    });
    (k, ans)
}

/// The peer of the connection: found again (address path, route, remote
/// function and QP) when any object table changed since it was last found;
/// no address for the path's GID fails the WQE.
fn find_peer(rdma: &Rdma, sq: &mut Sq) -> Result<(), Outcome> {
    let gen = super::tables_gen();
    if sq.peer.as_ref().is_some_and(|p| p.gen == gen) {
        return Ok(());
    }
    flush_tally(rdma, sq);
    let Some(addr) = path_addr(rdma, sq) else {
        sq.peer = None;
        return Err(Outcome::Error(CqeSyndrome::LocalQpOpErr, vendor::OPCODE));
    };
    sq.peer = rdma.route(&sq.path.dgid).map(|r| Peer {
        qp: r.qp(sq.remote_qpn),
        addr,
        wire: fabric::wire_of(rdma),
        mem: r.dma.memory(),
        gen,
        rdma: r,
        link: None,
    });
    if sq.peer.is_none() {
        // No function here answers to the GID: out on the link, if any.
        sq.peer = fabric::link_of(rdma)
            .zip(rdma.me.upgrade())
            .map(|(l, me)| Peer {
                qp: None,
                addr,
                wire: None,
                mem: me.dma.memory(),
                gen,
                rdma: me,
                link: Some(l),
            });
    }
    Ok(())
}

/// Where a message's packets go and where its responses land: the peer
/// as the burst found it, the local buffer (`ext`) a read response or an
/// atomic's original value is written to.
struct Link<'a, 'b> {
    rdma: &'a Rdma,
    dst: Dest<'a, 'b>,
    addr: &'a RoceAddr,
    mem: &'a IovaMemory,
    ext: &'a [Extent],
    span: Span,
    /// A DCI's connection: its packets are DC requests.
    dc: Option<DcLink>,
    /// An XRC initiator's message: its requests are XRC ones, their
    /// XRCETH naming this XRC SRQ.
    xrc: Option<u32>,
}

impl<'a, 'b> Link<'a, 'b> {
    /// The link to `sq`'s peer, if it has one.
    fn new(
        rdma: &'a Rdma,
        qpn: u32,
        sq: &'a Sq,
        mem: &'a IovaMemory,
        burst: &'a Burst<'b>,
        span: Span,
    ) -> Option<Self> {
        let p = sq.peer.as_ref()?;
        let dst = peer_dest(p, sq, burst, qpn, true);
        Some(Self {
            rdma,
            dst,
            addr: &p.addr,
            mem,
            ext: &sq.ext,
            span,
            dc: None,
            xrc: None,
        })
    }

    /// Sends one packet; its responses go into `ans`.
    fn send(&self, h: &Headers, payload: Payload<'_>, ans: &mut Answer) {
        let dch;
        let h = match (&self.dc, self.xrc) {
            (Some(d), _) => {
                dch = d.decorate(h);
                &dch
            }
            (None, Some(srqn)) => {
                let mut x = *h;
                x.bth.opcode = svc::XRC | (h.bth.opcode & 0x1f);
                x.xrceth = Some(srqn);
                dch = x;
                &dch
            }
            (None, None) => h,
        };
        let pkt = Packet {
            addr: self.addr,
            hdr: h,
            payload,
        };
        let s = self.span;
        fabric::transmit(self.rdma, &self.dst, &pkt, &mut |r| {
            note(ans, r, s.first_psn, s.mtu, self.mem, self.ext)
        });
    }
}

/// A READ or an atomic: one request packet (RETH or AtomicETH), AckReq.
fn send_request(link: &Link<'_, '_>, sq: &Sq, w: &Wqe, rc: bool, ans: &mut Answer) {
    use WqeOpcode as W;
    let base = if rc { svc::RC } else { svc::UC };
    let o = match w.opcode {
        W::RdmaRead => op::READ_REQUEST,
        W::AtomicCs => op::COMPARE_SWAP,
        _ => op::FETCH_ADD,
    };
    let mut h = Headers {
        bth: Bth {
            opcode: base | o,
            pkey: packet::DEFAULT_PKEY,
            dest_qp: sq.remote_qpn,
            ack_req: true,
            psn: sq.psn,
            ..Bth::default()
        },
        ..Headers::default()
    };
    if w.opcode == W::RdmaRead {
        h.reth = Some(Reth {
            va: w.raddr,
            rkey: w.rkey,
            dma_len: w.len as u32,
        });
    } else {
        h.atomic = Some(AtomicEth {
            va: w.raddr,
            rkey: w.rkey,
            swap_add: w.swap_add,
            compare: w.compare,
        });
    }
    link.send(&h, Payload::None, ans);
}

/// A SEND or a WRITE: MTU-sized packets from the message's first PSN, the
/// first of a WRITE with the RETH, the last with the immediate or IETH,
/// SE as the WQE asks and AckReq on RC; a multi-packet RC WRITE in one
/// piece of memory goes as one train when nothing can tell it from its
/// packets. The packets stop at a NAK or an RNR NAK.
fn send_data(link: &Link<'_, '_>, sq: &Sq, burst: &Burst<'_>, w: &Wqe, rc: bool, ans: &mut Answer) {
    use WqeOpcode as W;
    let s = link.span;
    // A message in one piece of memory is looked up once.
    let whole = match link.ext {
        [e] if u64::from(e.len) == w.len && sq.inline.is_empty() => {
            burst.src.slice(e.iova, e.len as usize).ok()
        }
        _ => None,
    };
    let train =
        rc && link.dc.is_none() && link.xrc.is_none() && w.opcode == W::RdmaWrite && s.npkts > 1;
    if let Some(src) = whole.filter(|_| train) {
        let t = fabric::Train {
            addr: *link.addr,
            dest_qp: sq.remote_qpn,
            psn: s.first_psn,
            npkts: s.npkts as u32,
            mtu: s.mtu,
            va: w.raddr,
            rkey: w.rkey,
            src,
        };
        let sent = fabric::write_train(&link.dst, &t, &mut |r| {
            note(ans, r, s.first_psn, s.mtu, link.mem, link.ext)
        });
        if sent {
            return;
        }
    }
    let send = matches!(w.opcode, W::Send | W::SendImm | W::SendInval);
    let imm = matches!(w.opcode, W::SendImm | W::RdmaWriteImm);
    let base = if rc { svc::RC } else { svc::UC };
    let mut h = Headers {
        bth: Bth {
            pkey: packet::DEFAULT_PKEY,
            dest_qp: sq.remote_qpn,
            ..Bth::default()
        },
        ..Headers::default()
    };
    for i in 0..s.npkts {
        let first = i == 0;
        let last = i + 1 == s.npkts;
        h.bth.opcode = base | packet_opcode(w.opcode, first, last);
        h.bth.se = last && w.solicited;
        h.bth.ack_req = last && rc;
        h.bth.psn = (s.first_psn + i as u32) & 0xff_ffff;
        h.reth = (!send && first).then_some(Reth {
            va: w.raddr,
            rkey: w.rkey,
            dma_len: w.len as u32,
        });
        h.imm = (last && imm).then_some(w.imm);
        h.ieth = (last && w.opcode == W::SendInval).then_some(w.imm);
        let skip = i * s.mtu;
        let plen = (w.len - skip).min(s.mtu);
        let pl = if plen == 0 {
            Payload::None
        } else if let Some(sl) = whole.and_then(|sl| sl.subslice(skip as usize, plen as usize).ok())
        {
            Payload::Slice(sl)
        } else if !sq.inline.is_empty() {
            Payload::Bytes(&sq.inline[skip as usize..(skip + plen) as usize])
        } else {
            Payload::Mem {
                mem: link.mem,
                ext: link.ext,
                skip,
                len: plen,
            }
        };
        link.send(&h, pl, ans);
        if ans.nak.is_some() || ans.rnr.is_some() {
            break;
        }
    }
}

/// The BTH opcode (without the service) of a SEND's or a WRITE's packet,
/// by its place in the message (IBA 9.4, table 38).
fn packet_opcode(opcode: WqeOpcode, first: bool, last: bool) -> u8 {
    use WqeOpcode as W;
    let imm = matches!(opcode, W::SendImm | W::RdmaWriteImm);
    let send = matches!(opcode, W::Send | W::SendImm | W::SendInval);
    match (send, first, last) {
        (true, true, true) => match opcode {
            W::SendImm => op::SEND_ONLY_IMM,
            W::SendInval => op::SEND_ONLY_INV,
            _ => op::SEND_ONLY,
        },
        (true, true, false) => op::SEND_FIRST,
        (true, false, false) => op::SEND_MIDDLE,
        (true, false, true) => match opcode {
            W::SendImm => op::SEND_LAST_IMM,
            W::SendInval => op::SEND_LAST_INV,
            _ => op::SEND_LAST,
        },
        (false, true, true) if imm => op::WRITE_ONLY_IMM,
        (false, true, true) => op::WRITE_ONLY,
        (false, true, false) => op::WRITE_FIRST,
        (false, false, false) => op::WRITE_MIDDLE,
        (false, false, true) if imm => op::WRITE_LAST_IMM,
        (false, false, true) => op::WRITE_LAST,
    }
}

/// What an RC message's responses make of it (IBA 9.7.5.1): a local fault
/// landing a response, a NAK ([`nak_outcome`]), an RNR NAK (the RNR timer,
/// while `rnr_retry` lasts), acknowledged (done), or not yet: a SEND's or
/// WRITE's ACK is owed (coalesced), anything else was lost (the ACK
/// timeout, while `retry_count` lasts).
fn rc_outcome(
    rdma: &Rdma,
    qp: &Qp,
    sq: &mut Sq,
    w: &Wqe,
    s: Span,
    ans: &Answer,
    has_peer: bool,
) -> Outcome {
    use WqeOpcode as W;
    if ans.fault {
        return Outcome::Error(CqeSyndrome::LocalProtErr, vendor::DMA_FAULT);
    }
    if let Some(code) = ans.nak {
        return nak_outcome(rdma, sq, s.first_psn, code);
    }
    if let Some(t) = ans.rnr {
        return rnr_outcome(rdma, qp, sq, s.first_psn, t);
    }
    let answered = matches!(w.opcode, W::RdmaRead | W::AtomicCs | W::AtomicFa);
    if !ans.acked.is_some_and(|p| psn_le(s.last_psn, p)) {
        if has_peer && !answered {
            // Its ACK is owed: coalesced with the next ones.
            sq.psn = (s.last_psn + 1) & 0xff_ffff;
            return Outcome::Sent(w.len as u32, s.first_psn, s.last_psn);
        }
        // Nobody answered: the packet (or its ACK) was lost.
        flush_tally(rdma, sq);
        sq.peer = None;
        return retry_after_timeout(rdma, sq, s.first_psn);
    }
    sq.psn = (s.last_psn + 1) & 0xff_ffff;
    let atomic = matches!(w.opcode, W::AtomicCs | W::AtomicFa);
    Outcome::Done(if atomic { 8 } else { w.len as u32 })
}

/// An RNR NAK for the message from `first_psn` (RNR timer code `t`): sent
/// again after the RNR timer while `rnr_retry` lasts (7: for ever), else
/// RNR_RETRY_EXC_ERR.
fn rnr_outcome(rdma: &Rdma, qp: &Qp, sq: &mut Sq, first_psn: u32, t: u8) -> Outcome {
    rdma.counters.rnr_naks.fetch_add(1, Ordering::Relaxed);
    sq.psn = first_psn;
    if sq.rnr_retry != 7 {
        if sq.rnr_left == 0 {
            rdma.q_count(qp, |c| &c.rnr_nak_retry_err);
            return Outcome::Error(CqeSyndrome::RnrRetryExcErr, vendor::RNR_EXCEEDED);
        }
        sq.rnr_left -= 1;
    }
    let after = Duration::from_micros(rnr_timer_us(t));
    Outcome::Retry(vfio::clock::later(rdma.clock.now(), after))
}

/// A NAK (IBA 9.7.5.1.3-4): a PSN sequence error sends the queue back to
/// the oldest unacknowledged message at once, as a real HCA does (the
/// responder named the PSN it expects: no need to wait for a timeout);
/// any other code fails the WQE with the matching syndrome.
fn nak_outcome(rdma: &Rdma, sq: &mut Sq, first_psn: u32, code: u8) -> Outcome {
    rdma.counters.naks.fetch_add(1, Ordering::Relaxed);
    let synd = match code {
        aeth::NAK_REMOTE_ACCESS => CqeSyndrome::RemoteAccessErr,
        aeth::NAK_REMOTE_OP => CqeSyndrome::RemoteOpErr,
        aeth::NAK_PSN_SEQ => return go_back(sq, first_psn, rdma.clock.now()),
        _ => CqeSyndrome::RemoteInvalReqErr,
    };
    Outcome::Error(synd, vendor::NAK)
}

/// Nothing acknowledged the message from `first_psn`: it is sent again
/// after the local ACK timeout ([`go_back`]).
fn retry_after_timeout(rdma: &Rdma, sq: &mut Sq, first_psn: u32) -> Outcome {
    rdma.counters.ack_timeouts.fetch_add(1, Ordering::Relaxed);
    // No timeout: wait as long as it takes (checked again every second).
    let d = ack_timeout(sq.path.ack_timeout).unwrap_or(Duration::from_secs(1));
    go_back(sq, first_psn, vfio::clock::later(rdma.clock.now(), d))
}

/// The send queue goes back to PSN `first_psn` and sends again at `at`,
/// one of `retry_count` retries (a timeout, or a PSN sequence error NAK,
/// IBA 9.7.5.1.3); none left fails the WQE with
/// TRANSPORT_RETRY_EXC_ERR.
fn go_back(sq: &mut Sq, first_psn: u32, at: Instant) -> Outcome {
    tracing::trace!(
        first_psn,
        retries_left = sq.retries_left,
        "send queue goes back"
    );
    sq.psn = first_psn;
    if sq.retries_left == 0 {
        return Outcome::Error(CqeSyndrome::TransportRetryExcErr, vendor::RETRY_EXCEEDED);
    }
    sq.retries_left -= 1;
    Outcome::Retry(at)
}

/// Completes every posted send WQE as flushed.
fn flush_sq(rdma: &Rdma, qp: &Qp, mem: &IovaMemory) -> bool {
    let mut sq = lock(&qp.sq);
    let Ok(pi) = qp.sq_pi(mem) else {
        return false;
    };
    let mut busy = false;
    let mut b = [0u8; 16];
    while sq.ci != pi {
        busy = true;
        let ci = sq.ci;
        let Some(at) = qp.sq_bb(ci) else {
            break;
        };
        if mem::read(mem, at, &mut b).is_err() {
            break;
        }
        let ds = (be32(&b, 4) & 0x3f) as usize;
        // A WQE that claims more blocks than were posted ends at the
        // producer counter: the flush never runs past it.
        let nbb = (mlx5_hw::wqe::wqebbs_for_ds(ds).max(1) as u16).min(pi.wrapping_sub(ci));
        let c = Completion {
            opcode: CqeOpcode::ReqErr.to_raw(),
            qpn: qp.qpn,
            srqn: qp.cqe_srqn(),
            wqe_counter: ci,
            s_wqe_opcode: b[3],
            error: Some((CqeSyndrome::WrFlushErr.to_raw(), vendor::FLUSH)),
            ..Completion::default()
        };
        if !qp.scq.push(rdma, mem, &c) {
            break;
        }
        sq.ci = ci.wrapping_add(nbb);
    }
    busy
}

/// Completes every posted receive WQE (not an SRQ's) as flushed.
fn flush_rq(rdma: &Rdma, qp: &Qp, mem: &IovaMemory) -> bool {
    if qp.srq.is_some() || qp.rq_type != qp::rq_type::REGULAR {
        return false;
    }
    let mut rq = lock(&qp.rq);
    let Ok(pi) = qp.rq_pi(mem) else {
        return false;
    };
    let mut busy = false;
    // A SEND that was being received is flushed with the rest.
    if rq.send_on {
        rq.send_on = false;
        let c = Completion {
            opcode: CqeOpcode::RespErr.to_raw(),
            qpn: qp.qpn,
            srqn: qp.cqe_srqn(),
            wqe_counter: rq.send.wqe,
            error: Some((CqeSyndrome::WrFlushErr.to_raw(), vendor::FLUSH)),
            ..Completion::default()
        };
        qp.rcq.push(rdma, mem, &c);
        busy = true;
    }
    while rq.ci != pi {
        busy = true;
        let c = Completion {
            opcode: CqeOpcode::RespErr.to_raw(),
            qpn: qp.qpn,
            srqn: qp.cqe_srqn(),
            wqe_counter: rq.ci,
            error: Some((CqeSyndrome::WrFlushErr.to_raw(), vendor::FLUSH)),
            ..Completion::default()
        };
        if !qp.rcq.push(rdma, mem, &c) {
            break;
        }
        rq.ci = rq.ci.wrapping_add(1);
    }
    busy
}

/// The target a DCI's WQE names (none for a NOP or another QP's WQE).
fn dci_target(qp: &Qp, w: &Wqe, wqe: &[u8]) -> Option<Target> {
    let dg = (mlx5_hw::ifc::wqe_ctrl_seg::SIZE_BYTES + wqe_datagram_seg::SIZE_BYTES) as u64;
    (qp.st == qp::st::DCI && w.opcode != WqeOpcode::Nop && w.len >= dg)
        .then(|| dc::target_of(wqe))
        .flatten()
}

/// A DCI's WQE on a stream in error is flushed, never sent.
fn dci_flushed(qp: &Qp, sq: &mut Sq, wqe: &[u8]) -> Option<Outcome> {
    let stream = dc::stream_of(qp, wqe);
    sq.dc.stream = stream;
    dc::stream_in_error(&sq.dc, stream).then_some(Outcome::Error(CqeSyndrome::WrFlushErr, 0))
}

/// The DCI connects to the target its WQE names, unless it is connected
/// to it: the path and DCT number from the address vector; the next PSN
/// is the connection's first.
fn dci_connect(sq: &mut Sq, w: &Wqe) {
    let Some(av) = w.av else {
        return;
    };
    let t = Target {
        dgid: av.rgid,
        dctn: av.dqpn,
        key: av.dc_key,
    };
    if sq.dc.conn.is_some_and(|c| c.0 == t) {
        return;
    }
    sq.path = qp::Path {
        dgid: av.rgid,
        sgid_index: av.sgid_index,
        dmac: av.rmac,
        hop_limit: av.hop_limit,
        tclass: av.tclass,
        flow_label: av.flow_label,
        udp_sport: av.udp_sport,
        ..sq.path
    };
    sq.remote_qpn = t.dctn;
    sq.peer = None;
    sq.dc.conn = Some((t, sq.psn));
    sq.dc.connects += 1;
}

/// The DCI leaves its target (idle, or its next WQE names another): the
/// DCT forgets the connection.
fn dci_disconnect(rdma: &Rdma, qp: &Qp, sq: &mut Sq) {
    if qp.st != qp::st::DCI || !sq.unacked.is_empty() {
        return;
    }
    dci_leave(rdma, qp, sq);
}

/// The DCI tells its target the connection is over (found again by its
/// GID when the peer was dropped for a retry), and forgets it.
fn dci_leave(rdma: &Rdma, qp: &Qp, sq: &mut Sq) {
    let Some((t, _)) = sq.dc.conn.take() else {
        return;
    };
    let dst = match &sq.peer {
        Some(p) => Some((p.rdma.clone(), p.addr)),
        None => rdma.route(&t.dgid).zip(path_addr(rdma, sq)),
    };
    if let Some((dst, addr)) = dst {
        fabric::dc_drained(rdma, &dst, &addr, (t.dctn, qp.qpn), true, &mut |_| {});
    }
    flush_tally(rdma, sq);
    sq.peer = None;
}

/// A DCI's WQE completed in error: the connection is gone; with streams
/// only the WQE's stream goes to error (true: the DCI goes on) until the
/// errored-stream limit, else (and without streams) the DCI goes to ERR.
fn dci_failed(rdma: &Rdma, qp: &Qp, sq: &mut Sq) -> bool {
    dci_leave(rdma, qp, sq);
    if let Some(s) = sq.dc.stream {
        if !dc::stream_failed(qp, &mut sq.dc, s) {
            return true;
        }
    }
    qp.to_error(rdma);
    false
}
