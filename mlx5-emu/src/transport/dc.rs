//! Dynamically Connected transport: the DC target (DCT) side and the DC
//! initiator's (DCI's) connection and stream state.
//!
//! A DCI is a send queue that names its target in every WQE (the datagram
//! segment: address vector, DCT number, DC access key). It connects on
//! demand: the first packet to a target carries the DCETH's connect flag
//! and its PSN is the connection's first (the DCT's expected PSN starts
//! there, so PSNs are per connection); it sends to that target as an RC
//! requester (coalesced ACKs, NAKs, RNR and ACK-timeout retries); before a
//! WQE naming another target, and whenever its queue runs empty (idle), it
//! collects the ACK owed and disconnects (the DCT forgets the connection).
//!
//! A DCT holds one connection per DCI that is connected to it: a hidden RC
//! responder QP (numbered as the DCT, its receives from the DCT's SRQ,
//! completions on the DCT's CQ, the DCT's PD and access rights), so every
//! RC responder check applies: PSNs, duplicates, rkeys and access, an SRQ
//! with no receive posted (RNR NAK after `min_rnr_nak`). The DC access
//! key is checked on every packet: a mismatch is NAKed (remote access),
//! counted (`dc_access_key_violation_count`) and, once armed by
//! ARM_DCT_FOR_KEY_VIOLATION, raises one DCT_KEY_VIOLATION event. DRAIN_DCT
//! closes every connection and refuses new ones; DCT_DRAINED follows.
//!
//! Streams (rdma-core's DCI streams): a WQE carries a stream id in the
//! control segment. The DCI executes in order, so each stream is ordered;
//! an error completes that WQE in error and puts its stream in error: its
//! later WQEs are flushed while the other streams go on, until as many
//! streams are in error as `2^log_num_dci_errored_streams`, and then the
//! DCI goes to ERR. RTS2RTS with the QPC extension's
//! `dci_stream_channel_id` resets a stream (mlx5dv_dci_stream_id_reset).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use mlx5_hw::event::EventType;
use mlx5_hw::qp::{DCTC_STATE_ACTIVE, DCTC_STATE_DRAINED, DCTC_STATE_DRAINING};

use super::mem::Hinted;
use super::packet::{aeth, op, svc, Aeth, Bth, Headers, RoceAddr};
use super::qp::{self, Qp, Rq, Sq, Srq};
use super::{rlock, Cq, PendingEvent, Rdma};
use crate::fabric::{Packet, Payload};
use crate::lock;

/// A DC target (CREATE_DCT).
#[derive(Debug)]
pub(crate) struct Dct {
    pub dctn: u32,
    pub pd: u32,
    pub cq: Arc<Cq>,
    pub srq: Arc<Srq>,
    pub key: u64,
    pub rre: bool,
    pub rwe: bool,
    pub rae: bool,
    /// Path MTU in bytes.
    pub mtu: u32,
    pub min_rnr_nak: u8,
    pub counter_set: u32,
    /// `dctc.cs_res`: received SENDs that fit go to the CQE (scatter to
    /// CQE, as an RC QP's `qpc.cs_res`).
    pub cs_res: u8,
    /// What its receive CQEs carry in `srqn_uidx`: `dctc.user_index` under
    /// cqe_version 1 (libmlx5 finds the DCT, and through it the SRQ, by
    /// it), else `None` (the SRQ number).
    pub cqe_uidx: Option<u32>,
    /// The DCT context as CREATE_DCT gave it (QUERY_DCT returns it with the
    /// state and the violation count).
    pub ctx: Vec<u8>,
    /// `MLX5_DCTC_STATE_*`.
    pub state: AtomicU8,
    /// DC access key violations seen.
    pub violations: AtomicU32,
    /// ARM_DCT_FOR_KEY_VIOLATION: the next violation raises the event.
    pub armed: AtomicBool,
    /// Open connections by the DCI's GID and QP number.
    pub conns: Mutex<HashMap<([u8; 16], u32), Conn>>,
}

/// One DCI connected to a DCT.
#[derive(Debug)]
pub(crate) struct Conn {
    /// The PSN the DCI connected with.
    pub first_psn: u32,
    /// The responder state, as an RC QP's.
    pub qp: Arc<Qp>,
}

impl Dct {
    /// A new connection's responder: an RC QP in RTR on the DCT's objects,
    /// expecting `psn` from DCI `dci`.
    fn connection(&self, dci: u32, psn: u32) -> Arc<Qp> {
        let rq = Rq {
            rre: self.rre,
            rwe: self.rwe,
            rae: self.rae,
            epsn: psn,
            min_rnr_nak: self.min_rnr_nak,
            mtu: self.mtu,
            remote_qpn: dci,
            ..Rq::default()
        };
        Arc::new(Qp {
            qpn: self.dctn,
            st: qp::st::RC,
            pd: self.pd,
            scq: self.cq.clone(),
            rcq: self.cq.clone(),
            srq: Some(self.srq.clone()),
            rq_type: qp::rq_type::SRQ,
            log_rq_size: 0,
            log_rq_stride: 4,
            log_sq_size: 0,
            sq_offset: 0,
            buf: qp::Buf::default(),
            dbr: 0,
            uar: 0,
            cqe_uidx: self.cqe_uidx,
            state: AtomicU8::new(qp::state::RTR),
            counter_set: AtomicU32::new(self.counter_set),
            sq: Mutex::new(Sq::default()),
            rq: Mutex::new(rq),
            dct_conn: true,
            // A target sends no requests; its receives scatter as the
            // DCT context says.
            cs_req: 0,
            block_lb_mc: false,
            cs_res: self.cs_res,
            xrcd: 0,
            no_sq: false,
            log_dci_streams: 0,
            log_dci_errored: 0,
        })
    }

    /// DRAIN_DCT: no new connection from now on; the open ones go on
    /// until their DCIs disconnect, and the last one to close makes the
    /// DCT drained (DCT_DRAINED), at once if none is open.
    pub(crate) fn drain(&self, rdma: &Rdma) {
        let conns = lock(&self.conns);
        self.state.store(DCTC_STATE_DRAINING, Ordering::Release);
        self.drained_if_idle(rdma, &conns);
    }

    /// A draining DCT with no connection left is drained.
    fn drained_if_idle(&self, rdma: &Rdma, conns: &HashMap<([u8; 16], u32), Conn>) {
        if conns.is_empty()
            && self
                .state
                .compare_exchange(
                    DCTC_STATE_DRAINING,
                    DCTC_STATE_DRAINED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            event(rdma, EventType::DctDrained, self.dctn);
        }
    }

    /// DESTROY_DCT (or a reset): every connection ends now.
    pub(crate) fn close_all(&self) {
        self.state.store(DCTC_STATE_DRAINED, Ordering::Release);
        for (_, c) in lock(&self.conns).drain() {
            c.qp.destroyed();
        }
    }

    /// Bytes the model holds for the DCT and each open connection.
    pub(crate) fn footprint(&self) -> (usize, usize) {
        let conn = std::mem::size_of::<Conn>()
            + std::mem::size_of::<Qp>()
            + std::mem::size_of::<([u8; 16], u32)>();
        (
            std::mem::size_of::<Self>() + self.ctx.len(),
            conn * lock(&self.conns).len(),
        )
    }
}

/// Where a DCI's WQE goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Target {
    pub dgid: [u8; 16],
    pub dctn: u32,
    pub key: u64,
}

/// A DCI's connection and stream state (behind `Sq::dc`).
#[derive(Debug, Default)]
pub(crate) struct DciState {
    /// The target connected to, and the PSN the connection began with.
    pub conn: Option<(Target, u32)>,
    /// Streams in error (their WQEs are flushed until reset).
    pub errored: BTreeSet<u16>,
    /// Connections opened.
    pub connects: u64,
    /// The stream of the WQE being executed.
    pub stream: Option<u16>,
}

/// What a DCI's packets carry: the DCETH fields.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DcLink {
    pub key: u64,
    pub dci: u32,
    pub first_psn: u32,
}

impl DcLink {
    /// `h` as a DC request: the DC opcode range and the DCETH (the
    /// connect flag on the connection's first PSN).
    pub(crate) fn decorate(&self, h: &Headers) -> Headers {
        let mut d = *h;
        d.bth.opcode = svc::DC | (h.bth.opcode & 0x1f);
        d.dceth = Some(super::packet::Dceth {
            dc_key: self.key,
            src_qp: self.dci,
            connect: h.bth.psn == self.first_psn,
        });
        d
    }
}

/// The DCT numbered `dctn`.
pub(crate) fn dct(rdma: &Rdma, dctn: u32) -> Option<Arc<Dct>> {
    rlock(&rdma.dcts).get(&dctn).cloned()
}

/// A DC request reached this function: the DCT's checks, the connection
/// (opened by a connect packet), then the RC responder on it.
pub(crate) fn receive(
    rdma: &Rdma,
    dmem: &Hinted<'_>,
    pkt: &Packet<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    let drop = |why: &str| {
        rdma.counters.dropped.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(why, "DC packet dropped");
    };
    let h = pkt.hdr;
    let Some(d) = h.dceth else {
        return drop("no DCETH");
    };
    let Some(dct) = dct(rdma, h.bth.dest_qp) else {
        return drop("no such DCT");
    };
    let state = dct.state.load(Ordering::Acquire);
    if state == DCTC_STATE_DRAINED {
        return drop("DCT drained");
    }
    if d.dc_key != dct.key {
        key_violation(rdma, &dct);
        let nak = Headers {
            bth: Bth {
                opcode: svc::RC | op::ACKNOWLEDGE,
                pkey: super::packet::DEFAULT_PKEY,
                dest_qp: d.src_qp,
                psn: h.bth.psn,
                ..Bth::default()
            },
            aeth: Some(Aeth {
                syndrome: aeth::NAK | aeth::NAK_REMOTE_ACCESS,
                msn: 0,
            }),
            ..Headers::default()
        };
        let to = back(pkt.addr);
        reply(&Packet {
            addr: &to,
            hdr: &nak,
            payload: Payload::None,
        });
        return;
    }
    let key = (pkt.addr.src_gid, d.src_qp);
    let conn = {
        let mut conns = lock(&dct.conns);
        // A connect packet sent again (its ACK was lost) is the same
        // connection; any other opens a new one.
        let same = conns
            .get(&key)
            .is_some_and(|c| c.first_psn == h.bth.psn && c.qp.receives());
        if d.connect && !same {
            if state != DCTC_STATE_ACTIVE {
                return drop("DCT draining: no new connection");
            }
            let qp = dct.connection(d.src_qp, h.bth.psn);
            conns.insert(
                key,
                Conn {
                    first_psn: h.bth.psn,
                    qp: qp.clone(),
                },
            );
            qp
        } else {
            match conns.get(&key) {
                Some(c) => c.qp.clone(),
                None => return drop("no DC connection"),
            }
        }
    };
    if !conn.receives() {
        return drop("DC connection in error");
    }
    let mut rc = *h;
    rc.bth.opcode = svc::RC | (h.bth.opcode & 0x1f);
    rc.dceth = None;
    let p = Packet { hdr: &rc, ..*pkt };
    super::responder::rc(rdma, &conn, &rc, &p, dmem, reply);
}

/// A DC access key violation on `dct`: counted, and the event once armed.
fn key_violation(rdma: &Rdma, dct: &Dct) {
    dct.violations.fetch_add(1, Ordering::Relaxed);
    rdma.counters.naks.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(dctn = dct.dctn, "DC access key violation");
    if dct.armed.swap(false, Ordering::AcqRel) {
        event(rdma, EventType::DctKeyViolation, dct.dctn);
    }
}

/// Queues a DCT event (eqe_dct).
pub(crate) fn event(rdma: &Rdma, ty: EventType, dctn: u32) {
    let mut e = mlx5_hw::ifc::EqeDct::new_zeroed();
    e.dctn.set(dctn & mlx5_hw::event::EQE_RESOURCE_NUMBER_MASK);
    let data = zerocopy::transmute!(e);
    rdma.event(PendingEvent {
        eqn: None,
        ty: ty.to_raw(),
        sub: 0,
        data,
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

/// The DCI `dci` (at `addr`'s source) has nothing more queued for DCT
/// `dctn`: the ACK its connection owes goes out; `close` also ends the
/// connection (the DCI disconnects).
pub(crate) fn drained(
    rdma: &Rdma,
    addr: &RoceAddr,
    dctn: u32,
    dci: u32,
    close: bool,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    let Some(dct) = dct(rdma, dctn) else {
        return;
    };
    let key = (addr.src_gid, dci);
    let conn = {
        let mut conns = lock(&dct.conns);
        if close {
            let c = conns.remove(&key).map(|c| c.qp);
            dct.drained_if_idle(rdma, &conns);
            c
        } else {
            conns.get(&key).map(|c| c.qp.clone())
        }
    };
    if let Some(qp) = conn {
        super::responder::owed_ack(&qp, addr, reply);
        if close {
            qp.destroyed();
        }
    }
}

/// The WQE's stream in a DCI with streams (`None` without).
pub(crate) fn stream_of(qp: &Qp, wqe: &[u8]) -> Option<u16> {
    if qp.st != qp::st::DCI || qp.log_dci_streams == 0 {
        return None;
    }
    let c = mlx5_hw::ifc::WqeCtrlSeg::ref_from_prefix(wqe).ok()?.0;
    Some(c.dci_stream_channel_id.get() & ((1u16 << qp.log_dci_streams) - 1))
}

/// The target a DCI WQE names (its datagram segment), if it has one.
pub(crate) fn target_of(wqe: &[u8]) -> Option<Target> {
    use mlx5_hw::ifc::{wqe_ctrl_seg, WqeDatagramSeg};
    let seg = wqe
        .get(wqe_ctrl_seg::SIZE_BYTES..)
        .and_then(|b| WqeDatagramSeg::ref_from_prefix(b).ok())?
        .0;
    Some(Target {
        dgid: seg.av.rgid,
        dctn: seg.av.dqp_dct.get() & 0xff_ffff,
        key: seg.av.dc_key.get(),
    })
}

/// A stream's WQE failed: its stream goes to error; true when the DCI
/// itself must (the errored-stream limit is reached).
pub(crate) fn stream_failed(qp: &Qp, dc: &mut DciState, stream: u16) -> bool {
    dc.errored.insert(stream);
    dc.errored.len() >= 1usize << qp.log_dci_errored
}

/// Whether the WQE's stream is in error (the WQE is then flushed).
pub(crate) fn stream_in_error(dc: &DciState, stream: Option<u16>) -> bool {
    stream.is_some_and(|s| dc.errored.contains(&s))
}

use zerocopy::{FromBytes as _, FromZeros as _};
