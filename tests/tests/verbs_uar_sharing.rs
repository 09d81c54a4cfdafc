//! UAR pages once firmware has none left (issue 14): the driver sends one
//! ALLOC_UAR that fails, not one per new object; QPs take the BlueFlame
//! registers no QP holds on the pages it has, then share one register per
//! page (8-byte doorbells only); CQs share pages. All of them carry
//! traffic and raise completion events, and once a page goes back
//! ALLOC_UAR is asked again.

mod verbs_common;

use std::time::Duration;

use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use tests::wait::HANG_GUARD;
use verbs::qp::{send_flags as sf, Payload, QpInitAttr, QpType, RecvWr, SendOp, SendWr};
use verbs_common::*;

const ALLOC_UAR: u16 = Opcode::AllocUar.to_raw();
const DEALLOC_UAR: u16 = Opcode::DeallocUar.to_raw();

/// ALLOC_UARs in the command log: (answered OK, refused).
fn alloc_uars(m: &mlx5_emu::Device) -> (usize, usize) {
    let log = m.command_log();
    let of = |ok: bool| {
        log.iter()
            .filter(|e| e.opcode == ALLOC_UAR && (e.status == 0) == ok)
            .count()
    };
    (of(true), of(false))
}

#[test]
fn exhausted_uar_pages_are_shared_without_asking_firmware_per_object() {
    /// QPs created once firmware has no page: 3 own bfregs on each of the
    /// two pages the context has, then shared ones.
    const QPS: usize = 9;
    let mut p = pair(1 << 16);
    let fb = p.fabric.function(1).expect("function 1");
    let m = fb.model().clone();
    // A second page of the context's own, before firmware runs out.
    let spare = p.b.ctx.create_cq(16, None, None).unwrap();
    let uars = m.stats().uars;
    m.faults()
        .command_status(ALLOC_UAR, CmdStatus::NoResources, 0, 1);
    m.clear_command_log();

    let ch = p.b.ctx.create_comp_channel().unwrap();
    let mut cqs: Vec<_> = (0..2)
        .map(|_| p.b.ctx.create_cq(16, Some(&ch), None).unwrap())
        .collect();
    let mut pairs = Vec::new();
    for i in 0..QPS {
        let mut qb =
            p.b.pd
                .create_qp(&QpInitAttr {
                    send_cq: &p.b.cq,
                    recv_cq: &cqs[i % 2],
                    srq: None,
                    cap: cap(8),
                    qp_type: QpType::Rc,
                    sq_sig_all: false,
                })
                .unwrap();
        let mut qa = create_qp(&p.a, QpType::Rc, cap(8));
        connect(&mut qa, &p.a.ctx, &p.b.ctx, qb.qp_num());
        connect(&mut qb, &p.b.ctx, &p.a.ctx, qa.qp_num());
        pairs.push((qa, qb));
    }
    assert_eq!(
        alloc_uars(&m),
        (0, 1),
        "one refused ALLOC_UAR for 2 CQs and {QPS} QPs"
    );
    assert_eq!(m.stats().uars, uars, "no page taken");

    let s = p.a.mr.sge(0, 16).unwrap();
    for (i, (qa, qb)) in pairs.iter_mut().enumerate() {
        // a -> b: a SEND into b's receive, an event on a CQ on a shared page.
        let r = p.b.mr.sge(0, 64).unwrap();
        qb.post_recv(&[RecvWr {
            wr_id: i as u64,
            sg_list: &[r],
        }])
        .unwrap();
        let cq = &mut cqs[i % 2];
        cq.req_notify(false).unwrap();
        qa.post_send(&[SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            payload: Payload::Sges(&[s]),
            flags: 0,
            ud: None,
        }])
        .unwrap();
        assert_eq!(
            ch.get_cq_event(HANG_GUARD).unwrap(),
            Some(cq.cqn()),
            "QP {i}"
        );
        assert_eq!(poll_n(cq, 1)[0].wr_id, i as u64);
        // b -> a: an RDMA WRITE rung through b's own or shared bfreg.
        let at = 4096 + i * 64;
        let data = fill(&p.b.buf, at, 64, i as u8);
        let src = p.b.mr.sge(at as u64, 64).unwrap();
        qb.post_send(&[SendWr {
            wr_id: 100 + i as u64,
            op: SendOp::RdmaWrite {
                raddr: p.a.mr.addr() + at as u64,
                rkey: p.a.mr.rkey(),
            },
            payload: Payload::Sges(&[src]),
            flags: sf::SIGNALED,
            ud: None,
        }])
        .unwrap();
        let wc = poll_n(&mut p.b.cq, 1);
        assert_eq!(wc[0].wr_id, 100 + i as u64, "{wc:?}");
        assert_eq!(read(&p.a.buf, at, 64), data, "QP {i}'s WRITE");
        // An arm seen twice (UAR doorbell and record sweep) may fire twice.
        while let Some(c) = ch.get_cq_event(Duration::ZERO).unwrap() {
            assert_eq!(c, cq.cqn(), "an event of another CQ");
        }
    }

    // Everything that shared goes; then the spare page goes back, and
    // firmware is asked again.
    drop(pairs);
    drop(cqs);
    m.clear_command_log();
    drop(spare);
    assert!(
        m.command_log().iter().any(|e| e.opcode == DEALLOC_UAR),
        "the spare page went back"
    );
    let _q = create_qp(&p.b, QpType::Rc, cap(8));
    assert_eq!(alloc_uars(&m), (1, 0), "ALLOC_UAR asked again");
}
