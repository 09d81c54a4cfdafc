//! End to end, CQ resize (`ibv_resize_cq`, MODIFY_CQ op_mod RESIZE): the
//! completions not yet polled when the CQ is resized come out of the new
//! ring in order, and the device's later ones after them, past what the
//! old size could have held; a size below what is outstanding is refused
//! and changes nothing; a size that rounds to the current one is a no-op;
//! 64- and 128-byte CQEs alike.

mod verbs_common;

use verbs::cq::{WcOpcode, WcStatus};
use verbs::qp::{Qp, QpType};
use verbs_common::*;

/// Posts `n` signaled 8-byte RDMA WRITEs with wr_ids `base..base + n` and
/// waits until their completions are written (not polled).
fn writes(p: &Pair, qp: &mut Qp, base: u64, n: u64) {
    let before = cqes_written(p);
    post_writes(p, qp, base, n);
    tests::wait::until("the CQEs written", || cqes_written(p) >= before + n);
}

/// Polls `n` completions and checks they are WRITEs `base..base + n`.
fn expect_in_order(p: &mut Pair, base: u64, n: u64) {
    let wc = poll_n(&mut p.a.cq, n as usize);
    let ids: Vec<u64> = wc.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (base..base + n).collect::<Vec<_>>(), "in order");
    assert!(wc
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::RdmaWrite));
}

/// A pair whose side a polls a CQ of 8 entries (`cqe` 7) of `cqe_size`.
fn small_cq_pair(cqe_size: usize) -> Pair {
    let mut p = pair(1 << 16);
    p.a.cq = p.a.ctx.create_cq_sized(7, None, None, cqe_size).unwrap();
    assert_eq!(p.a.cq.cqe(), 7);
    p
}

fn grow_keeps_the_unpolled_completions(cqe_size: usize) {
    let mut p = small_cq_pair(cqe_size);
    let (mut q, _r) = qp_pair(&p, QpType::Rc, cap(64));
    // Around the ring once first, so that the owner bits are the second
    // lap's when the resize comes.
    writes(&p, &mut q, 0, 6);
    expect_in_order(&mut p, 0, 6);
    writes(&p, &mut q, 6, 5);
    p.a.cq.resize(31).unwrap();
    assert_eq!(p.a.cq.cqe(), 31);
    // 5 left unpolled, 20 more: past the 8 the old ring held.
    writes(&p, &mut q, 11, 20);
    expect_in_order(&mut p, 6, 25);
    assert!(nothing_more(&p.fabric, &mut p.a.cq));
    // Down again, empty: still works.
    p.a.cq.resize(3).unwrap();
    assert_eq!(p.a.cq.cqe(), 3);
    writes(&p, &mut q, 31, 3);
    expect_in_order(&mut p, 31, 3);
}

#[test]
fn grow_keeps_the_unpolled_completions_64_byte_cqes() {
    grow_keeps_the_unpolled_completions(64);
}

#[test]
fn grow_keeps_the_unpolled_completions_128_byte_cqes() {
    grow_keeps_the_unpolled_completions(128);
}

#[test]
fn a_size_below_the_outstanding_is_refused_and_the_same_size_changes_nothing() {
    let mut p = small_cq_pair(64);
    let (mut q, _r) = qp_pair(&p, QpType::Rc, cap(16));
    writes(&p, &mut q, 0, 5);
    // 4 entries cannot hold 5 completions.
    let e = p.a.cq.resize(3).unwrap_err();
    assert!(matches!(e, verbs::Error::Invalid(_)), "{e}");
    assert_eq!(p.a.cq.cqe(), 7);
    // Rounds to the current 8: nothing happens.
    p.a.cq.resize(5).unwrap();
    assert_eq!(p.a.cq.cqe(), 7);
    assert!(matches!(p.a.cq.resize(0), Err(verbs::Error::Invalid(_))));
    expect_in_order(&mut p, 0, 5);
    writes(&p, &mut q, 5, 7);
    expect_in_order(&mut p, 5, 7);
}
