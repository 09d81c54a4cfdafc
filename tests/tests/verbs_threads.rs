//! Threads: two threads posting to one QP and polling one CQ at once
//! (`SharedQp`, `SharedCq`), while a third reposts receives on the peer.
//! Every wr_id completes exactly once; none is lost.

mod verbs_common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tests::wait::HANG_GUARD;
use verbs::cq::{Wc, WcOpcode, WcStatus};
use verbs::qp::{
    send_flags, Payload, PostError, QpCap, QpInitAttr, QpType, RecvWr, SendOp, SendWr,
};
use verbs::shared::{SharedCq, SharedQp};
use verbs_common::*;

/// SENDs in the stress run (`VERBS_THREADS_SENDS` overrides).
const DEFAULT_SENDS: usize = 100_000;
/// Posting threads.
const POSTERS: usize = 2;
/// Receives kept posted on the peer.
const RQ: u32 = 1024;

fn sends() -> usize {
    std::env::var("VERBS_THREADS_SENDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_SENDS)
}

/// Polls `cq` into `got`; returns how many completions came.
fn drain(cq: &SharedCq, got: &mut Vec<Wc>) -> usize {
    let mut wc = [Wc::default(); 32];
    let n = cq
        .poll(&mut wc)
        .unwrap_or_else(|e| panic!("ibv_poll_cq: {e}"));
    got.extend_from_slice(&wc[..n]);
    n
}

/// One posting thread: its share of SENDs (wr_id `t << 32 | i`), polling
/// the shared CQ whenever the queue is full and between posts.
fn poster(
    t: usize,
    n: usize,
    qp: &SharedQp,
    cq: &SharedCq,
    sge: verbs::mr::Sge,
    done: &AtomicUsize,
    total: usize,
) -> Vec<Wc> {
    let mut got = Vec::new();
    let give_up = Instant::now() + HANG_GUARD;
    let mut i = 0;
    while i < n || done.load(Ordering::Acquire) < total {
        assert!(
            Instant::now() < give_up,
            "thread {t}: {i} of {n} posted, {} of {total} done",
            done.load(Ordering::Relaxed)
        );
        if i < n {
            let wr = SendWr {
                wr_id: ((t as u64) << 32) | i as u64,
                op: SendOp::Send,
                payload: Payload::Sges(&[sge]),
                flags: send_flags::SIGNALED,
                ud: None,
            };
            match qp.post_send(&[wr]) {
                Ok(()) => i += 1,
                Err((_, PostError::QueueFull)) => {}
                Err((_, e)) => panic!("thread {t}: ibv_post_send: {e}"),
            }
        }
        let k = drain(cq, &mut got);
        done.fetch_add(k, Ordering::AcqRel);
        if k == 0 && i >= n {
            std::thread::yield_now();
        }
    }
    got
}

#[test]
fn two_threads_post_to_one_qp_and_poll_one_cq() {
    let total = sends();
    let p = pair(1 << 16);
    let scq = p.a.ctx.create_cq(4096, None, None).unwrap().into_shared();
    let mut rcq = p.b.ctx.create_cq(2 * RQ, None, None).unwrap();
    let qcap = QpCap {
        max_send_wr: 256,
        max_recv_wr: RQ,
        ..cap(256)
    };
    let mk = |s: &Side, cq: &verbs::cq::Cq| {
        s.pd.create_qp(&QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: qcap,
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap()
    };
    let mut qa = mk(&p.a, &scq.lock());
    let mut qb = mk(&p.b, &rcq);
    connect(&mut qa, &p.a.ctx, &p.b.ctx, qb.qp_num());
    connect(&mut qb, &p.b.ctx, &p.a.ctx, qa.qp_num());
    let qa = Arc::new(qa.into_shared());
    let scq = Arc::new(scq);
    let rsge = p.b.mr.sge(0, 64).unwrap();
    let recv = |qb: &mut verbs::qp::Qp, k: usize| {
        let wrs: Vec<RecvWr<'_>> = (0..k)
            .map(|_| RecvWr {
                wr_id: 1,
                sg_list: std::slice::from_ref(&rsge),
            })
            .collect();
        qb.post_recv(&wrs)
            .unwrap_or_else(|(i, e)| panic!("ibv_post_recv {i}: {e}"));
    };
    recv(&mut qb, RQ as usize);
    let ssge = p.a.mr.sge(0, 8).unwrap();
    let done = AtomicUsize::new(0);
    let per = total / POSTERS;
    let (received, got) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let mut n = 0usize;
            let mut wc = [Wc::default(); 64];
            let give_up = Instant::now() + HANG_GUARD;
            while n < per * POSTERS {
                assert!(Instant::now() < give_up, "receiver: {n} received");
                let k = rcq.poll(&mut wc).unwrap();
                for w in &wc[..k] {
                    assert_eq!(
                        (w.status, w.opcode, w.byte_len),
                        (WcStatus::Success, WcOpcode::Recv, 8),
                        "{w:?}"
                    );
                }
                if k > 0 {
                    recv(&mut qb, k);
                } else {
                    std::thread::yield_now();
                }
                n += k;
            }
            n
        });
        let posters: Vec<_> = (0..POSTERS)
            .map(|t| {
                let (qa, scq, done) = (&qa, &scq, &done);
                s.spawn(move || poster(t, per, qa, scq, ssge, done, per * POSTERS))
            })
            .collect();
        let got: Vec<Vec<Wc>> = posters.into_iter().map(|h| h.join().unwrap()).collect();
        (receiver.join().unwrap(), got)
    });
    // Every wr_id exactly once, each a successful SEND.
    let mut seen = HashSet::new();
    for (t, g) in got.iter().enumerate() {
        println!("thread {t} polled {} completions", g.len());
        for w in g {
            assert_eq!(
                (w.status, w.opcode),
                (WcStatus::Success, WcOpcode::Send),
                "{w:?}"
            );
            assert!(seen.insert(w.wr_id), "wr_id {:#x} completed twice", w.wr_id);
        }
    }
    let want: HashSet<u64> = (0..POSTERS)
        .flat_map(|t| (0..per).map(move |i| ((t as u64) << 32) | i as u64))
        .collect();
    assert_eq!(seen.len(), want.len(), "completions lost");
    assert_eq!(seen, want);
    assert_eq!(received, per * POSTERS);
    assert!(
        nothing_more(&p.fabric, &mut scq.lock()),
        "a completion after the last"
    );
}
