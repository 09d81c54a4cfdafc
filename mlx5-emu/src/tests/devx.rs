//! DevX in the model: user contexts, UMEMs, a CQ placed in a UMEM, uid
//! ownership, general objects, and what a ConnectX-4 Lx (no DevX) answers.

use mlx5_hw::ifc::{
    cmd_hca_cap, cqc, create_cq_in, create_cq_out, create_uctx_out, create_umem_in,
    create_umem_out, destroy_cq_in, destroy_uctx_in, destroy_umem_in, general_obj_in_cmd_hdr,
    query_cq_in, umem,
};
use mlx5_hw::status::CmdStatus;
use vfio::{DmaBuffer, Iova, PciFunction};

use super::{be32, cmd_in, create_eq, Drv};
use crate::fw::uctx::synd;
use crate::{DeviceConfig, Profile};

const UMEM_IOVA: u64 = 0x4000_0000;

fn cx5() -> Drv {
    let mut d = Drv::with(DeviceConfig {
        profile: Profile::ConnectX5,
        ..DeviceConfig::default()
    });
    d.bring_up();
    d
}

fn status(out: &[u8]) -> (u8, u32) {
    (out[0], be32(out, 4))
}

fn bad(s: CmdStatus, synd: u32) -> (u8, u32) {
    (s.to_raw(), synd)
}

fn create_uctx(d: &mut Drv) -> u16 {
    create_uctx_out::UID.get(&d.ok(&cmd_in(0xa04, 0, 0x40), 0x10)) as u16
}

/// A UMEM of `pages` 4 KiB pages at UMEM_IOVA + `at`, under `uid`.
fn umem_cmd(uid: u16, at: u64, pages: usize, flags: u64) -> Vec<u8> {
    let mut c = cmd_in(0xa08, 0, create_umem_in::SIZE_BYTES + 8 * pages);
    c[2..4].copy_from_slice(&uid.to_be_bytes());
    let u = &mut c[create_umem_in::UMEM.off / 8..];
    umem::NUM_OF_MTT.set(u, pages as u64);
    for i in 0..pages {
        let e = (UMEM_IOVA + at + (i as u64) * 4096) | flags;
        let o = umem::MTT.off / 8 + 8 * i;
        u[o..o + 8].copy_from_slice(&e.to_be_bytes());
    }
    c
}

fn cq_in_umem(uid: u16, uar: u32, eqn: u8, id: u32, off: u64, dbr_off: u64) -> Vec<u8> {
    let mut c = cmd_in(0x400, 0, create_cq_in::SIZE_BYTES);
    c[2..4].copy_from_slice(&uid.to_be_bytes());
    create_cq_in::CQ_UMEM_VALID.set(&mut c, 1);
    create_cq_in::CQ_UMEM_ID.set(&mut c, u64::from(id));
    create_cq_in::CQ_UMEM_OFFSET.set(&mut c, off);
    let x = &mut c[create_cq_in::CQ_CONTEXT.off / 8..];
    cqc::LOG_CQ_SIZE.set(x, 6);
    cqc::UAR_PAGE.set(x, u64::from(uar));
    cqc::C_EQN_OR_APU_ELEMENT.set(x, u64::from(eqn));
    cqc::DBR_UMEM_VALID.set(x, 1);
    cqc::DBR_UMEM_ID.set(x, u64::from(id));
    cqc::DBR_ADDR.set(x, dbr_off);
    c
}

#[test]
fn cx5_reports_devx_and_cx4lx_refuses_it() {
    for p in [Profile::ConnectX5, Profile::ConnectX6, Profile::ConnectX7] {
        let caps = p.caps();
        assert_eq!(caps.get(0, cmd_hca_cap::LOG_MAX_UCTX), 8, "{p:?}");
        assert_eq!(caps.get(0, cmd_hca_cap::LOG_MAX_UMEM), 12, "{p:?}");
        assert_eq!(caps.get(0, cmd_hca_cap::UMEM_UID_0), 1, "{p:?}");
        assert_eq!(caps.get(0, cmd_hca_cap::UCTX_CAP), 3, "{p:?}");
    }
    let caps = Profile::ConnectX4Lx.caps();
    assert_eq!(caps.get(0, cmd_hca_cap::LOG_MAX_UCTX), 0);
    assert_eq!(caps.get(0, cmd_hca_cap::UMEM_UID_0), 0);
    let mut d = Drv::new();
    d.bring_up();
    assert_eq!(
        status(&d.exec(&cmd_in(0xa04, 0, 0x40), 0x10)),
        bad(CmdStatus::BadOperation, crate::fw::synd::BAD_OPCODE)
    );
}

#[test]
fn umem_backs_a_cq_and_is_kept_while_used() {
    let mut d = cx5();
    let mem = DmaBuffer::new(4 * 4096).unwrap();
    d.f.dma_map(Iova(UMEM_IOVA), &mem).unwrap();
    let uar = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    let eqn = create_eq(&mut d, uar, 6, 1, 0);
    let uid = create_uctx(&mut d);
    assert_ne!(uid, 0);
    // rd_en | wr_en on every entry.
    let id = create_umem_out::UMEM_ID.get(&d.ok(&umem_cmd(uid, 0, 4, 3), 0x10)) as u32;
    // 64 CQEs of 64 bytes at 8 KiB, the doorbell record at 0x40.
    let out = d.ok(&cq_in_umem(uid, uar, eqn, id, 0x2000, 0x40), 0x10);
    let cqn = create_cq_out::CQN.get(&out) as u32;
    // Past the UMEM's end: 0x3800 + 4 KiB > 16 KiB.
    let out = d.exec(&cq_in_umem(uid, uar, eqn, id, 0x3800, 0x40), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UMEM_OUT_OF_RANGE)
    );
    // Another uid may not use the UMEM, query or destroy the CQ.
    let other = create_uctx(&mut d);
    let out = d.exec(&cq_in_umem(other, uar, eqn, id, 0, 0x40), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UID_MISMATCH)
    );
    let mut q = cmd_in(0x402, 0, query_cq_in::SIZE_BYTES);
    query_cq_in::CQN.set(&mut q, u64::from(cqn));
    q[2..4].copy_from_slice(&other.to_be_bytes());
    assert_eq!(
        status(&d.exec(&q, 0x110)),
        bad(CmdStatus::BadParameter, synd::UID_MISMATCH)
    );
    q[2..4].copy_from_slice(&0u16.to_be_bytes());
    assert_eq!(
        status(&d.exec(&q, 0x110)),
        bad(CmdStatus::BadParameter, synd::UID_MISMATCH)
    );
    q[2..4].copy_from_slice(&uid.to_be_bytes());
    d.ok(&q, 0x110);
    // A uid that does not exist.
    q[2..4].copy_from_slice(&0x77u16.to_be_bytes());
    assert_eq!(
        status(&d.exec(&q, 0x110)),
        bad(CmdStatus::BadParameter, synd::BAD_UID)
    );
    // The UMEM is in use; the context has objects.
    let mut du = cmd_in(0xa0a, 0, destroy_umem_in::SIZE_BYTES);
    du[2..4].copy_from_slice(&uid.to_be_bytes());
    destroy_umem_in::UMEM_ID.set(&mut du, u64::from(id));
    assert_eq!(
        status(&d.exec(&du, 0x10)),
        bad(CmdStatus::BadResourceState, synd::UMEM_IN_USE)
    );
    let mut dc = cmd_in(0xa06, 0, destroy_uctx_in::SIZE_BYTES);
    destroy_uctx_in::UID.set(&mut dc, u64::from(uid));
    assert_eq!(
        status(&d.exec(&dc, 0x10)),
        bad(CmdStatus::BadResourceState, synd::UCTX_IN_USE)
    );
    // Destroy in order: CQ, UMEM, context.
    let mut x = cmd_in(0x401, 0, destroy_cq_in::SIZE_BYTES);
    x[2..4].copy_from_slice(&uid.to_be_bytes());
    destroy_cq_in::CQN.set(&mut x, u64::from(cqn));
    d.ok(&x, 0x10);
    d.ok(&du, 0x10);
    d.ok(&dc, 0x10);
    assert_eq!(
        status(&d.exec(&dc, 0x10)),
        bad(CmdStatus::BadParameter, synd::BAD_UID)
    );
}

#[test]
fn umem_checks_its_pages_and_general_objects_check_the_type() {
    let mut d = cx5();
    let mem = DmaBuffer::new(2 * 4096).unwrap();
    d.f.dma_map(Iova(UMEM_IOVA), &mem).unwrap();
    let uid = create_uctx(&mut d);
    // A page not mapped for DMA; a misaligned page; no entries.
    let out = d.exec(&umem_cmd(uid, 0x10_0000, 1, 3), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UMEM_NOT_MAPPED)
    );
    let out = d.exec(&umem_cmd(uid, 0x100, 1, 3), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UMEM_BAD_PARAM)
    );
    let out = d.exec(&umem_cmd(uid, 0, 0, 3), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UMEM_BAD_PARAM)
    );
    // Read-only pages cannot hold a queue.
    let uar = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    let eqn = create_eq(&mut d, uar, 6, 1, 0);
    let ro = create_umem_out::UMEM_ID.get(&d.ok(&umem_cmd(uid, 0, 2, 1), 0x10)) as u32;
    let out = d.exec(&cq_in_umem(uid, uar, eqn, ro, 0, 0x40), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UMEM_NO_WRITE)
    );
    // An object type the function does not list in general_obj_types.
    let mut g = cmd_in(0xa00, 0, general_obj_in_cmd_hdr::SIZE_BYTES + 0x40);
    g[2..4].copy_from_slice(&uid.to_be_bytes());
    general_obj_in_cmd_hdr::OBJ_TYPE.set(&mut g, 0xc);
    assert_eq!(
        status(&d.exec(&g, 0x10)),
        bad(CmdStatus::BadParameter, synd::GENERAL_OBJ_BAD_TYPE)
    );
}
