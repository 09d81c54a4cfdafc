//! The responder: what a QP does with the packets that reach it.
//!
//! RC: PSN checking (a duplicate is acknowledged again, a duplicate READ
//! executed again, the last atomic's duplicate answered with the value it
//! saw; a gap answered with a PSN sequence error NAK), SEND into the next receive WQE of the RQ
//! or SRQ (an RNR NAK when none is posted), RDMA WRITE through the rkey
//! (remote write right, PD, bounds), RDMA READ answered with read response
//! packets, atomics executed on 8 aligned bytes and answered with the
//! original value. ACKs are coalesced as ConnectX does: a packet that asks
//! for one (AckReq) leaves it owed, and one ACK for the latest PSN goes
//! out when the requester's burst ends ([`drained`]), after
//! [`ACK_COALESCE`] owed ones, or at once when the packet completed a
//! receive (its consumer may destroy the QP on seeing the CQE); NAKs, read responses and atomic
//! acknowledgements go out at once (each acknowledges every earlier
//! packet). An error NAKs the requester
//! and moves this QP to ERR as hardware does: a remote access or invalid
//! request error with an affiliated async event, a receive too small
//! (local length) or a bad receive lkey (local protection) with an error
//! CQE. UC: the same without responses; a bad message is dropped. UD:
//! the Q_Key is checked, the 40-byte GRH is scattered before the payload.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mlx5_hw::cqe::{CqeOpcode, CqeSyndrome};
use mlx5_hw::event::EventType;
use vfio::IovaMemory;

use super::cq::{Completion, InlineScatter};
use super::mem::{self, access, Extent, Hinted, KeyError};
use super::packet::{self, aeth, op, svc, Aeth, Bth, Headers, Reth, RoceAddr, Service};
use super::qp::{self, Qp, RecvError, Rq, Srq, SrqKind};
use super::requester::vendor;
use super::{rlock, Rdma};
use crate::fabric::{Packet, Payload};
use crate::lock;

/// A responder sends an ACK at the latest after this many packets that
/// asked for one.
pub(crate) const ACK_COALESCE: u32 = 64;

/// Receives one packet; `hint`: the destination QP as the sender last
/// found it (used if it still is that QP); `routed`: the sender found this
/// function by the destination GID since the GID table last changed.
pub(crate) fn receive(
    rdma: &Rdma,
    mem: &IovaMemory,
    dhint: Option<&Hinted<'_>>,
    routed: bool,
    hint: Option<&Arc<Qp>>,
    pkt: &Packet<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    match dhint {
        Some(d) => receive_in(rdma, d, routed, hint, pkt, reply),
        None => receive_in(rdma, &Hinted::new(mem), routed, hint, pkt, reply),
    }
}

/// [`receive`] into `dmem`.
fn receive_in(
    rdma: &Rdma,
    dmem: &Hinted<'_>,
    routed: bool,
    hint: Option<&Arc<Qp>>,
    pkt: &Packet<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    let drop = |why: &str| {
        rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(why, "packet dropped");
    };
    let h = pkt.hdr;
    if h.bth.dest_qp == packet::MULTICAST_QPN
        && packet::is_multicast_gid(&pkt.addr.dst_gid)
        && packet::service(h.bth.opcode) == Service::Ud
    {
        // A copy for each QP of the group (none: nobody listens).
        for qpn in rdma.mcg_members(&pkt.addr.dst_gid) {
            let Some(qp) = rdma.qp(qpn) else {
                continue;
            };
            let mut hdr = *h;
            hdr.bth.dest_qp = qpn;
            let copy = Packet {
                addr: pkt.addr,
                hdr: &hdr,
                payload: pkt.payload,
            };
            receive_in(rdma, dmem, true, Some(&qp), &copy, reply);
        }
        return;
    }
    if !routed && !rdma.has_gid(&pkt.addr.dst_gid) {
        return drop("destination GID");
    }
    if h.bth.opcode & 0xe0 == svc::DC {
        return super::dc::receive(rdma, dmem, pkt, reply);
    }
    let qpn = if h.bth.dest_qp == 1 {
        match *rlock(&rdma.gsi) {
            Some(q) => q,
            None => return drop("no GSI QP"),
        }
    } else {
        h.bth.dest_qp
    };
    let found;
    let qp = match hint {
        Some(q) if q.qpn == qpn && q.state() != qp::state::DESTROYED => q,
        _ => {
            let Some(q) = rdma.qp(qpn) else {
                return drop("no such QP");
            };
            found = q;
            &found
        }
    };
    if !qp.receives() {
        return drop("QP state");
    }
    let mem = dmem.mem;
    match (packet::service(h.bth.opcode), qp.st) {
        (Service::Rc, qp::st::RC) => rc(rdma, qp, h, pkt, dmem, reply),
        (Service::Xrc, qp::st::XRC) => rc(rdma, qp, h, pkt, dmem, &mut as_xrc(reply)),
        (Service::Uc, qp::st::UC) => uc(rdma, qp, h, pkt, mem),
        (Service::Ud, qp::st::UD | qp::st::QP1) => ud(rdma, qp, h, pkt, mem),
        _ => drop("service"),
    }
}

/// The requester has nothing more queued for RC QP `qpn` (its requests
/// came addressed as `addr`): the ACK held back, if any, goes out now.
pub(crate) fn drained(rdma: &Rdma, addr: &RoceAddr, qpn: u32, reply: &mut dyn FnMut(&Packet<'_>)) {
    let Some(qp) = rdma.qp(qpn) else {
        return;
    };
    match qp.st {
        qp::st::RC => owed_ack(&qp, addr, reply),
        qp::st::XRC => owed_ack(&qp, addr, &mut as_xrc(reply)),
        _ => {}
    }
}

/// `reply` for an XRC target: its responses go out with XRC opcodes
/// (IBA table 38, 101xxxxx; no XRCETH on a response).
fn as_xrc<'r>(reply: &'r mut dyn FnMut(&Packet<'_>)) -> impl FnMut(&Packet<'_>) + 'r {
    move |p: &Packet<'_>| {
        let mut h = *p.hdr;
        h.bth.opcode = svc::XRC | (h.bth.opcode & 0x1f);
        reply(&Packet {
            addr: p.addr,
            hdr: &h,
            payload: p.payload,
        });
    }
}

/// The XRC SRQ an XRC request's XRCETH names, if it is one of `qp`'s
/// domain (IBA 9.8.?: an XRC target serves the XRC SRQs of its domain).
fn xrc_srq(rdma: &Rdma, qp: &Qp, h: &Headers) -> Option<Arc<Srq>> {
    let n = h.xrceth?;
    rlock(&rdma.srqs)
        .get(&n)
        .filter(|s| s.kind == SrqKind::Xrc && s.xrcd == qp.xrcd)
        .cloned()
}

/// The ACK an RC responder (a QP, or a DCT's connection) holds back, if
/// any, goes out now.
pub(crate) fn owed_ack(qp: &Qp, addr: &RoceAddr, reply: &mut dyn FnMut(&Packet<'_>)) {
    if !qp.receives() {
        return;
    }
    let mut rq = lock(&qp.rq);
    if rq.ack_owed == 0 {
        return;
    }
    rq.ack_owed = 0;
    let (remote, psn, msn) = (rq.remote_qpn, psn_add(rq.epsn, 0xff_ffff), rq.msn);
    drop(rq);
    respond(
        reply,
        addr,
        remote,
        psn,
        aeth::ACK | aeth::CREDITS_INVALID,
        msn,
    );
}

fn psn_add(p: u32, n: u32) -> u32 {
    (p + n) & 0xff_ffff
}

/// Sends one response: ACK, NAK or RNR NAK.
fn respond(
    reply: &mut dyn FnMut(&Packet<'_>),
    to: &RoceAddr,
    dqpn: u32,
    psn: u32,
    syndrome: u8,
    msn: u32,
) {
    let h = Headers {
        bth: Bth {
            opcode: svc::RC | op::ACKNOWLEDGE,
            pkey: packet::DEFAULT_PKEY,
            dest_qp: dqpn,
            psn,
            ..Bth::default()
        },
        aeth: Some(Aeth { syndrome, msn }),
        ..Headers::default()
    };
    let to = back(to);
    reply(&Packet {
        addr: &to,
        hdr: &h,
        payload: Payload::None,
    });
}

fn back(a: &RoceAddr) -> RoceAddr {
    RoceAddr {
        dst_mac: a.src_mac,
        src_mac: a.dst_mac,
        src_gid: a.dst_gid,
        dst_gid: a.src_gid,
        ..*a
    }
}

/// The responder's errors that end the connection.
enum Fatal {
    /// NAK remote access; async WQ access error.
    Access,
    /// NAK invalid request; async WQ invalid request error.
    Invalid,
    /// NAK invalid request; local length error CQE on the receive.
    Length(u16),
    /// NAK remote operational error; local protection error CQE.
    Protection(u16, u8),
    /// The receive WQE's memory is not present (ODP): a page fault
    /// (never reaches [`fatal`]: [`refuse`] raises it).
    PageFault(u16),
}

fn fatal(rdma: &Rdma, qp: &Qp, rq: &mut Rq, mem: &IovaMemory, f: Fatal) -> u8 {
    let (code, cqe) = match f {
        // A DCT's connection ends without an event (the DCT goes on).
        Fatal::Access => {
            if !qp.dct_conn {
                rdma.qp_event(EventType::WqAccessError, qp.qpn, false);
            }
            (aeth::NAK_REMOTE_ACCESS, None)
        }
        Fatal::Invalid => {
            if !qp.dct_conn {
                rdma.qp_event(EventType::WqInvalReqError, qp.qpn, false);
            }
            (aeth::NAK_INVALID_REQUEST, None)
        }
        Fatal::Length(wqe) => (
            aeth::NAK_INVALID_REQUEST,
            Some((wqe, CqeSyndrome::LocalLengthErr, vendor::LENGTH)),
        ),
        Fatal::Protection(wqe, v) => (
            aeth::NAK_REMOTE_OP,
            Some((wqe, CqeSyndrome::LocalProtErr, v)),
        ),
        Fatal::PageFault(wqe) => (
            aeth::NAK_REMOTE_OP,
            Some((wqe, CqeSyndrome::LocalProtErr, vendor::PAGE_FAULT)),
        ),
    };
    if let Some((wqe, synd, v)) = cqe {
        recv_error(rdma, qp, rq, mem, wqe, synd, v);
    }
    rq.send_on = false;
    rq.write_on = false;
    qp.to_error(rdma);
    code
}

fn recv_error(rdma: &Rdma, qp: &Qp, rq: &Rq, mem: &IovaMemory, wqe: u16, synd: CqeSyndrome, v: u8) {
    let c = Completion {
        opcode: CqeOpcode::RespErr.to_raw(),
        qpn: qp.qpn,
        wqe_counter: wqe,
        srqn: qp.recv_srqn(rq),
        error: Some((synd.to_raw(), v)),
        ..Completion::default()
    };
    rdma.counters.error_cqes.fetch_add(1, Ordering::Relaxed);
    qp.recv_cq(rq).push(rdma, mem, &c);
}

fn key_vendor(e: KeyError) -> u8 {
    match e {
        KeyError::Invalid => vendor::BAD_LKEY,
        KeyError::Pd => vendor::PD_MISMATCH,
        KeyError::Access => vendor::NO_ACCESS,
        KeyError::Bounds => vendor::OUT_OF_BOUNDS,
        KeyError::NotPresent => vendor::PAGE_FAULT,
    }
}

/// Takes a receive WQE into `rq.send`; `Err(None)` when none is posted.
fn take(rdma: &Rdma, qp: &Qp, rq: &mut Rq, mem: &IovaMemory) -> Result<(), Option<Fatal>> {
    let mut r = std::mem::take(&mut rq.send);
    let res = qp.take_recv(rdma, rq, mem, &mut r);
    rq.send = r;
    match res {
        Ok(()) => Ok(()),
        Err(RecvError::Empty) => Err(None),
        Err(RecvError::Key(w, k)) => Err(Some(Fatal::Protection(w, key_vendor(k)))),
        Err(RecvError::Fault(w)) => Err(Some(Fatal::Protection(w, vendor::DMA_FAULT))),
        Err(RecvError::PageFault(w)) => Err(Some(Fatal::PageFault(w))),
    }
}

/// The bytes of a one-packet SEND that go to its CQE instead of the
/// receive buffer: RC and UC QPs whose `cs_res` asks for it, up to 32
/// bytes (64 with `RES_SCAT_DATA64_CQE` on a 128-byte-CQE CQ), as
/// ConnectX scatters small messages (PRM "Scatter to CQE"). The receive
/// WQE is consumed all the same; the driver copies the bytes out.
fn scatter_to_cqe(qp: &Qp, payload: &Payload<'_>) -> Option<InlineScatter> {
    // The CQE size matters only to the 64-byte mode: read it (under the
    // CQ's lock) only then, not for every SEND.
    let cqe_bytes = match qp.cs_res {
        mlx5_hw::qp::RES_SCAT_DATA64_CQE => qp.rcq.stride(),
        _ => 64,
    };
    let limit = mlx5_hw::qp::res_scatter_limit(qp.cs_res, cqe_bytes);
    let len = payload.len();
    // A QP without `cs_res` (limit 0) scatters nothing, an empty SEND
    // included; an empty SEND has nothing to scatter (as the requester's
    // side, `len > 0`).
    if len == 0 || len > limit || !(qp.st == qp::st::RC || qp.st == qp::st::UC) {
        return None;
    }
    let mut s = InlineScatter {
        data: [0; 64],
        len: len as u8,
    };
    payload.read(&mut s.data[..len as usize]).ok()?;
    Some(s)
}

fn resp_completion(qp: &Qp, rq: &Rq, opcode: CqeOpcode, h: &Headers, src_qp: u32) -> Completion {
    Completion {
        opcode: opcode.to_raw(),
        qpn: qp.qpn,
        wqe_counter: rq.send.wqe,
        byte_cnt: rq.send.off as u32,
        imm: h.imm.or(h.ieth).unwrap_or_default(),
        flags_rqpn: src_qp & 0xff_ffff,
        srqn: qp.recv_srqn(rq),
        solicited: h.bth.se,
        ..Completion::default()
    }
}

/// One RC request packet as the responder sees it (IBA 9.7.4: responder
/// side), with what every step needs.
struct Req<'a, 'm, 'p> {
    rdma: &'a Rdma,
    qp: &'a Arc<Qp>,
    h: &'a Headers,
    pkt: &'a Packet<'p>,
    dmem: &'a Hinted<'m>,
    /// The requester's QP, the destination of every response.
    remote: u32,
    psn: u32,
    /// The path MTU, in bytes.
    mtu: u64,
}

/// A request the responder accepted.
enum Accepted {
    /// Executed: the expected PSN moves on and an ACK is owed if the
    /// packet asked for one (coalesced).
    Ack,
    /// Executed and a receive CQE written: the ACK it asked for goes out
    /// now with every owed one. The consumer may see the CQE and destroy
    /// the QP at once (ibv_rc_pingpong's client after its last receive);
    /// an ACK still held back would then never go, and the requester
    /// would retry into RETRY_EXC_ERR.
    Completed,
    /// Answered already (a read response, an atomic acknowledgement),
    /// the expected PSN moved past it.
    Answered,
}

/// A request the responder refused (IBA 9.7.5.2).
enum Refused {
    /// No receive WQE posted: RNR NAK, the QP stays as it is.
    Rnr,
    /// NAK, and the QP goes to ERR.
    Fatal(Fatal),
    /// An rkey's page is not present (ODP): RNR NAK while the fault is
    /// outstanding, a remote access NAK if it failed.
    RdmaFault(super::odp::RdmaFault),
}

impl From<Fatal> for Refused {
    fn from(f: Fatal) -> Self {
        match f {
            Fatal::PageFault(w) => Refused::Fatal(Fatal::PageFault(w)),
            f => Refused::Fatal(f),
        }
    }
}

impl Refused {
    /// A fault of the rkey access `(rkey, va, len)` if `e` is one, else
    /// the remote access error.
    fn of_key(r: &Req<'_, '_, '_>, e: KeyError, rkey: u32, va: u64, len: u32, write: bool) -> Self {
        if e != KeyError::NotPresent {
            return Fatal::Access.into();
        }
        Refused::RdmaFault(super::odp::RdmaFault {
            qpn: r.qp.qpn,
            rkey,
            va,
            len,
            write,
            packet_length: r.pkt.payload.len() as u16,
        })
    }
}

/// An RC request packet, in the steps of IBA 9.7.5.1 / 9.7.4.1: the PSN
/// check (a duplicate or out-of-sequence request goes no further), then per
/// opcode the opcode-sequence check, rkey and access validation and the
/// execution (SEND, WRITE, READ, atomic, each with its CQE where one is
/// due), then the ACK or NAK.
pub(crate) fn rc(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    h: &Headers,
    pkt: &Packet<'_>,
    dmem: &Hinted<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    let mut rq = lock(&qp.rq);
    let r = Req {
        rdma,
        qp,
        h,
        pkt,
        dmem,
        remote: rq.remote_qpn,
        psn: h.bth.psn,
        mtu: u64::from(rq.mtu.max(256)),
    };
    if !in_sequence(&r, &mut rq, reply) {
        return;
    }
    if qp.st == qp::st::XRC {
        // Each request names its XRC SRQ: its WQEs, PD and CQ serve it.
        rq.xrc = xrc_srq(rdma, qp, h);
        tracing::trace!(
            qpn = qp.qpn,
            xrceth = ?h.xrceth,
            srq = ?rq.xrc.as_ref().map(|s| (s.srqn, s.cqn, s.xrc_cq.is_some())),
            "XRC request"
        );
        if rq.xrc.is_none() {
            tracing::debug!(qpn = qp.qpn, xrceth = ?h.xrceth, "XRC SRQ not of the target's domain");
            return refuse(&r, &mut rq, Refused::Fatal(Fatal::Invalid), reply);
        }
    }
    if rdma.odp.responder_waits(qp.qpn) {
        // A page fault holds the QP until PAGE_FAULT_RESUME: RNR NAK.
        rdma.counters.rnr_naks.fetch_add(1, Ordering::Relaxed);
        rq.ack_owed = 0;
        let syndrome = aeth::RNR_NAK | rq.min_rnr_nak;
        return respond(reply, r.pkt.addr, r.remote, r.psn, syndrome, rq.msn);
    }
    let o = h.bth.opcode & 0x1f;
    let done = match o {
        op::SEND_FIRST
        | op::SEND_MIDDLE
        | op::SEND_LAST
        | op::SEND_LAST_IMM
        | op::SEND_ONLY
        | op::SEND_ONLY_IMM
        | op::SEND_LAST_INV
        | op::SEND_ONLY_INV => rc_send(&r, &mut rq, o),
        op::WRITE_FIRST
        | op::WRITE_MIDDLE
        | op::WRITE_LAST
        | op::WRITE_LAST_IMM
        | op::WRITE_ONLY
        | op::WRITE_ONLY_IMM => rc_write(&r, &mut rq, o),
        op::READ_REQUEST => rc_read(&r, &mut rq, reply),
        op::COMPARE_SWAP | op::FETCH_ADD => rc_atomic(&r, &mut rq, o, reply),
        _ => Err(Refused::Fatal(Fatal::Invalid)),
    };
    match done {
        Ok(Accepted::Ack) => ack(&r, &mut rq, reply, false),
        Ok(Accepted::Completed) => ack(&r, &mut rq, reply, true),
        Ok(Accepted::Answered) => {}
        Err(f) => refuse(&r, &mut rq, f, reply),
    }
}

/// The PSN check (IBA 9.7.5.1.1-2): true for the expected PSN; a duplicate
/// is acknowledged again, a PSN ahead of the expected one (a packet was
/// lost) answered with a PSN sequence error NAK naming the expected PSN.
fn in_sequence(r: &Req<'_, '_, '_>, rq: &mut Rq, reply: &mut dyn FnMut(&Packet<'_>)) -> bool {
    let diff = r.psn.wrapping_sub(rq.epsn) & 0xff_ffff;
    if diff == 0 {
        rq.seq_nak = false;
        return true;
    }
    if diff >= 0x80_0000 {
        duplicate(r, rq, reply);
    } else if !rq.seq_nak {
        // The NAK acknowledges everything before `epsn`.
        rq.seq_nak = true;
        rq.ack_owed = 0;
        let nak = aeth::NAK | aeth::NAK_PSN_SEQ;
        respond(reply, r.pkt.addr, r.remote, rq.epsn, nak, rq.msn);
    }
    false
}

/// A duplicate request: the requester went back because a response was
/// lost. An RDMA READ is executed again (its read responses sent again;
/// none if its rkey no longer grants the read: an ACK would complete it
/// without data), the last atomic answered again with the original value
/// it saw (not executed twice), anything else acknowledged again.
fn duplicate(r: &Req<'_, '_, '_>, rq: &mut Rq, reply: &mut dyn FnMut(&Packet<'_>)) {
    match (r.h.bth.opcode & 0x1f, r.h.reth, rq.atomic_done) {
        (op::READ_REQUEST, reth, _) => {
            let mut ext = Vec::new();
            if let Some(reth) = reth.filter(|t| rq.rre && read_target(r, rq, *t, &mut ext)) {
                read_responses(r, &ext, u64::from(reth.dma_len), rq.msn, reply);
            }
            return;
        }
        (op::COMPARE_SWAP | op::FETCH_ADD, _, Some((psn, orig))) if psn == r.psn => {
            return atomic_ack(r, rq.msn, orig, reply);
        }
        _ => {}
    }
    let ack = aeth::ACK | aeth::CREDITS_INVALID;
    respond(reply, r.pkt.addr, r.remote, r.psn, ack, rq.msn);
}

/// A request executed: the expected PSN moves on; if it asked for an ACK,
/// one is owed until the requester's burst ends, or sent now once
/// [`ACK_COALESCE`] are owed or the request `completed` a receive.
fn ack(r: &Req<'_, '_, '_>, rq: &mut Rq, reply: &mut dyn FnMut(&Packet<'_>), completed: bool) {
    rq.epsn = psn_add(r.psn, 1);
    if !r.h.bth.ack_req {
        return;
    }
    rq.ack_owed += 1;
    if rq.ack_owed >= ACK_COALESCE || completed {
        rq.ack_owed = 0;
        let ack = aeth::ACK | aeth::CREDITS_INVALID;
        respond(reply, r.pkt.addr, r.remote, r.psn, ack, rq.msn);
    }
}

/// A request refused: an RNR NAK (counted as out of buffer), or a NAK
/// whose error moves the QP to ERR ([`fatal`]). Either acknowledges every
/// packet before it, so no ACK is owed any more.
fn refuse(r: &Req<'_, '_, '_>, rq: &mut Rq, f: Refused, reply: &mut dyn FnMut(&Packet<'_>)) {
    let rdma = r.rdma;
    let f = match odp_hold(r, rq, f) {
        Some(f) => f,
        None => {
            // A page fault outstanding: RNR NAK, nothing consumed.
            rdma.counters.rnr_naks.fetch_add(1, Ordering::Relaxed);
            rq.ack_owed = 0;
            let syndrome = aeth::RNR_NAK | rq.min_rnr_nak;
            return respond(reply, r.pkt.addr, r.remote, r.psn, syndrome, rq.msn);
        }
    };
    let syndrome = match f {
        Refused::Rnr => {
            rdma.counters.rnr_naks.fetch_add(1, Ordering::Relaxed);
            rdma.q_count(r.qp, |c| &c.out_of_buffer);
            rq.ack_owed = 0;
            // The rest of the message, already on its way, meets no PSN
            // sequence NAK: this NAK is the one for `epsn`.
            rq.seq_nak = true;
            aeth::RNR_NAK | rq.min_rnr_nak
        }
        Refused::Fatal(f) => {
            rq.ack_owed = 0;
            aeth::NAK | fatal(rdma, r.qp, rq, r.dmem.mem, f)
        }
        Refused::RdmaFault(_) => {
            rq.ack_owed = 0;
            aeth::NAK | fatal(rdma, r.qp, rq, r.dmem.mem, Fatal::Access)
        }
    };
    respond(reply, r.pkt.addr, r.remote, r.psn, syndrome, rq.msn);
}

/// A page fault of the responder (ODP, [`super::odp`]): `None` while it
/// holds the QP (the packet gets an RNR NAK), the error it became once
/// resumed with one (or without a page-fault EQ); other refusals as they
/// are.
fn odp_hold(r: &Req<'_, '_, '_>, rq: &Rq, f: Refused) -> Option<Refused> {
    use super::odp::Hold;
    let hold = match &f {
        Refused::RdmaFault(pf) => r.rdma.rdma_fault(*pf),
        Refused::Fatal(Fatal::PageFault(w)) => {
            r.rdma
                .wqe_fault(recv_fault(r.qp, rq, *w, r.pkt.payload.len()))
        }
        _ => return Some(f),
    };
    (hold == Hold::Failed).then_some(f)
}

/// The page fault of receive WQE `wqe` of `qp`: its SRQ's (type RMP,
/// naming the SRQ, as Linux's `odp_get_rsc` looks it up) or its own
/// receive queue's (type RESP, naming the QP).
fn recv_fault(qp: &Qp, rq: &Rq, wqe: u16, packet_length: u64) -> super::odp::WqeFault {
    use mlx5_hw::event::{WQE_PF_TYPE_RESP, WQE_PF_TYPE_RMP};
    let (wq, ty) = match qp.recv_srq(rq) {
        Some(s) => (s.srqn, WQE_PF_TYPE_RMP),
        None => (qp.qpn, WQE_PF_TYPE_RESP),
    };
    super::odp::WqeFault {
        qpn: qp.qpn,
        wq,
        wqe_index: wqe,
        ty,
        side: super::odp::Side::Responder,
        packet_length: packet_length as u16,
    }
}

/// Whether a packet's payload length fits its place in the message: a
/// middle packet (or a first one) carries exactly the MTU, a last one
/// (or an only one) at most the MTU.
fn payload_len_ok(len: u64, mtu: u64, last: bool) -> bool {
    if last {
        len <= mtu
    } else {
        len == mtu
    }
}

/// Takes the receive WQE a SEND, or a WRITE with immediate, consumes;
/// none posted is an RNR.
fn take_recv(r: &Req<'_, '_, '_>, rq: &mut Rq) -> Result<(), Refused> {
    match take(r.rdma, r.qp, rq, r.dmem.mem) {
        Ok(()) => Ok(()),
        Err(None) => Err(Refused::Rnr),
        Err(Some(f)) => Err(Refused::Fatal(f)),
    }
}

/// An RC SEND packet (IBA 9.7.4.1.4 opcode sequence, then the receive
/// WQE, the scatter and, on the last packet, the CQE).
fn rc_send(r: &Req<'_, '_, '_>, rq: &mut Rq, o: u8) -> Result<Accepted, Refused> {
    let first = matches!(
        o,
        op::SEND_FIRST | op::SEND_ONLY | op::SEND_ONLY_IMM | op::SEND_ONLY_INV
    );
    let last = !matches!(o, op::SEND_FIRST | op::SEND_MIDDLE);
    let len = r.pkt.payload.len();
    if first == rq.send_on || !payload_len_ok(len, r.mtu, last) {
        return Err(Fatal::Invalid.into());
    }
    if first {
        take_recv(r, rq)?;
        rq.send_on = true;
    }
    let wqe = rq.send.wqe;
    if rq.send.off + len > rq.send.cap {
        return Err(Fatal::Length(wqe).into());
    }
    rq.send_inline = if first && last {
        scatter_to_cqe(r.qp, &r.pkt.payload)
    } else {
        None
    };
    if rq.send_inline.is_none()
        && r.pkt
            .payload
            .copy_to_hinted(r.dmem, &rq.send.ext, rq.send.off)
            .is_err()
    {
        return Err(Fatal::Protection(wqe, vendor::DMA_FAULT).into());
    }
    rq.send.off += len;
    if last && matches!(o, op::SEND_LAST_INV | op::SEND_ONLY_INV) {
        // The key to invalidate must allow it (IBA 9.4.1.1.4: else an
        // Invalid Request NAK, REMOTE_INVAL_REQ_ERR at the requester).
        let pd = r.qp.access_pd(rq);
        if !r.h.ieth.is_some_and(|k| invalidate(r.rdma, r.qp, pd, k)) {
            return Err(Fatal::Invalid.into());
        }
    }
    if last {
        send_complete(r, rq, o);
        return Ok(Accepted::Completed);
    }
    Ok(Accepted::Ack)
}

/// The last packet of a SEND landed: invalidate the IETH's key if it
/// carries one, count the message and write the receive CQE (a CQ
/// overrun moves the QP to ERR).
fn send_complete(r: &Req<'_, '_, '_>, rq: &mut Rq, o: u8) {
    let (rdma, qp) = (r.rdma, r.qp);
    let opcode = match o {
        op::SEND_LAST_IMM | op::SEND_ONLY_IMM => CqeOpcode::RespSendImm,
        op::SEND_LAST_INV | op::SEND_ONLY_INV => CqeOpcode::RespSendInv,
        _ => CqeOpcode::RespSend,
    };
    let mut c = resp_completion(qp, rq, opcode, r.h, r.remote);
    c.inline = rq.send_inline.take();
    rq.send_on = false;
    rq.msn = psn_add(rq.msn, 1);
    rdma.counters
        .messages_received
        .fetch_add(1, Ordering::Relaxed);
    if !qp.recv_cq(rq).push(rdma, r.dmem.mem, &c) {
        qp.to_error(rdma);
    }
}

/// An RC RDMA WRITE packet: the opcode sequence, the RETH of the first
/// packet checked ([`write_target`]), the length, the receive WQE an
/// immediate consumes, the payload landed and, on the last packet with an
/// immediate, the CQE.
fn rc_write(r: &Req<'_, '_, '_>, rq: &mut Rq, o: u8) -> Result<Accepted, Refused> {
    let first = matches!(o, op::WRITE_FIRST | op::WRITE_ONLY | op::WRITE_ONLY_IMM);
    let last = !matches!(o, op::WRITE_FIRST | op::WRITE_MIDDLE);
    let imm = matches!(o, op::WRITE_LAST_IMM | op::WRITE_ONLY_IMM);
    if (first && rq.write_on && o != op::WRITE_FIRST) || (!first && !rq.write_on) {
        return Err(Fatal::Invalid.into());
    }
    if first {
        write_target(r, rq)?;
    }
    let len = r.pkt.payload.len();
    if rq.write.off + len > rq.write.cap || (last && rq.write.off + len != rq.write.cap) {
        return Err(Fatal::Invalid.into());
    }
    if imm && !rq.send_on {
        // The immediate needs a receive WQE, before any byte lands.
        if let Err(e) = take_recv(r, rq) {
            if first && matches!(e, Refused::Rnr | Refused::Fatal(Fatal::PageFault(_))) {
                rq.write_on = false;
            }
            return Err(e);
        }
    }
    if r.pkt
        .payload
        .copy_to_hinted(r.dmem, &rq.write.ext, rq.write.off)
        .is_err()
    {
        return Err(Fatal::Access.into());
    }
    rq.write.off += len;
    if last {
        write_complete(r, rq, imm);
        if imm {
            return Ok(Accepted::Completed);
        }
    }
    Ok(Accepted::Ack)
}

/// The first packet of an RDMA WRITE: its RETH names the target, which
/// the rkey must grant remote write on (PD, bounds); the WRITE is then in
/// progress.
fn write_target(r: &Req<'_, '_, '_>, rq: &mut Rq) -> Result<(), Refused> {
    let Some(reth) = r.h.reth else {
        return Err(Fatal::Invalid.into());
    };
    if !rq.rwe {
        return Err(Fatal::Access.into());
    }
    let pd = r.qp.access_pd(rq);
    let w = &mut rq.write;
    w.ext.clear();
    w.off = 0;
    w.cap = u64::from(reth.dma_len);
    let res = if reth.dma_len == 0 {
        Ok(())
    } else if !bound_ok(r.rdma, &mut rq.rkeys, reth.rkey, r.qp.qpn) {
        Err(KeyError::Invalid)
    } else {
        r.rdma.resolve_cached(
            reth.rkey,
            &mut rq.rkeys,
            pd,
            access::RW,
            reth.va,
            u64::from(reth.dma_len),
            &mut rq.write.ext,
        )
    };
    if let Err(e) = res {
        return Err(Refused::of_key(
            r,
            e,
            reth.rkey,
            reth.va,
            reth.dma_len,
            true,
        ));
    }
    rq.write_on = true;
    Ok(())
}

/// The last packet of an RDMA WRITE landed: count the message; with an
/// immediate, write the receive CQE (a CQ overrun moves the QP to ERR).
fn write_complete(r: &Req<'_, '_, '_>, rq: &mut Rq, imm: bool) {
    let (rdma, qp) = (r.rdma, r.qp);
    rq.write_on = false;
    rq.msn = psn_add(rq.msn, 1);
    rdma.counters
        .messages_received
        .fetch_add(1, Ordering::Relaxed);
    if imm {
        let mut c = resp_completion(qp, rq, CqeOpcode::RespWrImm, r.h, r.remote);
        c.byte_cnt = rq.write.cap as u32;
        if !qp.recv_cq(rq).push(rdma, r.dmem.mem, &c) {
            qp.to_error(rdma);
        }
    }
}

/// An RDMA READ request: the rkey must grant remote read on the RETH's
/// range; the read response packets then go out ([`read_responses`]) and
/// the expected PSN moves past the PSNs they take.
fn rc_read(
    r: &Req<'_, '_, '_>,
    rq: &mut Rq,
    reply: &mut dyn FnMut(&Packet<'_>),
) -> Result<Accepted, Refused> {
    let Some(reth) = r.h.reth else {
        return Err(Fatal::Invalid.into());
    };
    if !rq.rre {
        return Err(Fatal::Access.into());
    }
    let mut w = std::mem::take(&mut rq.write);
    w.ext.clear();
    if let Err(e) = read_key(r, rq, reth, &mut w.ext) {
        rq.write = w;
        return Err(Refused::of_key(
            r,
            e,
            reth.rkey,
            reth.va,
            reth.dma_len,
            false,
        ));
    }
    let msn = psn_add(rq.msn, 1);
    rq.ack_owed = 0;
    let n = read_responses(r, &w.ext, u64::from(reth.dma_len), msn, reply);
    rq.write = w;
    rq.msn = msn;
    rq.epsn = psn_add(r.psn, n as u32);
    r.rdma
        .counters
        .messages_received
        .fetch_add(1, Ordering::Relaxed);
    Ok(Accepted::Answered)
}

/// Whether the rkey grants remote read on the RETH's range (PD, bounds);
/// `ext` then holds the range.
fn read_target(r: &Req<'_, '_, '_>, rq: &mut Rq, reth: Reth, ext: &mut Vec<Extent>) -> bool {
    read_key(r, rq, reth, ext).is_ok()
}

/// [`read_target`], with the key's refusal.
fn read_key(
    r: &Req<'_, '_, '_>,
    rq: &mut Rq,
    reth: Reth,
    ext: &mut Vec<Extent>,
) -> Result<(), KeyError> {
    if reth.dma_len == 0 {
        return Ok(());
    }
    let pd = r.qp.access_pd(rq);
    let k = r
        .rdma
        .mkey_cached(reth.rkey, &mut rq.rkeys)
        .filter(|k| k.usable_by(r.qp.qpn))
        .ok_or(KeyError::Invalid)?;
    k.resolve(pd, access::RR, reth.va, u64::from(reth.dma_len), ext)
}

/// Sends the read response packets of `total` bytes of `ext`, MTU-sized,
/// from the request's PSN, the first and last with an AETH (IBA 9.7.5.1.5);
/// returns how many.
fn read_responses(
    r: &Req<'_, '_, '_>,
    ext: &[Extent],
    total: u64,
    msn: u32,
    reply: &mut dyn FnMut(&Packet<'_>),
) -> u64 {
    let mtu = r.mtu;
    let n = total.div_ceil(mtu).max(1);
    let to = back(r.pkt.addr);
    for i in 0..n {
        let first = i == 0;
        let last = i + 1 == n;
        let ro = match (first, last) {
            (true, true) => op::READ_RESPONSE_ONLY,
            (true, false) => op::READ_RESPONSE_FIRST,
            (false, false) => op::READ_RESPONSE_MIDDLE,
            (false, true) => op::READ_RESPONSE_LAST,
        };
        let rh = Headers {
            bth: Bth {
                opcode: svc::RC | ro,
                pkey: packet::DEFAULT_PKEY,
                dest_qp: r.remote,
                psn: psn_add(r.psn, i as u32),
                ..Bth::default()
            },
            aeth: (first || last).then_some(Aeth {
                syndrome: aeth::ACK | aeth::CREDITS_INVALID,
                msn,
            }),
            ..Headers::default()
        };
        let skip = i * mtu;
        let plen = (total - skip).min(mtu);
        reply(&Packet {
            addr: &to,
            hdr: &rh,
            payload: if plen == 0 {
                Payload::None
            } else {
                Payload::Mem {
                    mem: r.dmem.mem,
                    ext,
                    skip,
                    len: plen,
                }
            },
        });
    }
    n
}

/// An atomic request (IBA 9.4.5): 8 aligned bytes the rkey grants remote
/// atomic access on, compared and swapped or added to, big-endian; the
/// atomic acknowledgement carries the original value.
fn rc_atomic(
    r: &Req<'_, '_, '_>,
    rq: &mut Rq,
    o: u8,
    reply: &mut dyn FnMut(&Packet<'_>),
) -> Result<Accepted, Refused> {
    let Some(a) = r.h.atomic else {
        return Err(Fatal::Invalid.into());
    };
    if !rq.rae {
        return Err(Fatal::Access.into());
    }
    if a.va % 8 != 0 {
        return Err(Fatal::Invalid.into());
    }
    let mut w = std::mem::take(&mut rq.write);
    w.ext.clear();
    let res = r
        .rdma
        .mkey(a.rkey)
        .filter(|k| k.usable_by(r.qp.qpn))
        .ok_or(KeyError::Invalid)
        .and_then(|k| k.resolve(r.qp.access_pd(rq), access::A, a.va, 8, &mut w.ext));
    let target = w.ext.first().map(|e| e.iova);
    rq.write = w;
    if let Err(e) = res {
        return Err(Refused::of_key(r, e, a.rkey, a.va, 8, true));
    }
    let Some(iova) = target else {
        return Err(Fatal::Access.into());
    };
    let cs = o == op::COMPARE_SWAP;
    let host = r.rdma.host_endian_atomics.load(Ordering::Acquire);
    let res = mem::atomic64(r.dmem.mem, iova, host, |old| {
        if cs {
            if old == a.compare {
                a.swap_add
            } else {
                old
            }
        } else {
            old.wrapping_add(a.swap_add)
        }
    });
    let Ok(orig) = res else {
        return Err(Fatal::Access.into());
    };
    rq.msn = psn_add(rq.msn, 1);
    rq.ack_owed = 0;
    rq.epsn = psn_add(r.psn, 1);
    rq.atomic_done = Some((r.psn, orig));
    r.rdma
        .counters
        .messages_received
        .fetch_add(1, Ordering::Relaxed);
    atomic_ack(r, rq.msn, orig, reply);
    Ok(Accepted::Answered)
}

/// Sends the atomic acknowledgement: an AETH and the original value.
fn atomic_ack(r: &Req<'_, '_, '_>, msn: u32, orig: u64, reply: &mut dyn FnMut(&Packet<'_>)) {
    let rh = Headers {
        bth: Bth {
            opcode: svc::RC | op::ATOMIC_ACKNOWLEDGE,
            pkey: packet::DEFAULT_PKEY,
            dest_qp: r.remote,
            psn: r.psn,
            ..Bth::default()
        },
        aeth: Some(Aeth {
            syndrome: aeth::ACK | aeth::CREDITS_INVALID,
            msn,
        }),
        atomic_ack: Some(orig),
        ..Headers::default()
    };
    let to = back(r.pkt.addr);
    reply(&Packet {
        addr: &to,
        hdr: &rh,
        payload: Payload::None,
    });
}

/// An RC RDMA WRITE's packets back to back ([`crate::fabric::Train`]):
/// taken when each would be, one by one, in sequence and accepted (the
/// expected PSN, no message in progress, remote write allowed, the rkey
/// and every target byte good, the same MTU), the payload then copied in
/// one piece; false, with nothing changed, otherwise (the packets then
/// come one by one, and meet whatever error they meet).
pub(crate) fn write_train(
    rdma: &Rdma,
    dmem: &Hinted<'_>,
    hint: Option<&Arc<Qp>>,
    t: &crate::fabric::Train<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) -> bool {
    let found;
    let qp = match hint {
        Some(q) if q.qpn == t.dest_qp && q.state() != qp::state::DESTROYED => q,
        _ => {
            let Some(q) = rdma.qp(t.dest_qp) else {
                return false;
            };
            found = q;
            &found
        }
    };
    if qp.st != qp::st::RC || !qp.receives() || rdma.odp.responder_waits(qp.qpn) {
        return false;
    }
    let len = t.src.len() as u64;
    let mut rq = lock(&qp.rq);
    if rq.epsn != t.psn || rq.write_on || !rq.rwe || u64::from(rq.mtu.max(256)) != t.mtu {
        return false;
    }
    let mut w = std::mem::take(&mut rq.write);
    w.ext.clear();
    let ok = len <= u64::from(u32::MAX)
        && bound_ok(rdma, &mut rq.rkeys, t.rkey, qp.qpn)
        && rdma
            .resolve_cached(
                t.rkey,
                &mut rq.rkeys,
                qp.pd,
                access::RW,
                t.va,
                len,
                &mut w.ext,
            )
            .is_ok()
        && mem::walk(&w.ext, 0, len, |iova, n| dmem.slice(iova, n).map(|_| ())).is_ok()
        && mem::write_slice(dmem, &w.ext, 0, &t.src).is_ok();
    if !ok {
        rq.write = w;
        return false;
    }
    w.off = len;
    w.cap = len;
    rq.write = w;
    let last = psn_add(t.psn, t.npkts - 1);
    rq.epsn = psn_add(last, 1);
    // The expected PSN arrived, as in_sequence notes it: a gap after the
    // train draws a PSN sequence NAK again.
    rq.seq_nak = false;
    rq.msn = psn_add(rq.msn, 1);
    rdma.counters
        .messages_received
        .fetch_add(1, Ordering::Relaxed);
    rq.ack_owed += 1;
    if rq.ack_owed >= ACK_COALESCE {
        rq.ack_owed = 0;
        let (remote, msn) = (rq.remote_qpn, rq.msn);
        drop(rq);
        respond(
            reply,
            &t.addr,
            remote,
            last,
            aeth::ACK | aeth::CREDITS_INVALID,
            msn,
        );
    }
    true
}

/// A run of single-packet RC RDMA WRITEs ([`crate::fabric::OneWrite`])
/// to QP `dest_qp`, their requests addressed as `addr`: each taken, in
/// order, as [`rc`] takes its WRITE_ONLY packet when all goes well (the
/// expected PSN, no WRITE in progress, remote write allowed, the rkey
/// granting the range, the payload landed), its ACK owed; the run stops
/// at the first that is anything else, with nothing of it changed but
/// what taking its packet alone does again (the target, bytes that
/// landed), and after the one whose ACK goes out (every
/// [`ACK_COALESCE`]). How many were taken.
pub(crate) fn write_run(
    rdma: &Rdma,
    dmem: &Hinted<'_>,
    hint: Option<&Arc<Qp>>,
    addr: &RoceAddr,
    dest_qp: u32,
    writes: &[crate::fabric::OneWrite<'_>],
    reply: &mut dyn FnMut(&Packet<'_>),
) -> usize {
    let found;
    let qp = match hint {
        Some(q) if q.qpn == dest_qp && q.state() != qp::state::DESTROYED => q,
        _ => {
            let Some(q) = rdma.qp(dest_qp) else {
                return 0;
            };
            found = q;
            &found
        }
    };
    // QP 1 is the GSI QP's alias, never an RC QP's number.
    if dest_qp == 1 || qp.st != qp::st::RC || !qp.receives() || rdma.odp.responder_waits(qp.qpn) {
        return 0;
    }
    let mut guard = lock(&qp.rq);
    let rq = &mut *guard;
    let mut taken = 0;
    let mut acked = None;
    for t in writes {
        if rq.epsn != t.psn || rq.write_on || !rq.rwe {
            break;
        }
        // The RETH's target, as [`write_target`] checks it.
        let len = t.payload.len();
        let pd = qp.access_pd(rq);
        let w = &mut rq.write;
        w.ext.clear();
        w.off = 0;
        w.cap = len;
        let ok = len == 0
            || (bound_ok(rdma, &mut rq.rkeys, t.rkey, qp.qpn)
                && rdma
                    .resolve_cached(
                        t.rkey,
                        &mut rq.rkeys,
                        pd,
                        access::RW,
                        t.va,
                        len,
                        &mut rq.write.ext,
                    )
                    .is_ok());
        if !ok || t.payload.copy_to_hinted(dmem, &rq.write.ext, 0).is_err() {
            break;
        }
        // Landed: [`write_complete`], then [`in_sequence`]'s and
        // [`ack`]'s part.
        rq.write.off = len;
        rq.msn = psn_add(rq.msn, 1);
        rq.seq_nak = false;
        rq.epsn = psn_add(t.psn, 1);
        taken += 1;
        rq.ack_owed += 1;
        if rq.ack_owed >= ACK_COALESCE {
            rq.ack_owed = 0;
            acked = Some(t.psn);
            break;
        }
    }
    if taken != 0 {
        rdma.counters
            .messages_received
            .fetch_add(taken as u64, Ordering::Relaxed);
    }
    if let Some(psn) = acked {
        let ack = aeth::ACK | aeth::CREDITS_INVALID;
        respond(reply, addr, rq.remote_qpn, psn, ack, rq.msn);
    }
    taken
}

/// SEND with invalidate: the named key of this PD becomes free.
/// Whether `rkey` may be used by QP `qpn` (a type-2 window only through
/// the QP it is bound on); an unknown key is left to the resolution.
fn bound_ok(rdma: &Rdma, cache: &mut super::KeyCache, rkey: u32, qpn: u32) -> bool {
    rdma.mkey_cached(rkey, cache)
        .is_none_or(|k| k.usable_by(qpn))
}

/// SEND with Invalidate: frees the IETH's key if it may be invalidated
/// remotely by this QP (`en_rinval`, the request's PD `pd`, a type-2
/// window bound to this QP); whether it was.
fn invalidate(rdma: &Rdma, qp: &Qp, pd: u32, key: u32) -> bool {
    let mut t = super::wlock(&rdma.mkeys);
    let Some(k) = t.get_mut(&(key >> 8)) else {
        return false;
    };
    if k.key != key as u8 || k.pd != pd || !k.en_rinval || !k.usable_by(qp.qpn) {
        return false;
    }
    let mut n = (**k).clone();
    n.free = true;
    n.qpn = super::mem::QPN_ANY;
    *k = Arc::new(n);
    true
}

fn uc(rdma: &Rdma, qp: &Arc<Qp>, h: &Headers, pkt: &Packet<'_>, mem: &IovaMemory) {
    let mut rq = lock(&qp.rq);
    let o = h.bth.opcode & 0x1f;
    let first = matches!(
        o,
        op::SEND_FIRST
            | op::SEND_ONLY
            | op::SEND_ONLY_IMM
            | op::WRITE_FIRST
            | op::WRITE_ONLY
            | op::WRITE_ONLY_IMM
    );
    let last = !matches!(
        o,
        op::SEND_FIRST | op::SEND_MIDDLE | op::WRITE_FIRST | op::WRITE_MIDDLE
    );
    if h.bth.psn != rq.epsn {
        // A gap: the message in progress is lost.
        rq.uc_drop = !first;
        if rq.send_on {
            // The receive WQE stays consumed, as on hardware; nothing lands.
            rq.send_on = false;
        }
        rq.write_on = false;
    }
    rq.epsn = psn_add(h.bth.psn, 1);
    if first {
        rq.uc_drop = false;
    }
    if rq.uc_drop {
        rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let imm = matches!(
        o,
        op::SEND_LAST_IMM | op::SEND_ONLY_IMM | op::WRITE_LAST_IMM | op::WRITE_ONLY_IMM
    );
    let k = UcPkt { first, last, imm };
    if o <= op::SEND_ONLY_IMM {
        uc_send(rdma, qp, &mut rq, h, pkt, mem, k);
    } else {
        uc_write(rdma, qp, &mut rq, h, pkt, mem, k);
    }
}

/// Where a UC packet falls in its message, and whether it carries an
/// immediate.
#[derive(Clone, Copy)]
struct UcPkt {
    first: bool,
    last: bool,
    imm: bool,
}

/// A UC SEND packet: the first takes a receive WQE (none: the message is
/// dropped), each scatters its payload, the last completes.
fn uc_send(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    rq: &mut Rq,
    h: &Headers,
    pkt: &Packet<'_>,
    mem: &IovaMemory,
    k: UcPkt,
) {
    let UcPkt { first, last, imm } = k;
    let len = pkt.payload.len();
    let remote = rq.remote_qpn;
    if first {
        match take(rdma, qp, rq, mem) {
            Ok(()) => rq.send_on = true,
            Err(None) => {
                rq.uc_drop = !last;
                rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(Some(f)) => {
                fatal(rdma, qp, rq, mem, f);
                return;
            }
        }
    } else if !rq.send_on {
        return;
    }
    if rq.send.off + len > rq.send.cap {
        let w = rq.send.wqe;
        fatal(rdma, qp, rq, mem, Fatal::Length(w));
        return;
    }
    let inline = if first && last {
        scatter_to_cqe(qp, &pkt.payload)
    } else {
        None
    };
    if inline.is_none() && pkt.payload.copy_to(mem, &rq.send.ext, rq.send.off).is_err() {
        let w = rq.send.wqe;
        fatal(rdma, qp, rq, mem, Fatal::Protection(w, vendor::DMA_FAULT));
        return;
    }
    rq.send.off += len;
    if last {
        let opcode = if imm {
            CqeOpcode::RespSendImm
        } else {
            CqeOpcode::RespSend
        };
        let mut c = resp_completion(qp, rq, opcode, h, remote);
        c.inline = inline;
        rq.send_on = false;
        rdma.counters
            .messages_received
            .fetch_add(1, Ordering::Relaxed);
        qp.rcq.push(rdma, mem, &c);
    }
}

/// A UC RDMA WRITE packet: the first checks its RETH against an MR
/// (a bad one drops the message), each lands its payload, the last with
/// an immediate takes a receive WQE and completes.
fn uc_write(
    rdma: &Rdma,
    qp: &Arc<Qp>,
    rq: &mut Rq,
    h: &Headers,
    pkt: &Packet<'_>,
    mem: &IovaMemory,
    k: UcPkt,
) {
    let UcPkt { first, last, imm } = k;
    let len = pkt.payload.len();
    let remote = rq.remote_qpn;
    if first {
        let ok = h.reth.is_some_and(|r| {
            let mut w = std::mem::take(&mut rq.write);
            w.ext.clear();
            w.off = 0;
            w.cap = u64::from(r.dma_len);
            let ok = rq.rwe
                && (r.dma_len == 0
                    || rdma.mkey_cached(r.rkey, &mut rq.rkeys).is_some_and(|k| {
                        k.usable_by(qp.qpn)
                            && k.resolve(qp.pd, access::RW, r.va, u64::from(r.dma_len), &mut w.ext)
                                .is_ok()
                    }));
            rq.write = w;
            ok
        });
        if !ok {
            rq.uc_drop = !last;
            rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        rq.write_on = true;
    } else if !rq.write_on {
        return;
    }
    if rq.write.off + len > rq.write.cap {
        rq.write_on = false;
        rq.uc_drop = !last;
        return;
    }
    if imm && !rq.send_on {
        match take(rdma, qp, rq, mem) {
            Ok(()) => {}
            Err(_) => {
                rq.write_on = false;
                rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    if pkt
        .payload
        .copy_to(mem, &rq.write.ext, rq.write.off)
        .is_err()
    {
        rq.write_on = false;
        return;
    }
    rq.write.off += len;
    if last {
        rq.write_on = false;
        rdma.counters
            .messages_received
            .fetch_add(1, Ordering::Relaxed);
        if imm {
            let mut c = resp_completion(qp, rq, CqeOpcode::RespWrImm, h, remote);
            c.byte_cnt = rq.write.cap as u32;
            qp.rcq.push(rdma, mem, &c);
        }
    }
}

fn ud(rdma: &Rdma, qp: &Arc<Qp>, h: &Headers, pkt: &Packet<'_>, mem: &IovaMemory) {
    let mut rq = lock(&qp.rq);
    let Some(d) = h.deth else {
        return;
    };
    if d.qkey != rq.qkey {
        rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(qpn = qp.qpn, qkey = d.qkey, "UD Q_Key mismatch");
        return;
    }
    match take(rdma, qp, &mut rq, mem) {
        Ok(()) => {}
        Err(None) => {
            rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(Some(Fatal::PageFault(w))) => {
            // ODP: a datagram has no RNR NAK; it is dropped while the
            // fault is raised and resolved, and the WQE stays posted for
            // the next one. A fault resumed with error fails the WQE.
            let f = recv_fault(qp, &rq, w, pkt.payload.len());
            if rdma.wqe_fault(f) == super::odp::Hold::Failed {
                fatal(rdma, qp, &mut rq, mem, Fatal::PageFault(w));
            } else {
                rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        Err(Some(f)) => {
            fatal(rdma, qp, &mut rq, mem, f);
            return;
        }
    }
    let len = pkt.payload.len();
    let w = rq.send.wqe;
    if 40 + len > rq.send.cap {
        fatal(rdma, qp, &mut rq, mem, Fatal::Length(w));
        return;
    }
    let g = packet::grh(
        pkt.addr,
        len as usize + h.layout().map_or(0, |l| l.len()) + 4,
    );
    if mem::write_bytes(mem, &rq.send.ext, 0, &g).is_err()
        || pkt.payload.copy_to(mem, &rq.send.ext, 40).is_err()
    {
        fatal(
            rdma,
            qp,
            &mut rq,
            mem,
            Fatal::Protection(w, vendor::DMA_FAULT),
        );
        return;
    }
    rq.send.off = 40 + len;
    let opcode = if h.imm.is_some() {
        CqeOpcode::RespSendImm
    } else {
        CqeOpcode::RespSend
    };
    let c = resp_completion(qp, &rq, opcode, h, d.src_qp)
        .with_grh(packet::gid_is_ipv4(&pkt.addr.src_gid));
    rdma.counters
        .messages_received
        .fetch_add(1, Ordering::Relaxed);
    qp.rcq.push(rdma, mem, &c);
}
