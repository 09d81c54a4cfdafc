//! Completion vectors: as many completion EQs as the function offers and
//! the caller asks for, one MSI-X vector each; a CQ's events arrive on the
//! vector it was created on, and nowhere else.

mod verbs_common;

use tests::wait::{until_state, HANG_GUARD};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::qp::{Payload, QpInitAttr, QpType, RecvWr, SendOp, SendWr};
use verbs::Error;
use verbs_common::*;

/// The ConnectX-4 Lx model's MSI-X table (lspci: `MSI-X: Count=64`).
const CX4LX_MSIX: usize = 64;

fn open_with(f: std::sync::Arc<dyn vfio::PciFunction>, n: Option<u32>) -> verbs::Result<Context> {
    Context::open(
        f,
        HcaOptions {
            num_comp_vectors: n,
            ..HcaOptions::default()
        },
    )
}

#[test]
fn the_model_offers_a_connectx4_lx_msix_table() {
    let fabric = mlx5_emu::Fabric::cabled(1, mlx5_emu::Profile::ConnectX4Lx);
    let f = function(&fabric, 0);
    assert_eq!(
        f.irq_count(vfio::IrqKind::MsiX).unwrap() as usize,
        CX4LX_MSIX
    );
    // Asking for more than the function offers gets what it offers: every
    // MSI-X vector but the control one, each with its own EQ.
    let ctx = open_with(f, Some(1000)).unwrap();
    assert_eq!(ctx.num_comp_vectors(), CX4LX_MSIX - 1);
    let mut eqns = std::collections::HashSet::new();
    for v in 0..ctx.num_comp_vectors() {
        let s = ctx.comp_vector_stats(v).unwrap();
        assert_eq!(s.msix_vector as usize, v + 1, "vector {v}");
        assert!(eqns.insert(s.eqn), "EQ {} twice", s.eqn);
    }
    assert!(ctx.comp_vector_stats(CX4LX_MSIX - 1).is_none());
    let (c, a) = ctx.hca().eqns();
    assert!(!eqns.contains(&c.unwrap()) && !eqns.contains(&a.unwrap()));
}

#[test]
fn the_default_is_one_vector_per_cpu() {
    let fabric = mlx5_emu::Fabric::cabled(1, mlx5_emu::Profile::ConnectX4Lx);
    let ctx = open_with(function(&fabric, 0), None).unwrap();
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(ctx.num_comp_vectors(), cpus.min(CX4LX_MSIX - 1));
}

#[test]
fn bad_vectors_are_refused_by_name() {
    let fabric = mlx5_emu::Fabric::cabled(1, mlx5_emu::Profile::ConnectX4Lx);
    match open_with(function(&fabric, 0), Some(0)) {
        Err(Error::Invalid(m)) => assert!(m.contains("num_comp_vectors"), "{m}"),
        other => panic!("num_comp_vectors 0 opened: {other:?}"),
    }
    // The refused open left the function ready to open again.
    let ctx = open_with(function(&fabric, 0), Some(3)).unwrap();
    assert_eq!(ctx.num_comp_vectors(), 3);
    for v in [3usize, 4, usize::MAX] {
        match ctx.create_cq(16, None, Some(v)) {
            Err(e @ Error::CompVector { .. }) => {
                assert!(matches!(e, Error::CompVector { vector, count: 3 } if vector == v));
                assert!(e.to_string().contains("completion vector"), "{e}");
                assert_eq!(e.errno(), 22, "ibv_create_cq's EINVAL");
            }
            other => panic!("vector {v}: {other:?}"),
        }
    }
    assert!(ctx.create_cq(16, None, Some(2)).is_ok());
}

/// Every vector's (interrupts, EQEs).
fn snapshot(ctx: &Context) -> Vec<(u64, u64)> {
    (0..ctx.num_comp_vectors())
        .map(|v| {
            let s = ctx.comp_vector_stats(v).unwrap();
            (s.interrupts, s.eqes)
        })
        .collect()
}

#[test]
fn each_cqs_event_arrives_on_its_own_vector() {
    const N: usize = 4;
    let fabric = mlx5_emu::Fabric::cabled(2, mlx5_emu::Profile::ConnectX4Lx);
    let a = side(open(function(&fabric, 0)), 1 << 16, ALL);
    let b = side(
        open_with(function(&fabric, 1), Some(N as u32)).unwrap(),
        1 << 16,
        ALL,
    );
    assert_eq!(b.ctx.num_comp_vectors(), N);
    let ch = b.ctx.create_comp_channel().unwrap();
    let mut cqs: Vec<_> = (0..N)
        .map(|v| b.ctx.create_cq(16, Some(&ch), Some(v)).unwrap())
        .collect();
    let mut pairs = Vec::new();
    for cq in &cqs {
        let mut qb =
            b.pd.create_qp(&QpInitAttr {
                send_cq: &b.cq,
                recv_cq: cq,
                srq: None,
                cap: cap(8),
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap();
        let mut qa = create_qp(&a, QpType::Rc, cap(8));
        connect(&mut qa, &a.ctx, &b.ctx, qb.qp_num());
        connect(&mut qb, &b.ctx, &a.ctx, qa.qp_num());
        let r = b.mr.sge(0, 64).unwrap();
        qb.post_recv(&[RecvWr {
            wr_id: 7,
            sg_list: &[r],
        }])
        .unwrap();
        pairs.push((qa, qb));
    }
    let s = a.mr.sge(0, 16).unwrap();
    // Round trip twice over the vectors: each arm and completion raises
    // exactly one EQE and one interrupt on the CQ's vector alone.
    for round in 0..2 {
        for v in 0..N {
            let before = snapshot(&b.ctx);
            cqs[v].req_notify(false).unwrap();
            pairs[v]
                .0
                .post_send(&[SendWr {
                    wr_id: v as u64,
                    op: SendOp::Send,
                    payload: Payload::Sges(&[s]),
                    flags: 0,
                    ud: None,
                }])
                .unwrap();
            let got = ch.get_cq_event(HANG_GUARD).unwrap();
            assert_eq!(got, Some(cqs[v].cqn()), "round {round} vector {v}");
            until_state(
                "the interrupt counted",
                || snapshot(&b.ctx)[v].0 > before[v].0,
                || format!("{:?} -> {:?}", before, snapshot(&b.ctx)),
            );
            assert_eq!(poll_n(&mut cqs[v], 1)[0].wr_id, 7);
            // Re-post the receive for the next round.
            let r = b.mr.sge(0, 64).unwrap();
            pairs[v]
                .1
                .post_recv(&[RecvWr {
                    wr_id: 7,
                    sg_list: &[r],
                }])
                .unwrap();
            settle(&fabric);
            // One arm, one event, unless the model saw the arm twice (its
            // UAR doorbell and its doorbell-record sweep, under load): then
            // a second event for the same CQ, on the same vector. Every EQE
            // must be an event of this CQ.
            let mut extra = 0;
            while let Some(c) = ch.get_cq_event(std::time::Duration::ZERO).unwrap() {
                assert_eq!(c, cqs[v].cqn(), "an event of another CQ");
                extra += 1;
            }
            if extra > 0 {
                println!("round {round} vector {v}: {extra} extra event(s) for one arm");
            }
            let after = snapshot(&b.ctx);
            for (w, (b4, af)) in before.iter().zip(&after).enumerate() {
                if w == v {
                    assert_eq!(
                        af.1,
                        b4.1 + 1 + extra,
                        "vector {v}: an EQE per event ({before:?} -> {after:?})"
                    );
                    assert!(
                        (b4.0 + 1..=b4.0 + 1 + extra).contains(&af.0),
                        "vector {v}: an interrupt per event at most ({before:?} -> {after:?})"
                    );
                } else {
                    assert_eq!(af, b4, "vector {w} saw vector {v}'s event");
                }
            }
        }
    }
}
