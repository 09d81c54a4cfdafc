//! End to end, UMR: a region's access rights changed in place by a UMR
//! work request on an RC QP, and `Mr::rereg` (`ibv_rereg_mr`) through the
//! driver's UMR QP or by a new key, between two cabled device-model
//! functions.

mod verbs_common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mlx5_emu::{DeviceConfig, Fabric, OutputOverride, Profile};
use mlx5_hw::ifc::CmdHcaCap;
use mlx5_hw::opcode::Opcode;

use verbs::cq::{WcOpcode, WcStatus};
use verbs::mr::{access, Mr};
use verbs::qp::{send_flags as sf, Payload, Qp, QpInitAttr, QpType, SendOp, SendWr};
use verbs::umr::{rereg_flags as rf, Rereg, ReregMemory, UmrCheck, UmrWr};
use verbs::Error;
use verbs_common::*;
use vfio::DmaBuffer;

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

/// a writes 64 bytes (seed `seed`) to `raddr` through `rkey` on `qa`; the
/// completion's status.
fn write_to(p: &mut Pair, qa: &mut Qp, raddr: u64, rkey: u32, seed: u8) -> WcStatus {
    fill(&p.a.buf, 0, 64, seed);
    let sge = p.a.mr.sge(0, 64).unwrap();
    qa.post_send(&[SendWr {
        wr_id: u64::from(seed),
        op: SendOp::RdmaWrite { raddr, rkey },
        payload: Payload::Sges(&[sge]),
        flags: SIG,
        ud: None,
    }])
    .unwrap();
    poll_n(&mut p.a.cq, 1)[0].status
}

fn buffer(len: usize) -> Arc<DmaBuffer> {
    DmaBuffer::new(len).unwrap()
}

#[test]
fn rereg_translation_by_umr_moves_writes_to_the_new_memory() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let (old, new) = (buffer(1 << 16), buffer(1 << 16));
    let mut mr = p.b.pd.reg_mr_buffer(&old, 0x1000, 0x4000, ALL).unwrap();
    let (rkey, old_addr) = (mr.rkey(), mr.addr());
    assert_eq!(
        write_to(&mut p, &mut qa, old_addr, rkey, 1),
        WcStatus::Success
    );
    let before = read(&old, 0x1000, 64);
    assert_eq!(before, read(&p.a.buf, 0, 64));
    // 8 KiB at 0x3000 of another buffer: same key, by UMR.
    let m = ReregMemory::Buffer {
        buf: &new,
        offset: 0x3000,
        len: 0x2000,
    };
    let how = mr.rereg(rf::CHANGE_TRANSLATION, None, Some(m), 0).unwrap();
    assert_eq!(how, Rereg::InPlace);
    assert_eq!((mr.rkey(), mr.len()), (rkey, 0x2000));
    assert_eq!(mr.addr(), new.host_addr() + 0x3000);
    assert_eq!(mr.buffer().map(|(_, o)| o), Some(0x3000));
    let raddr = mr.addr() + 0x1fc0;
    assert_eq!(write_to(&mut p, &mut qa, raddr, rkey, 2), WcStatus::Success);
    assert_eq!(read(&new, 0x4fc0, 64), read(&p.a.buf, 0, 64), "new memory");
    assert_eq!(read(&old, 0x1000, 64), before, "old memory untouched");
    // The old addresses are outside the region now.
    let (mut qa2, _qb2) = qp_pair(&p, QpType::Rc, cap(16));
    assert_eq!(
        write_to(&mut p, &mut qa2, old_addr, rkey, 3),
        WcStatus::RemAccessErr
    );
    assert_eq!(read(&old, 0x1000, 64), before);
    mr.dereg().unwrap();
}

#[test]
fn rereg_pd_by_umr_refuses_the_old_pds_qps() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let buf = buffer(1 << 16);
    let mut mr = p.b.pd.reg_mr_buffer(&buf, 0, 1 << 16, ALL).unwrap();
    let rkey = mr.rkey();
    assert_eq!(
        write_to(&mut p, &mut qa, mr.addr(), rkey, 1),
        WcStatus::Success
    );
    let pd2 = p.b.ctx.alloc_pd().unwrap();
    let how = mr.rereg(rf::CHANGE_PD, Some(&pd2), None, 0).unwrap();
    assert_eq!(
        (how, mr.rkey(), mr.pdn()),
        (Rereg::InPlace, rkey, pd2.pdn())
    );
    // A QP of the old PD: remote access error (the PD check).
    assert_eq!(
        write_to(&mut p, &mut qa, mr.addr(), rkey, 2),
        WcStatus::RemAccessErr
    );
    // A QP of the new PD reaches it.
    let mut qb2 = pd2
        .create_qp(&QpInitAttr {
            send_cq: &p.b.cq,
            recv_cq: &p.b.cq,
            srq: None,
            cap: cap(16),
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    let mut qa2 = create_qp(&p.a, QpType::Rc, cap(16));
    connect(&mut qa2, &p.a.ctx, &p.b.ctx, qb2.qp_num());
    connect(&mut qb2, &p.b.ctx, &p.a.ctx, qa2.qp_num());
    assert_eq!(
        write_to(&mut p, &mut qa2, mr.addr(), rkey, 3),
        WcStatus::Success
    );
    assert_eq!(read(&buf, 0, 64), read(&p.a.buf, 0, 64));
    // The region keeps the new PD alive; it goes with the region.
    drop(pd2);
    mr.dereg().unwrap();
}

#[test]
fn rereg_access_by_umr_takes_remote_write_away_and_back() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let buf = buffer(1 << 16);
    let mut mr = p.b.pd.reg_mr_buffer(&buf, 0, 1 << 16, ALL).unwrap();
    let rkey = mr.rkey();
    let ro = access::LOCAL_WRITE | access::REMOTE_READ;
    assert_eq!(
        mr.rereg(rf::CHANGE_ACCESS, None, None, ro).unwrap(),
        Rereg::InPlace
    );
    assert_eq!(mr.access(), ro);
    assert_eq!(
        write_to(&mut p, &mut qa, mr.addr(), rkey, 1),
        WcStatus::RemAccessErr
    );
    assert_eq!(read(&buf, 0, 64), vec![0; 64], "nothing landed");
    let (mut qa2, _qb2) = qp_pair(&p, QpType::Rc, cap(16));
    let how = mr.rereg(rf::CHANGE_ACCESS, None, None, ALL).unwrap();
    assert_eq!((how, mr.rkey()), (Rereg::InPlace, rkey));
    assert_eq!(
        write_to(&mut p, &mut qa2, mr.addr(), rkey, 2),
        WcStatus::Success
    );
    assert_eq!(read(&buf, 0, 64), read(&p.a.buf, 0, 64));
}

#[test]
fn bad_rereg_requests_are_refused_and_change_nothing() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let buf = buffer(1 << 16);
    let mut mr = p.b.pd.reg_mr_buffer(&buf, 0, 1 << 16, ALL).unwrap();
    let rkey = mr.rkey();
    let inval = |r: verbs::Result<Rereg>| matches!(r, Err(Error::Invalid(_)));
    assert!(inval(mr.rereg(0, None, None, 0)), "no flag");
    assert!(inval(mr.rereg(1 << 3, None, None, 0)), "unknown flag");
    assert!(inval(mr.rereg(rf::CHANGE_PD, None, None, 0)), "no PD");
    assert!(
        inval(mr.rereg(rf::CHANGE_TRANSLATION, None, None, 0)),
        "no memory"
    );
    let m = ReregMemory::Buffer {
        buf: &buf,
        offset: 0xf000,
        len: 0x2000,
    };
    assert!(
        inval(mr.rereg(rf::CHANGE_TRANSLATION, None, Some(m), 0)),
        "outside"
    );
    assert!(
        inval(mr.rereg(rf::CHANGE_ACCESS, None, None, access::REMOTE_WRITE)),
        "remote write without local write"
    );
    // A PD of another context.
    let other = p.a.ctx.alloc_pd().unwrap();
    assert!(inval(mr.rereg(rf::CHANGE_PD, Some(&other), None, 0)));
    // Another handle exists: busy.
    let clone: Mr = mr.clone();
    assert!(matches!(
        mr.rereg(rf::CHANGE_ACCESS, None, None, access::LOCAL_WRITE),
        Err(Error::Busy(_))
    ));
    drop(clone);
    assert_eq!(
        (mr.rkey(), mr.access(), mr.pdn()),
        (rkey, ALL, p.b.pd.pdn())
    );
    assert_eq!(
        write_to(&mut p, &mut qa, mr.addr(), rkey, 1),
        WcStatus::Success
    );
}

/// A device whose UMR cannot change the atomic right (general caps
/// `atomic` and `umr_modify_atomic_disabled`, rewritten once the driver
/// set them).
struct NoAtomicUmr(AtomicBool);

impl OutputOverride for NoAtomicUmr {
    fn answer(&self, opcode: u16, op_mod: u16, _: &[u8], out: &[u8]) -> Option<Vec<u8>> {
        if opcode == Opcode::SetHcaCap.to_raw() {
            self.0.store(true, Ordering::Release);
        }
        if opcode != Opcode::QueryHcaCap.to_raw()
            || op_mod != 1
            || out.len() < 0x10
            || !self.0.load(Ordering::Acquire)
        {
            return None;
        }
        let mut out = out.to_vec();
        CmdHcaCap::new_unchecked(&mut out[0x10..])
            .set_atomic(true)
            .set_umr_modify_atomic_disabled(true);
        Some(out)
    }
}

#[test]
fn rereg_the_umr_cannot_make_gives_a_new_key() {
    // Each function its own edit (it starts after that function's SET_HCA_CAP).
    let fabric = Fabric::new();
    for i in 0..2 {
        fabric.add(DeviceConfig {
            output_override: Some(Arc::new(NoAtomicUmr(AtomicBool::new(false)))),
            mac: mlx5_emu::DEFAULT_MAC + i,
            ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
        });
    }
    let a = side(open(function(&fabric, 0)), 1 << 16, ALL);
    let b = side(open(function(&fabric, 1)), 1 << 16, ALL);
    let mut p = Pair { fabric, a, b };
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let (old, new) = (buffer(1 << 16), buffer(1 << 16));
    let no_atomic = access::LOCAL_WRITE | access::REMOTE_WRITE;
    let mut mr = p.b.pd.reg_mr_buffer(&old, 0, 0x2000, no_atomic).unwrap();
    let k0 = mr.rkey();
    // Remote write off, atomic unchanged: UMR may, same key.
    let how = mr.rereg(rf::CHANGE_ACCESS, None, None, access::LOCAL_WRITE);
    assert_eq!(how.unwrap(), Rereg::InPlace);
    assert_eq!(mr.rkey(), k0);
    // Atomic on: UMR may not (mlx5r_umr_can_reconfig), a new key; the
    // old one names nothing any more.
    let how = mr.rereg(rf::CHANGE_ACCESS, None, None, ALL).unwrap();
    assert_eq!(how, Rereg::Recreated);
    let k1 = mr.rkey();
    assert_ne!(k1, k0);
    assert_eq!(
        (mr.lkey(), mr.access(), mr.addr()),
        (k1, ALL, old.host_addr())
    );
    assert_eq!(
        write_to(&mut p, &mut qa, mr.addr(), k1, 1),
        WcStatus::Success
    );
    assert_eq!(read(&old, 0, 64), read(&p.a.buf, 0, 64));
    let (mut qa2, _qb2) = qp_pair(&p, QpType::Rc, cap(16));
    assert_eq!(
        write_to(&mut p, &mut qa2, mr.addr(), k0, 2),
        WcStatus::RemAccessErr
    );
    // Translation and atomic off together: a new key over the new memory.
    let m = ReregMemory::Buffer {
        buf: &new,
        offset: 0x1000,
        len: 0x1000,
    };
    let how = mr.rereg(
        rf::CHANGE_TRANSLATION | rf::CHANGE_ACCESS,
        None,
        Some(m),
        no_atomic,
    );
    assert_eq!(how.unwrap(), Rereg::Recreated);
    let k2 = mr.rkey();
    assert_ne!(k2, k1);
    assert_eq!(mr.addr(), new.host_addr() + 0x1000);
    let (mut qa3, _qb3) = qp_pair(&p, QpType::Rc, cap(16));
    assert_eq!(
        write_to(&mut p, &mut qa3, mr.addr(), k2, 3),
        WcStatus::Success
    );
    assert_eq!(read(&new, 0x1000, 64), read(&p.a.buf, 0, 64));
    mr.dereg().unwrap();
}

#[test]
fn a_failed_umr_of_the_driver_is_its_status_and_the_umr_qp_recovers() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let engine = p.b.ctx.umr_engine().unwrap();
    // No such key: LOCAL_PROT_ERR; the REG_UMR QP went to ERR.
    match engine.post(&UmrWr::new(0x00ff_ff00)) {
        Err(Error::WorkCompletion { status, .. }) => assert_eq!(status, WcStatus::LocProtErr),
        other => panic!("expected a LOC_PROT_ERR completion, got {other:?}"),
    }
    // Brought back to RTS: the next UMR (a rereg) goes through.
    let buf = buffer(1 << 16);
    let mut mr = p.b.pd.reg_mr_buffer(&buf, 0, 1 << 16, ALL).unwrap();
    let ro = access::LOCAL_WRITE;
    assert_eq!(
        mr.rereg(rf::CHANGE_ACCESS, None, None, ro).unwrap(),
        Rereg::InPlace
    );
    assert_eq!(
        write_to(&mut p, &mut qa, mr.addr(), mr.rkey(), 1),
        WcStatus::RemAccessErr
    );
}
