//! End to end, the negative cases: each with the exact verbs status, the
//! vendor syndrome kept, and nothing lost or leaked.

mod verbs_common;

use std::time::Duration;

use vfio::clock::ManualClock;

use verbs::cq::{Wc, WcStatus};
use verbs::device::AsyncEventKind;
use verbs::mr::{access, Sge};
use verbs::qp::{
    attr_mask as m, send_flags as sf, Payload, PostError, QpAttr, QpState, QpType, RecvWr, SendOp,
    SendWr,
};
use verbs_common::*;

fn write_wr(wr_id: u64, sge: &[Sge], raddr: u64, rkey: u32) -> SendWr<'_> {
    SendWr {
        wr_id,
        op: SendOp::RdmaWrite { raddr, rkey },
        payload: Payload::Sges(sge),
        flags: sf::SIGNALED,
        ud: None,
    }
}

/// One error completion, then the QP is in error: a second WR flushes.
fn error_then_flush(cq: &mut verbs::cq::Cq, status: WcStatus) -> Vec<Wc> {
    let w = poll_n(cq, 2);
    assert_eq!(w[0].wr_id, 1, "{w:?}");
    assert_eq!(w[0].status, status, "{w:?}");
    assert_ne!(w[0].vendor_err, 0, "vendor syndrome kept: {w:?}");
    assert_eq!(w[1].wr_id, 2);
    assert_eq!(w[1].status, WcStatus::WrFlushErr, "{w:?}");
    w
}

#[test]
fn wrong_lkey_is_a_local_protection_error() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    let good = p.a.mr.sge(0, 64).unwrap();
    // SAFETY: the address is inside the MR; only the key is wrong, which
    // the device must refuse without touching memory.
    let bad = unsafe { Sge::new_unchecked(good.addr(), 64, p.a.mr.lkey() ^ 0x100) };
    let before = read(&p.b.buf, 0, 64);
    qa.post_send(&[
        write_wr(1, &[bad], p.b.mr.addr(), p.b.mr.rkey()),
        write_wr(2, &[good], p.b.mr.addr(), p.b.mr.rkey()),
    ])
    .unwrap();
    error_then_flush(&mut p.a.cq, WcStatus::LocProtErr);
    assert_eq!(read(&p.b.buf, 0, 64), before, "nothing written");
}

#[test]
fn wrong_rkey_is_a_remote_access_error() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    fill(&p.a.buf, 0, 64, 5);
    let s = p.a.mr.sge(0, 64).unwrap();
    qa.post_send(&[
        write_wr(1, &[s], p.b.mr.addr(), p.b.mr.rkey() ^ 0x100),
        write_wr(2, &[s], p.b.mr.addr(), p.b.mr.rkey()),
    ])
    .unwrap();
    error_then_flush(&mut p.a.cq, WcStatus::RemAccessErr);
    assert_eq!(read(&p.b.buf, 0, 64), vec![0; 64]);
}

#[test]
fn remote_write_to_a_read_only_mr_is_refused() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    let ro =
        p.b.pd
            .reg_mr_buffer(
                &p.b.buf,
                4096,
                4096,
                access::LOCAL_WRITE | access::REMOTE_READ,
            )
            .unwrap();
    fill(&p.a.buf, 0, 64, 5);
    let s = p.a.mr.sge(0, 64).unwrap();
    qa.post_send(&[
        write_wr(1, &[s], ro.addr(), ro.rkey()),
        write_wr(2, &[s], ro.addr(), ro.rkey()),
    ])
    .unwrap();
    error_then_flush(&mut p.a.cq, WcStatus::RemAccessErr);
    assert_eq!(read(&p.b.buf, 4096, 64), vec![0; 64]);
}

#[test]
fn atomic_without_remote_atomic_is_refused() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    let rw =
        p.b.pd
            .reg_mr_buffer(
                &p.b.buf,
                4096,
                4096,
                access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE,
            )
            .unwrap();
    p.b.buf.write_u64_be(4096, 77).unwrap();
    let s = p.a.mr.sge(0, 8).unwrap();
    let fa = |wr_id| SendWr {
        wr_id,
        op: SendOp::AtomicFetchAdd {
            raddr: rw.addr(),
            rkey: rw.rkey(),
            add: 1,
        },
        payload: Payload::Sges(std::slice::from_ref(&s)),
        flags: sf::SIGNALED,
        ud: None,
    };
    qa.post_send(&[fa(1), fa(2)]).unwrap();
    error_then_flush(&mut p.a.cq, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.read_u64_be(4096).unwrap(), 77, "remote unchanged");
}

#[test]
fn sge_out_of_bounds_is_refused_before_the_device() {
    let p = pair(1 << 16);
    assert!(p.a.mr.sge(0, (1 << 16) + 1).is_err());
    assert!(p.a.mr.sge(1 << 16, 1).is_err());
    assert!(p.a.mr.sge(u64::MAX, 2).is_err());
    let small =
        p.a.pd
            .reg_mr_buffer(&p.a.buf, 100, 50, access::LOCAL_WRITE)
            .unwrap();
    assert!(small.sge(0, 50).is_ok());
    assert!(small.sge(1, 50).is_err());
    assert!(small.sge(50, 1).is_err());
}

#[test]
fn receive_buffer_too_small_fails_both_sides() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(8));
    let r = p.b.mr.sge(0, 16).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 50,
        sg_list: &[r],
    }])
    .unwrap();
    let s = p.a.mr.sge(0, 100).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let rw = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (rw[0].wr_id, rw[0].status),
        (50, WcStatus::LocLenErr),
        "{rw:?}"
    );
    let sw = poll_n(&mut p.a.cq, 1);
    assert_eq!(
        (sw[0].wr_id, sw[0].status),
        (1, WcStatus::RemInvReqErr),
        "{sw:?}"
    );
}

#[test]
fn no_receive_posted_is_rnr_retry_exceeded() {
    let clock = ManualClock::new();
    let mut p = pair_on(1 << 16, &clock);
    let retry = Retry {
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 2,
    };
    let (mut qa, _qb) = qp_pair_with(&p, QpType::Rc, cap(8), retry);
    let s = p.a.mr.sge(0, 32).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    // Each RNR NAK holds the send queue for the RNR timer; after two
    // retries the third NAK ends it.
    for _ in 0..2 {
        assert!(next_retry(&clock) > Duration::ZERO);
    }
    let w = poll_n(&mut p.a.cq, 1);
    assert_eq!(w[0].status, WcStatus::RnrRetryExcErr, "{w:?}");
    let st = stats(&p.fabric, 0);
    assert_eq!(st.rnr_naks, 3, "initial try + 2 retries NAKed: {st:?}");
    assert_eq!(st.retries, 2, "{st:?}");
}

#[test]
fn peer_gone_is_transport_retry_exceeded() {
    let clock = ManualClock::new();
    let mut p = pair_on(1 << 16, &clock);
    let retry = Retry {
        timeout: 8,
        retry_cnt: 2,
        rnr_retry: 7,
    };
    let (mut qa, qb) = qp_pair_with(&p, QpType::Rc, cap(8), retry);
    qb.destroy().unwrap();
    let s = p.a.mr.sge(0, 32).unwrap();
    qa.post_send(&[write_wr(1, &[s], p.b.mr.addr(), p.b.mr.rkey())])
        .unwrap();
    // Nobody answers: two resends, each after the local ACK timeout
    // (4.096 us << timeout 8), then the error.
    for _ in 0..2 {
        assert_eq!(next_retry(&clock), Duration::from_nanos(4096 << 8));
    }
    let w = poll_n(&mut p.a.cq, 1);
    assert_eq!(w[0].status, WcStatus::RetryExcErr, "{w:?}");
    assert_eq!(stats(&p.fabric, 0).retries, 2);
}

#[test]
fn posting_in_the_wrong_state_is_refused() {
    let p = pair(1 << 16);
    let mut qa = create_qp(&p.a, QpType::Rc, cap(8));
    let s = [p.a.mr.sge(0, 32).unwrap()];
    let wr = write_wr(1, &s, p.b.mr.addr(), p.b.mr.rkey());
    assert_eq!(
        qa.post_send(&[wr]),
        Err((0, PostError::BadState(QpState::Reset)))
    );
    assert_eq!(
        qa.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &s
        }]),
        Err((0, PostError::BadState(QpState::Reset)))
    );
    let invalid = |r: verbs::Result<()>| match r {
        Err(verbs::Error::Invalid(why)) => why,
        other => panic!("expected an invalid-argument error, got {other:?}"),
    };
    // RESET -> RTR does not exist.
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        ..Default::default()
    };
    assert_eq!(
        invalid(qa.modify(&rtr, m::STATE)),
        "no such QP state transition"
    );
    assert_eq!(qa.state(), QpState::Reset);
    // INIT without a required attribute, or with one it does not take.
    let init = QpAttr {
        qp_state: Some(QpState::Init),
        port_num: 1,
        ..Default::default()
    };
    assert_eq!(
        invalid(qa.modify(&init, m::STATE | m::PORT)),
        "attribute mask lacks a required attribute"
    );
    assert_eq!(
        invalid(qa.modify(
            &init,
            m::STATE | m::PORT | m::PKEY_INDEX | m::ACCESS_FLAGS | m::SQ_PSN
        )),
        "attribute mask has an attribute this transition does not take"
    );
    let port2 = QpAttr {
        port_num: 2,
        ..init
    };
    assert_eq!(
        invalid(qa.modify(&port2, m::STATE | m::PORT | m::PKEY_INDEX | m::ACCESS_FLAGS)),
        "port number"
    );
    assert_eq!(
        qa.state(),
        QpState::Reset,
        "refused modifies change nothing"
    );
    qa.modify(&init, m::STATE | m::PORT | m::PKEY_INDEX | m::ACCESS_FLAGS)
        .unwrap();
    assert_eq!(
        qa.post_send(&[wr]),
        Err((0, PostError::BadState(QpState::Init)))
    );
}

#[test]
fn moving_to_err_flushes_every_outstanding_wr() {
    let mut p = pair(1 << 16);
    let (_qa, mut qb) = qp_pair(&p, QpType::Rc, cap(8));
    let r = p.b.mr.sge(0, 64).unwrap();
    let wrs: Vec<RecvWr<'_>> = (0..5)
        .map(|i| RecvWr {
            wr_id: 1000 + i,
            sg_list: std::slice::from_ref(&r),
        })
        .collect();
    qb.post_recv(&wrs).unwrap();
    qb.modify(
        &QpAttr {
            qp_state: Some(QpState::Err),
            ..Default::default()
        },
        m::STATE,
    )
    .unwrap();
    let w = poll_n(&mut p.b.cq, 5);
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.qp_num))
            .collect::<Vec<_>>(),
        (0..5)
            .map(|i| (1000 + i, WcStatus::WrFlushErr, qb.qp_num()))
            .collect::<Vec<_>>()
    );
    assert!(nothing_more(&p.fabric, &mut p.b.cq));
}

#[test]
fn cq_overrun_raises_an_async_event() {
    let fabric = mlx5_emu::Fabric::cabled(2, mlx5_emu::Profile::ConnectX4Lx);
    let a = side(open(function(&fabric, 0)), 1 << 16, ALL);
    let b = side(open(function(&fabric, 1)), 1 << 16, ALL);
    let small = a.ctx.create_cq(1, None, None).unwrap();
    let n = small.cqe() as usize + 4;
    let mut qa =
        a.pd.create_qp(&verbs::qp::QpInitAttr {
            send_cq: &small,
            recv_cq: &small,
            srq: None,
            cap: cap(64),
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap();
    let qb = create_qp(&b, QpType::Rc, cap(64));
    connect(&mut qa, &a.ctx, &b.ctx, qb.qp_num());
    let mut qb = qb;
    connect(&mut qb, &b.ctx, &a.ctx, qa.qp_num());
    let s = a.mr.sge(0, 8).unwrap();
    for i in 0..n {
        qa.post_send(&[write_wr(i as u64, &[s], b.mr.addr(), b.mr.rkey())])
            .unwrap();
    }
    let ev = a.ctx.get_async_event(Duration::from_secs(5));
    assert!(
        matches!(ev, Some(AsyncEventKind::CqErr { cqn, .. }) if cqn == small.cqn()),
        "{ev:?}"
    );
}

#[test]
fn nothing_leaks_after_errors() {
    let fabric;
    {
        let mut p = pair(1 << 16);
        {
            let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
            let s = p.a.mr.sge(0, 64).unwrap();
            qa.post_send(&[
                write_wr(1, &[s], p.b.mr.addr(), 0xdead_0000),
                write_wr(2, &[s], p.b.mr.addr(), p.b.mr.rkey()),
            ])
            .unwrap();
            let w = poll_n(&mut p.a.cq, 2);
            assert_eq!(
                (w[0].status, w[1].status),
                (WcStatus::RemAccessErr, WcStatus::WrFlushErr)
            );
        }
        fabric = p.fabric;
        // Sides drop here (QPs first, then MR, CQ, PD, context).
    }
    for i in 0..2 {
        let st = stats(&fabric, i);
        assert_eq!(
            (st.qps, st.cqs, st.mkeys, st.pds, st.srqs),
            (0, 0, 0, 0, 0),
            "function {i}: {st:?}"
        );
    }
}

#[test]
fn looped_back_write_outside_the_mr_is_a_remote_access_error() {
    // One function looped back to itself: its own QPs talk, and its own
    // mkey table must still bound a remote write.
    let fabric = mlx5_emu::Fabric::loopback(mlx5_emu::Profile::ConnectX4Lx);
    let mut s = side(open(function(&fabric, 0)), 1 << 16, ALL);
    let mut qa = create_qp(&s, QpType::Rc, cap(8));
    let mut qb = create_qp(&s, QpType::Rc, cap(8));
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &s.ctx, &s.ctx, nb);
    connect(&mut qb, &s.ctx, &s.ctx, na);
    fill(&s.buf, 0, 64, 9);
    let src = s.mr.sge(0, 64).unwrap();
    let end = s.mr.addr() + (1 << 16);
    qa.post_send(&[
        // The last 32 bytes of the write lie past the MR's end.
        write_wr(1, &[src], end - 32, s.mr.rkey()),
        write_wr(2, &[src], s.mr.addr(), s.mr.rkey()),
    ])
    .unwrap();
    error_then_flush(&mut s.cq, WcStatus::RemAccessErr);
    assert_eq!(
        read(&s.buf, (1 << 16) - 32, 32),
        vec![0; 32],
        "nothing written"
    );
}

/// An SRQ of no WQEs and no entries, as libmlx5 and mlx5_ib make one
/// (rdma-core's tests create `SRQ(pd, SrqInitAttr())`, all zeros): a
/// queue of one WQE, the list's tail, so no receive fits (QueueFull), and
/// WQEs of one entry; it had been refused as "SRQ capacities".
#[test]
fn an_srq_of_no_wqes_and_no_entries_is_made_and_takes_no_receive() {
    let p = pair(1 << 12);
    let srq = p.a.pd.create_srq(0, 0).unwrap();
    assert_eq!((srq.max_wr(), srq.max_sge()), (0, 1));
    let sge = p.a.mr.sge(0, 64).unwrap();
    let r = srq.post_recv(&[verbs::qp::RecvWr {
        wr_id: 1,
        sg_list: &[sge],
    }]);
    assert_eq!(r, Err((0, PostError::QueueFull)));
    let big = p.a.pd.create_srq(100, 2).unwrap();
    assert!(big.max_wr() >= 100 && big.max_sge() >= 2);
}
