//! Issue 15's soak: two cabled functions under RC SEND traffic with packets
//! lost on the wire (`Fabric::drop_packets`; every other QP generation with
//! full frame encoding, ICRC included), QPs created and destroyed
//! concurrently, and the receiving function reset mid-run (its QP to ERR,
//! its context closed, an FLR, a fresh bring-up), for a fixed count of
//! messages. Each message carries its sequence number, generation, length
//! and a checksum. At the end: every message has exactly one send
//! completion; one that completed successfully was received exactly once
//! with its data intact; one that failed did so with an error CQE; nothing
//! was received twice, corrupted, or without having been sent.
//!
//! Two QP pairs run at once, sharing each side's CQ. Loss is armed as the
//! sender posts, so one QP's retransmissions are often what the other's
//! posts make the wire lose: a QP may use up its seven retries and fail
//! (RETRY_EXC_ERR, then flushes), which is an outcome the test accepts
//! (the next generation goes on); it prints how many did.

mod verbs_common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_emu::{Fabric, Profile};
use verbs::cq::{Wc, WcStatus};
use verbs::device::{Context, Gid};
use verbs::qp::{
    attr_mask, required_mask, send_flags, AhAttr, Payload, Qp, QpAttr, QpInitAttr, QpState, QpType,
    RecvWr, SendOp, SendWr,
};

use verbs_common::*;

/// Messages in the run.
const MESSAGES: u32 = 10_000;
/// New QP pairs every this many messages (and after their QPs failed).
const PER_GENERATION: u32 = 1000;
/// QP pairs at once, sharing each side's CQ.
const QPS: usize = 2;
/// Sends outstanding at most, per QP.
const WINDOW: u32 = 16;
/// Receives posted on each of the receiver's QPs.
const RECVS: u32 = 64;
/// Bytes per send or receive slot; messages are 16 ..= SLOT bytes, up to
/// three 1024-byte packets.
const SLOT: u64 = 2560;
/// The receiver is reset when this many messages have been posted (inside
/// a generation, not at its end).
const RESET_AT: u32 = MESSAGES / 2 + 137;
/// One to three packets lost every this many messages posted.
const DROP_EVERY: u32 = 5;
/// Only a guard against a hang: the loop ends on outcomes.
const HANG_GUARD: Duration = Duration::from_secs(240);

/// FNV-1a, over the header fields and the payload.
fn checksum(seq: u32, gen: u32, len: u32, payload: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in seq
        .to_le_bytes()
        .iter()
        .chain(&gen.to_le_bytes())
        .chain(&len.to_le_bytes())
        .chain(payload)
    {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn len_of(seq: u32) -> u32 {
    16 + (seq.wrapping_mul(2_654_435_761) >> 7) % (SLOT as u32 - 16 + 1)
}

/// The message `seq` of generation `gen`: header, then bytes derived from both.
fn message(seq: u32, gen: u32) -> Vec<u8> {
    let len = len_of(seq);
    let payload: Vec<u8> = (0..len - 16)
        .map(|i| (seq.wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) ^ (i >> 8)) as u8)
        .collect();
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&seq.to_le_bytes());
    m.extend_from_slice(&gen.to_le_bytes());
    m.extend_from_slice(&len.to_le_bytes());
    m.extend_from_slice(&checksum(seq, gen, len, &payload).to_le_bytes());
    m.extend_from_slice(&payload);
    m
}

/// What a received message says about itself, if it is intact.
fn parse(m: &[u8], byte_len: u32) -> Result<(u32, u32), String> {
    let w = |o: usize| u32::from_le_bytes(m[o..o + 4].try_into().unwrap());
    if byte_len < 16 {
        return Err(format!("{byte_len} bytes: shorter than the header"));
    }
    let (seq, gen, len, sum) = (w(0), w(4), w(8), w(12));
    if len != byte_len || len != len_of(seq) {
        return Err(format!(
            "seq {seq}: {byte_len} bytes arrived, the header says {len}"
        ));
    }
    if checksum(seq, gen, len, &m[16..len as usize]) != sum {
        return Err(format!("seq {seq}: checksum mismatch"));
    }
    Ok((seq, gen))
}

/// The receiving side: a context that may be reset, its QPs of this
/// generation (QP `i` receives into slots `i * RECVS ..`).
struct Receiver {
    side: Side,
    qps: Vec<Qp>,
    /// Receives posted and not yet completed, per QP.
    posted: Vec<u32>,
}

fn post_recv(r: &mut Receiver, i: usize, slot: u32) {
    let sge = r.side.mr.sge(u64::from(slot) * SLOT, SLOT as u32).unwrap();
    let wr = RecvWr {
        wr_id: u64::from(slot),
        sg_list: std::slice::from_ref(&sge),
    };
    r.qps[i].post_recv(&[wr]).unwrap();
    r.posted[i] += 1;
}

#[derive(Default)]
struct Ledger {
    /// seq -> the status of its one send completion.
    sent: HashMap<u32, WcStatus>,
    /// seq -> times received intact.
    received: HashMap<u32, u32>,
    /// Corrupted or impossible receives.
    bad: Vec<String>,
    /// Error CQEs on the send side.
    send_errors: u32,
    /// Receives flushed (QP to ERR).
    flushed: u32,
}

impl Ledger {
    fn send_done(&mut self, w: &Wc) {
        let seq = w.wr_id as u32;
        if let Some(prev) = self.sent.insert(seq, w.status) {
            self.bad.push(format!(
                "seq {seq}: a second send completion ({:?} after {prev:?})",
                w.status
            ));
        }
        if w.status != WcStatus::Success {
            self.send_errors += 1;
        }
    }
}

/// Polls the receiver's CQ once: checks and records what arrived, reposts
/// the slot unless `repost` is off. Returns how many completions it saw.
fn poll_receiver(r: &mut Receiver, l: &mut Ledger, repost: bool) -> usize {
    let mut wc = [Wc::default(); 16];
    let n = r.side.cq.poll(&mut wc).expect("receiver poll");
    for w in &wc[..n] {
        let i = r
            .qps
            .iter()
            .position(|q| q.qp_num() == w.qp_num)
            .unwrap_or_else(|| panic!("a receive completion of no QP of this generation: {w:?}"));
        r.posted[i] -= 1;
        if w.status != WcStatus::Success {
            assert_eq!(
                w.status,
                WcStatus::WrFlushErr,
                "a receive fails only by flush: {w:?}"
            );
            l.flushed += 1;
            continue;
        }
        let slot = w.wr_id as u32;
        let mut m = vec![0u8; SLOT as usize];
        r.side
            .buf
            .read((u64::from(slot) * SLOT) as usize, &mut m)
            .unwrap();
        match parse(&m, w.byte_len) {
            Ok((seq, _gen)) => {
                if seq >= MESSAGES {
                    l.bad.push(format!("seq {seq} was never sent"));
                }
                *l.received.entry(seq).or_default() += 1;
            }
            Err(e) => l.bad.push(e),
        }
        if repost {
            post_recv(r, i, slot);
        }
    }
    n
}

/// Moves the receiver's QPs to ERR and takes every receive's completion
/// (intact data or a flush), then destroys the QPs.
fn retire_receiver_qps(r: &mut Receiver, l: &mut Ledger, guard: Instant) {
    let err = QpAttr {
        qp_state: Some(QpState::Err),
        ..Default::default()
    };
    for qp in &mut r.qps {
        qp.modify(&err, attr_mask::STATE).unwrap();
    }
    while r.posted.iter().any(|&p| p > 0) {
        if poll_receiver(r, l, false) == 0 {
            assert!(Instant::now() < guard, "receives never flushed");
            std::thread::yield_now();
        }
    }
    for qp in r.qps.drain(..) {
        qp.destroy().unwrap();
    }
    r.posted.clear();
}

/// RESET -> INIT -> RTR -> RTS towards `(dgid, rqpn)`.
fn connect_gid(qp: &mut Qp, dgid: Gid, rqpn: u32) {
    let steps = [
        QpAttr {
            qp_state: Some(QpState::Init),
            port_num: 1,
            ..Default::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rtr),
            path_mtu: 3,
            dest_qp_num: rqpn,
            rq_psn: 1,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ah_attr: AhAttr {
                dgid,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        },
        QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: 1,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        },
    ];
    let mut from = QpState::Reset;
    for a in steps {
        let to = a.qp_state.unwrap();
        qp.modify(&a, required_mask(QpType::Rc, from, to)).unwrap();
        from = to;
    }
}

/// Creates, connects and destroys QPs on `ctx` until told to stop.
fn churn(ctx: Context, peer_gid: Gid, stop: Arc<AtomicBool>, n: Arc<AtomicU64>) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, None).unwrap();
    while !stop.load(Ordering::Relaxed) {
        let mut qps: Vec<Qp> = (0..4)
            .map(|_| {
                pd.create_qp(&QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    cap: cap(16),
                    qp_type: QpType::Rc,
                    sq_sig_all: false,
                })
                .unwrap()
            })
            .collect();
        for (i, qp) in qps.iter_mut().enumerate() {
            // Towards a QP number nobody has: nothing is sent on them.
            connect_gid(qp, peer_gid, 0xff_f000 + i as u32);
        }
        for qp in qps {
            qp.destroy().unwrap();
        }
        n.fetch_add(4, Ordering::Relaxed);
    }
}

#[test]
fn soak_rc_with_loss_churn_and_a_reset() {
    let start = Instant::now();
    let guard = start + HANG_GUARD;
    let fabric = Fabric::cabled(2, Profile::ConnectX4Lx);
    let fb = function(&fabric, 1);
    let sbytes = (u64::from(WINDOW) * SLOT) as usize * QPS;
    let rbytes = (u64::from(RECVS) * SLOT) as usize * QPS;
    let mut a = side(open(function(&fabric, 0)), sbytes, ALL);
    let fresh = |f: &Arc<dyn vfio::PciFunction>| Receiver {
        side: side(open(f.clone()), rbytes, ALL),
        qps: Vec::new(),
        posted: Vec::new(),
    };
    let mut r = fresh(&fb);
    let stop = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(AtomicU64::new(0));
    let churner = {
        let (ctx, gid) = (a.ctx.clone(), r.side.ctx.query_gid(1, 0).unwrap());
        let (stop, n) = (stop.clone(), churned.clone());
        std::thread::spawn(move || churn(ctx, gid, stop, n))
    };
    // Short ACK timeouts keep lost packets cheap; seven retries.
    let retry = Retry {
        timeout: 11,
        retry_cnt: 7,
        rnr_retry: 7,
    };

    let mut l = Ledger::default();
    let mut next: u32 = 0;
    let mut gen: u32 = 0;
    let mut reset_done = false;
    // Sends that could not have been received when the receiver was reset.
    let mut in_flight_at_reset = 0;
    let mut wc = [Wc::default(); 16];
    while next < MESSAGES {
        // A generation: fresh QP pairs; every other one with every packet
        // through the full frame encoding and decoding (ICRC included).
        gen += 1;
        fabric.set_wire_check(gen % 2 == 0);
        let mut qa = Vec::new();
        for i in 0..QPS {
            let mut q = create_qp(&a, QpType::Rc, cap(WINDOW));
            let mut qb = create_qp(&r.side, QpType::Rc, cap(RECVS));
            let (na, nb) = (q.qp_num(), qb.qp_num());
            connect_with(&mut q, &a.ctx, &r.side.ctx, nb, retry);
            connect_with(&mut qb, &r.side.ctx, &a.ctx, na, retry);
            qa.push(q);
            r.qps.push(qb);
            r.posted.push(0);
            for s in 0..RECVS {
                post_recv(&mut r, i, i as u32 * RECVS + s);
            }
        }
        let quota = (next + PER_GENERATION).min(MESSAGES);
        // Per QP: the seq of each outstanding send, oldest first; sends
        // posted (for the send slot); whether it failed.
        let mut outstanding = vec![VecDeque::new(); QPS];
        let mut posts = [0u32; QPS];
        let mut failed = [false; QPS];
        let mut reset_here = false;
        loop {
            assert!(
                Instant::now() < guard,
                "the soak hangs: {next} of {MESSAGES} posted; outstanding {:?}, receives posted {:?}, failed {failed:?}, received {:?}",
                outstanding,
                r.posted,
                outstanding.iter().flatten().map(|s| l.received.contains_key(s)).collect::<Vec<_>>()
            );
            // One message at a time to each QP with room, in turn.
            let mut room = true;
            while room && !reset_here && next < quota {
                room = false;
                for i in 0..QPS {
                    if failed[i] || next >= quota || outstanding[i].len() >= WINDOW as usize {
                        continue;
                    }
                    room = true;
                    let seq = next;
                    let m = message(seq, gen);
                    let slot = u64::from(i as u32 * WINDOW + posts[i] % WINDOW) * SLOT;
                    a.buf.write(slot as usize, &m).unwrap();
                    let sge = a.mr.sge(slot, m.len() as u32).unwrap();
                    let wr = SendWr {
                        wr_id: u64::from(seq),
                        op: SendOp::Send,
                        payload: Payload::Sges(std::slice::from_ref(&sge)),
                        flags: send_flags::SIGNALED,
                        ud: None,
                    };
                    qa[i].post_send(&[wr]).unwrap();
                    outstanding[i].push_back(seq);
                    posts[i] += 1;
                    next += 1;
                    if next % DROP_EVERY == 0 {
                        fabric.drop_packets(1 + u64::from(next % 3));
                    }
                }
            }
            // Past RESET_AT the receiver stops reposting receives: once it
            // has none left and every send outstanding is one it never
            // received, those sends are stuck in RNR retries: certainly in
            // flight when it is reset.
            let starving = !reset_done && next >= RESET_AT;
            let waiting: Vec<u32> = outstanding.iter().flatten().copied().collect();
            // (A QP whose sender failed receives nothing more: it does not
            // count.)
            if starving
                && r.posted.iter().zip(&failed).all(|(&p, &f)| p == 0 || f)
                && !waiting.is_empty()
                && waiting.iter().all(|s| !l.received.contains_key(s))
            {
                // The receiver goes away with messages in flight: its QPs
                // to ERR (every receive completes), its context closed,
                // an FLR, a fresh bring-up. The sender's QPs then hear
                // nothing back: their sends end in error CQEs (retries
                // exceeded, then flushes).
                reset_done = true;
                reset_here = true;
                in_flight_at_reset = waiting.len() as u32;
                retire_receiver_qps(&mut r, &mut l, guard);
                let Side {
                    ctx,
                    pd,
                    cq,
                    mr,
                    buf,
                } = r.side;
                drop((mr, cq, pd, buf));
                ctx.close().unwrap();
                fb.reset().unwrap();
                r = fresh(&fb);
            }
            let n = a.cq.poll(&mut wc).expect("sender poll");
            for w in &wc[..n] {
                l.send_done(w);
                let i = qa
                    .iter()
                    .position(|q| q.qp_num() == w.qp_num)
                    .unwrap_or_else(|| panic!("a send completion of no QP of ours: {w:?}"));
                assert_eq!(
                    outstanding[i].pop_front(),
                    Some(w.wr_id as u32),
                    "send completions in order on QP {i}"
                );
                if w.status != WcStatus::Success {
                    failed[i] = true;
                }
            }
            let m = if r.qps.is_empty() {
                0
            } else {
                poll_receiver(&mut r, &mut l, reset_done || next < RESET_AT)
            };
            if outstanding.iter().all(VecDeque::is_empty)
                && (reset_here || failed.iter().all(|&f| f) || next >= quota)
            {
                break;
            }
            if n == 0 && m == 0 {
                std::thread::yield_now();
            }
        }
        retire_receiver_qps(&mut r, &mut l, guard);
        for q in qa {
            q.destroy().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    churner.join().unwrap();

    // Every message: one send completion; received exactly once if it
    // succeeded; never received twice, corrupted, or unsent.
    assert!(l.bad.is_empty(), "{:#?}", l.bad);
    assert_eq!(
        l.sent.len(),
        MESSAGES as usize,
        "a send completion for each"
    );
    for seq in 0..MESSAGES {
        let got = l.received.get(&seq).copied().unwrap_or(0);
        assert!(got <= 1, "seq {seq} delivered {got} times");
        if l.sent[&seq] == WcStatus::Success {
            assert_eq!(got, 1, "seq {seq} completed but was never received");
        }
    }
    let ok = l.sent.values().filter(|s| **s == WcStatus::Success).count();
    let mut errors: std::collections::BTreeMap<String, u32> = Default::default();
    for s in l.sent.values().filter(|s| **s != WcStatus::Success) {
        *errors.entry(format!("{s:?}")).or_default() += 1;
    }
    let stats = fabric.function(0).unwrap().model().stats();
    eprintln!(
        "soak: {MESSAGES} messages in {gen} generations, {ok} completed, {} failed with \
         error CQEs {errors:?} ({in_flight_at_reset} in flight at the reset), {} receives flushed; {} packets dropped, {} retries, {} NAKs; \
         {} QPs churned; {:.1} s",
        l.send_errors,
        l.flushed,
        stats.dropped,
        stats.retries,
        stats.naks,
        churned.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
    // The run exercised what it claims: loss, a reset's failures, churn.
    assert!(stats.dropped > 0 && stats.retries > 0, "{stats:?}");
    assert!(reset_done && in_flight_at_reset > 0);
    assert!(
        l.send_errors >= in_flight_at_reset,
        "the {in_flight_at_reset} sends in flight at the reset failed with error CQEs"
    );
    assert!(churned.load(Ordering::Relaxed) > 0);
    assert!(
        ok > (MESSAGES / 2) as usize,
        "most messages completed: {ok}"
    );
}
