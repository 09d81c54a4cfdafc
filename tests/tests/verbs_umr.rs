//! End to end, UMR: a region's access rights changed in place by a UMR
//! work request on an RC QP, between two cabled device-model functions.

mod verbs_common;

use verbs::cq::{WcOpcode, WcStatus};
use verbs::mr::access;
use verbs::qp::{send_flags as sf, Payload, QpType, SendOp, SendWr};
use verbs::umr::{UmrCheck, UmrWr};
use verbs_common::*;

const SIG: u32 = sf::SIGNALED;

fn write(qa: &mut verbs::qp::Qp, p: &Pair, wr_id: u64) {
    let sge = p.a.mr.sge(0, 64).unwrap();
    qa.post_send(&[SendWr {
        wr_id,
        op: SendOp::RdmaWrite {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&[sge]),
        flags: SIG,
        ud: None,
    }])
    .unwrap();
}

#[test]
fn rereg_access_by_umr_revokes_remote_write_in_place() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(16));
    let data = fill(&p.a.buf, 0, 64, 5);
    write(&mut qa, &p, 1);
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&p.b.buf, 0, 64), data);
    // b drops REMOTE_WRITE from its MR by UMR on its own RC QP, same key.
    let wr = p.b.mr.rereg_access_wr(access::LOCAL_WRITE).unwrap();
    qb.post_umr(7, &wr, SIG).unwrap();
    let wc = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (7, WcStatus::Success, WcOpcode::Umr),
        "{:?}",
        wc[0]
    );
    fill(&p.a.buf, 0, 64, 6);
    write(&mut qa, &p, 2);
    let wc = poll_n(&mut p.a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{:?}", wc[0]);
    assert_eq!(read(&p.b.buf, 0, 64), data, "nothing landed");
}

#[test]
fn refused_umrs_complete_with_local_protection_errors() {
    let mut p = pair(1 << 16);
    let (_qa, mut qb) = qp_pair(&p, QpType::Rc, cap(16));
    // The key is in use: a check for a free key fails.
    let wr = UmrWr {
        check: UmrCheck::Free,
        ..p.b.mr.rereg_access_wr(access::LOCAL_WRITE).unwrap()
    };
    qb.post_umr(9, &wr, SIG).unwrap();
    let wc = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (9, WcStatus::LocProtErr),
        "{:?}",
        wc[0]
    );
    // Access rules are checked before anything is posted.
    assert!(p.b.mr.rereg_access_wr(access::REMOTE_WRITE).is_err());
    // A key that does not exist, on a fresh QP pair.
    let (_qa2, mut qb2) = qp_pair(&p, QpType::Rc, cap(16));
    qb2.post_umr(10, &UmrWr::new(0x00ff_ff00), SIG).unwrap();
    let wc = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (10, WcStatus::LocProtErr),
        "{:?}",
        wc[0]
    );
}
