//! End to end, device memory (MEMIC): `alloc_dm` on the ConnectX-5/6/7
//! profiles (the ConnectX-4 Lx has none), bytes in and out through the
//! mapped BAR, `reg_dm_mr` (MEMIC access mode, zero-based) as the target
//! of a peer's RDMA WRITE, READ and atomics; refused: past the
//! allocation, unaligned copies, access without ZERO_BASED, more than the
//! device has, freeing memory an MR still uses.

mod verbs_common;

use mlx5_emu::Profile;
use verbs::cq::WcStatus;
use verbs::dm::Dm;
use verbs::mr::access;
use verbs::qp::{send_flags as sf, Payload, Qp, QpType, SendOp, SendWr};
use verbs::Error;
use verbs_common::*;

const DM_ACC: u32 = ALL | access::ZERO_BASED;

fn post(qa: &mut Qp, op: SendOp, sge: verbs::mr::Sge) {
    qa.post_send(&[SendWr {
        wr_id: 1,
        op,
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
}

fn dm_read(dm: &Dm, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    dm.memcpy_from_dm(&mut v, off).unwrap();
    v
}

#[test]
fn memcpy_through_the_bar_round_trips_and_a_peer_writes_reads_and_adds_into_it() {
    let mut p = pair_profile(1 << 16, Profile::ConnectX5, ALL);
    let caps = p.b.ctx.hca().caps().device_mem().unwrap();
    assert!(caps.memic());
    assert_eq!(caps.max_memic_size(), 128 << 10);
    let dm = p.b.ctx.alloc_dm(4096, 6).unwrap();
    assert_eq!(dm.len(), 4096);
    assert!(dm.bar_offset() >= caps.memic_bar_start_addr());
    assert_eq!(dm_read(&dm, 0, 64), vec![0; 64], "fresh memory reads 0");
    let pat: Vec<u8> = (0..256u32).map(|i| (i * 7) as u8).collect();
    dm.memcpy_to_dm(512, &pat).unwrap();
    assert_eq!(dm_read(&dm, 512, 256), pat);
    let mr = p.b.pd.reg_dm_mr(&dm, 0, 4096, DM_ACC).unwrap();
    let k = mr.query_mkey().unwrap();
    assert_eq!(k.access_mode, mlx5_hw::wqe::MKC_ACCESS_MODE_MEMIC);
    assert_eq!(k.start_addr, dm.bar_offset());
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    // RDMA WRITE of 1 KiB at DM offset 1024 (zero-based address).
    let data = fill(&p.a.buf, 0, 1024, 3);
    post(
        &mut qa,
        SendOp::RdmaWrite {
            raddr: 1024,
            rkey: mr.rkey(),
        },
        p.a.mr.sge(0, 1024).unwrap(),
    );
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(dm_read(&dm, 1024, 1024), data);
    // RDMA READ of the pattern back into A's buffer.
    post(
        &mut qa,
        SendOp::RdmaRead {
            raddr: 512,
            rkey: mr.rkey(),
        },
        p.a.mr.sge(4096, 256).unwrap(),
    );
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&p.a.buf, 4096, 256), pat);
    // Fetch-and-add on a counter in the DM, in host byte order: the driver
    // sets host-endian 8-byte atomics where the card offers them
    // (ConnectX-5 and later; Linux does the same).
    dm.memcpy_to_dm(8, &40u64.to_le_bytes()).unwrap();
    post(
        &mut qa,
        SendOp::AtomicFetchAdd {
            raddr: 8,
            rkey: mr.rkey(),
            add: 2,
        },
        p.a.mr.sge(8192, 8).unwrap(),
    );
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&p.a.buf, 8192, 8), 40u64.to_le_bytes());
    assert_eq!(dm_read(&dm, 8, 8), 42u64.to_le_bytes());
    // Compare-and-swap.
    post(
        &mut qa,
        SendOp::AtomicCmpSwp {
            raddr: 8,
            rkey: mr.rkey(),
            compare: 42,
            swap: 7,
        },
        p.a.mr.sge(8192, 8).unwrap(),
    );
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(dm_read(&dm, 8, 8), 7u64.to_le_bytes());
}

#[test]
fn past_the_allocation_and_unaligned_accesses_are_refused() {
    let mut p = pair_profile(1 << 16, Profile::ConnectX6, ALL);
    let dm = p.b.ctx.alloc_dm(1000, 0).unwrap();
    // memcpy: EFAULT past the length asked for, EINVAL unaligned.
    assert!(matches!(
        dm.memcpy_to_dm(996, &[0; 8]),
        Err(Error::Fault(_))
    ));
    assert!(matches!(
        dm.memcpy_from_dm(&mut [0; 4], 1000),
        Err(Error::Fault(_))
    ));
    assert!(matches!(
        dm.memcpy_to_dm(2, &[0; 4]),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        dm.memcpy_to_dm(0, &[0; 6]),
        Err(Error::Invalid(_))
    ));
    assert_eq!(Error::Fault("x").errno(), 14);
    // reg_dm_mr: past the length asked for (1000, though 1024 bytes are
    // allocated: ib_core checks the length asked), without ZERO_BASED,
    // with a right DM MRs cannot have; an empty MR is allowed (as ib_core,
    // and rdma-core's test_create_dm_mr asks for one).
    assert!(matches!(
        p.b.pd.reg_dm_mr(&dm, 512, 1024, DM_ACC),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        p.b.pd.reg_dm_mr(&dm, 0, 1004, DM_ACC),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        p.b.pd.reg_dm_mr(&dm, 1000, 4, DM_ACC),
        Err(Error::Invalid(_))
    ));
    drop(p.b.pd.reg_dm_mr(&dm, 1000, 0, DM_ACC).unwrap());
    assert!(matches!(
        p.b.pd.reg_dm_mr(&dm, 0, 1024, ALL),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(
        p.b.pd.reg_dm_mr(&dm, 0, 64, DM_ACC | access::MW_BIND),
        Err(Error::Invalid(_))
    ));
    // A WRITE past the MR's end: remote access error, nothing written.
    let mr = p.b.pd.reg_dm_mr(&dm, 0, 512, DM_ACC).unwrap();
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(8));
    fill(&p.a.buf, 0, 64, 1);
    post(
        &mut qa,
        SendOp::RdmaWrite {
            raddr: 480,
            rkey: mr.rkey(),
        },
        p.a.mr.sge(0, 64).unwrap(),
    );
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::RemAccessErr);
    assert_eq!(dm_read(&dm, 480, 64), vec![0; 64]);
    // Alignment beyond log_max_memic_addr_alignment (64 << 12).
    assert!(matches!(p.b.ctx.alloc_dm(64, 19), Err(Error::Invalid(_))));
    // Busy while an MR uses it; then freed.
    let Err(Error::Busy(_)) = dm.free() else {
        panic!("freed under its MR")
    };
}

#[test]
fn the_device_has_what_its_caps_say_and_memory_comes_back() {
    let p = pair_profile(4096, Profile::ConnectX5, ALL);
    let big = p.b.ctx.alloc_dm(96 << 10, 12).unwrap();
    assert_eq!(big.bar_offset() % 4096, 0, "aligned as asked");
    let small = p.b.ctx.alloc_dm(32 << 10, 0).unwrap();
    assert!(matches!(p.b.ctx.alloc_dm(64, 0), Err(Error::QueueFull(_))));
    big.free().unwrap();
    let again = p.b.ctx.alloc_dm(64 << 10, 0).unwrap();
    assert_eq!(again.len(), 64 << 10);
    drop(small);
    let lx = pair_profile(4096, Profile::ConnectX4Lx, ALL);
    assert!(matches!(
        lx.a.ctx.alloc_dm(64, 0),
        Err(Error::NotSupported(_))
    ));
}

#[test]
fn operation_addresses_increment_and_test_and_set_the_memory() {
    use mlx5_hw::init::{MEMIC_OP_ATOMIC_INCREMENT as INC, MEMIC_OP_ATOMIC_TEST_AND_SET as TAS};
    let p = pair_profile(4096, Profile::ConnectX7, ALL);
    let dm = p.b.ctx.alloc_dm(128, 0).unwrap();
    dm.memcpy_to_dm(0, &[0; 128]).unwrap();
    let inc = dm.map_op_addr(INC).unwrap();
    let tas = dm.map_op_addr(TAS).unwrap();
    assert_ne!(inc.bar_offset(), tas.bar_offset());
    // rdma-core's test_dm_atomic_ops, then wider accesses.
    inc.store(0, &[1]).unwrap();
    inc.store(0, &[1]).unwrap();
    let mut b = [0u8; 1];
    tas.load(0, &mut b).unwrap();
    assert_eq!(b, [2]);
    tas.load(0, &mut b).unwrap();
    assert_eq!(b, [1]);
    inc.store(8, &5u64.to_be_bytes()).unwrap();
    inc.store(8, &6u64.to_be_bytes()).unwrap();
    assert_eq!(dm_read(&dm, 8, 8), 11u64.to_be_bytes());
    // Refused before the device sees them: past the memory, sizes the
    // caps do not offer, unaligned.
    assert!(matches!(inc.store(128, &[1]), Err(Error::Fault(_))));
    assert!(matches!(inc.store(124, &[0; 8]), Err(Error::Fault(_))));
    assert!(matches!(inc.store(0, &[0; 3]), Err(Error::Invalid(_))));
    assert!(matches!(inc.store(0, &[0; 16]), Err(Error::Invalid(_))));
    assert!(matches!(inc.store(2, &[0; 4]), Err(Error::Invalid(_))));
    assert_eq!(dm_read(&dm, 0, 8), [1, 0, 0, 0, 0, 0, 0, 0]);
    // Not offered: a type past the caps' bits, and any on ConnectX-5.
    assert!(matches!(dm.map_op_addr(2), Err(Error::NotSupported(_))));
    assert!(matches!(dm.map_op_addr(40), Err(Error::NotSupported(_))));
    let cx5 = pair_profile(4096, Profile::ConnectX5, ALL);
    let dm5 = cx5.a.ctx.alloc_dm(64, 0).unwrap();
    assert!(matches!(dm5.map_op_addr(INC), Err(Error::NotSupported(_))));
    // The memory stays while an operation address holds it.
    let Err(Error::Busy(_)) = dm.free() else {
        panic!("freed under its operation address")
    };
    drop((inc, tas));
}
