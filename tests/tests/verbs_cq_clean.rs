//! End to end, CQ cleaning (libmlx5's `mlx5_cq_clean`): the completions a
//! QP's queues left in its CQs go when the QP is destroyed or moved to
//! RESET, before the poller sees them; the other QPs' completions on the
//! same CQ stay, in order, with their wr_ids; a QP brought up again from
//! RESET completes its new work normally; a destroyed QP's receives on an
//! SRQ give their WQEs back to it.

mod verbs_common;

use verbs::cq::{WcOpcode, WcStatus};
use verbs::qp::{
    send_flags as sf, Payload, QpAttr, QpInitAttr, QpState, QpType, RecvWr, SendOp, SendWr,
};
use verbs_common::*;

/// Waits until side a's CQs hold `n` more CQEs than `before`, unpolled.
fn written(p: &Pair, before: u64, n: u64) {
    tests::wait::until("the CQEs written", || cqes_written(p) >= before + n);
}

#[test]
fn destroy_takes_the_qps_completions_and_keeps_the_others() {
    let mut p = pair(1 << 16);
    let (mut q1, _r1) = qp_pair(&p, QpType::Rc, cap(16));
    let (mut q2, _r2) = qp_pair(&p, QpType::Rc, cap(16));
    let before = cqes_written(&p);
    post_writes(&p, &mut q1, 100, 3);
    post_writes(&p, &mut q2, 200, 2);
    post_writes(&p, &mut q1, 103, 2);
    written(&p, before, 7);
    let n1 = q1.qp_num();
    drop(q1);
    // A new QP on the same CQ takes the number back (the model hands out
    // the lowest free one, as firmware may): q1's leftovers must not
    // become its completions.
    let q3 = create_qp(&p.a, QpType::Rc, cap(16));
    assert_eq!(q3.qp_num(), n1, "the QPN is reused");
    let wc = poll_n(&mut p.a.cq, 2);
    let ids: Vec<u64> = wc.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [200, 201], "only q2's completions, in order");
    assert!(wc
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::RdmaWrite));
    let mut more = [verbs::cq::Wc::default(); 8];
    assert_eq!(p.a.cq.poll(&mut more).unwrap(), 0, "nothing of q1 left");
    // The CQ goes on: q2's next completion comes.
    let before = cqes_written(&p);
    post_writes(&p, &mut q2, 202, 1);
    written(&p, before, 1);
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].wr_id, 202);
}

#[test]
fn reset_takes_the_old_completions_and_the_qp_works_again() {
    let mut p = pair(1 << 16);
    let (mut q1, r1) = qp_pair(&p, QpType::Rc, cap(16));
    let (mut q2, _r2) = qp_pair(&p, QpType::Rc, cap(16));
    let before = cqes_written(&p);
    post_writes(&p, &mut q2, 200, 1);
    post_writes(&p, &mut q1, 100, 4);
    post_writes(&p, &mut q2, 201, 1);
    written(&p, before, 6);
    q1.modify(
        &QpAttr {
            qp_state: Some(QpState::Reset),
            ..QpAttr::default()
        },
        verbs::qp::attr_mask::STATE,
    )
    .unwrap();
    // Up again from RESET, new work before the CQ is polled: its
    // completions are not taken for the old ones.
    connect(&mut q1, &p.a.ctx, &p.b.ctx, r1.qp_num());
    let before = cqes_written(&p);
    post_writes(&p, &mut q1, 300, 2);
    written(&p, before, 2);
    let ids: Vec<u64> = poll_n(&mut p.a.cq, 4).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, [200, 201, 300, 301]);
}

#[test]
fn a_destroyed_qps_srq_receives_go_back_to_the_srq() {
    let mut p = pair(1 << 16);
    let srq = p.b.pd.create_srq(4, 1).unwrap();
    let mut qa = create_qp(&p.a, QpType::Rc, cap(16));
    let mut qb =
        p.b.pd
            .create_qp(&QpInitAttr {
                send_cq: &p.b.cq,
                recv_cq: &p.b.cq,
                srq: Some(&srq),
                cap: cap(16),
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &p.a.ctx, &p.b.ctx, nb);
    connect(&mut qb, &p.b.ctx, &p.a.ctx, na);
    // Fill the SRQ (4 WQEs), let 4 SENDs consume them, destroy the
    // receiving QP without polling: the SRQ takes 4 receives again.
    let sge = p.b.mr.sge(0, 64).unwrap();
    for i in 0..4 {
        srq.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[sge],
        }])
        .unwrap();
    }
    let s = p.a.mr.sge(0, 16).unwrap();
    for i in 0..4 {
        qa.post_send(&[SendWr {
            wr_id: i,
            op: SendOp::Send,
            payload: Payload::Sges(&[s]),
            flags: sf::SIGNALED,
            ud: None,
        }])
        .unwrap();
    }
    assert!(poll_n(&mut p.a.cq, 4)
        .iter()
        .all(|w| w.status == WcStatus::Success));
    drop(qb);
    let mut wc = [verbs::cq::Wc::default(); 8];
    assert_eq!(
        p.b.cq.poll(&mut wc).unwrap(),
        0,
        "the receives went with the QP"
    );
    for i in 0..4 {
        srq.post_recv(&[RecvWr {
            wr_id: 10 + i,
            sg_list: &[sge],
        }])
        .unwrap_or_else(|e| panic!("SRQ WQE {i} given back: {e:?}"));
    }
}
