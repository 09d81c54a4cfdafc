//! DevX in the model: user contexts, UMEMs, a CQ placed in a UMEM, uid
//! ownership, general objects, and what a ConnectX-4 Lx (no DevX) answers.

use mlx5_hw::devx::{GENERAL_OBJECT_TYPES_ENCRYPTION_KEY as DEK, SHARED_RESOURCE_UID};
use mlx5_hw::ifc::{
    alloc_pd_out, create_encryption_key_in, create_mkey_in, create_mkey_out, create_qp_in,
    dealloc_pd_in, destroy_mkey_in, encryption_key_obj, general_obj_out_cmd_hdr, mkc, qpc,
};
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

/// [`cx5`] with 16 KiB of memory mapped at UMEM_IOVA (kept by the caller).
fn cx5_with_umem_memory() -> (Drv, std::sync::Arc<DmaBuffer>) {
    let d = cx5();
    let mem = DmaBuffer::new(4 * 4096).unwrap();
    d.f.dma_map(Iova(UMEM_IOVA), &mem).unwrap();
    (d, mem)
}

/// The driver's UAR and an EQ on it, then a user context and a UAR of
/// it: (driver's UAR, EQ, uid, the context's UAR).
fn user_context(d: &mut Drv) -> (u32, u8, u16, u32) {
    let uar0 = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    let eqn = create_eq(d, uar0, 6, 1, 0);
    let uid = create_uctx(d);
    let uar = alloc_uar(d, uid);
    (uar0, eqn, uid, uar)
}

/// DESTROY_UMEM of `id` under `uid`.
fn destroy_umem_cmd(uid: u16, id: u32) -> Vec<u8> {
    let mut du = uid_cmd(0xa0a, uid, destroy_umem_in::SIZE_BYTES);
    destroy_umem_in::UMEM_ID.set(&mut du, u64::from(id));
    du
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

/// ALLOC_UAR under `uid`.
fn alloc_uar(d: &mut Drv, uid: u16) -> u32 {
    let mut c = cmd_in(0x802, 0, 16);
    c[2..4].copy_from_slice(&uid.to_be_bytes());
    be32(&d.ok(&c, 16), 8)
}

fn dealloc_uar(d: &mut Drv, uid: u16, uar: u32) {
    let mut c = cmd_in(0x803, 0, 16);
    c[2..4].copy_from_slice(&uid.to_be_bytes());
    c[8..12].copy_from_slice(&uar.to_be_bytes());
    d.ok(&c, 16);
}

/// A command of `len` bytes under `uid`.
fn uid_cmd(opcode: u16, uid: u16, len: usize) -> Vec<u8> {
    let mut c = cmd_in(opcode, 0, len);
    c[2..4].copy_from_slice(&uid.to_be_bytes());
    c
}

fn alloc_pd(d: &mut Drv, uid: u16) -> u32 {
    alloc_pd_out::PD.get(&d.ok(&uid_cmd(0x800, uid, 0x10), 0x10)) as u32
}

/// CREATE_MKEY under `uid`: 4 KiB of physical addresses in `pd`.
fn mkey_in_pd(uid: u16, pd: u32) -> Vec<u8> {
    let mut c = uid_cmd(0x200, uid, create_mkey_in::SIZE_BYTES);
    let x = &mut c[create_mkey_in::MEMORY_KEY_MKEY_ENTRY.off / 8..];
    mkc::PD.set(x, u64::from(pd));
    mkc::LR.set(x, 1);
    mkc::QPN.set(x, 0xff_ffff);
    mkc::LEN.set(x, 0x1000);
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
    let (mut d, _mem) = cx5_with_umem_memory();
    let (uar0, eqn, uid, uar) = user_context(&mut d);
    assert_ne!(uid, 0);
    // rd_en | wr_en on every entry.
    let id = create_umem_out::UMEM_ID.get(&d.ok(&umem_cmd(uid, 0, 4, 3), 0x10)) as u32;
    // The driver's UAR (uid 0) is not the context's to use.
    let out = d.exec(&cq_in_umem(uid, uar0, eqn, id, 0x2000, 0x40), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::REF_UID_MISMATCH)
    );
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
    let other_uar = alloc_uar(&mut d, other);
    let out = d.exec(&cq_in_umem(other, other_uar, eqn, id, 0, 0x40), 0x10);
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
    // The kernel (uid 0) queries any uid's objects (Linux's QUERY_QP of a
    // user QP carries no uid), and so does the owner.
    q[2..4].copy_from_slice(&0u16.to_be_bytes());
    d.ok(&q, 0x110);
    q[2..4].copy_from_slice(&uid.to_be_bytes());
    d.ok(&q, 0x110);
    // A uid that does not exist.
    q[2..4].copy_from_slice(&0x77u16.to_be_bytes());
    assert_eq!(
        status(&d.exec(&q, 0x110)),
        bad(CmdStatus::BadParameter, synd::BAD_UID)
    );
    // The UMEM is in use; the context has objects.
    let du = destroy_umem_cmd(uid, id);
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
    dealloc_uar(&mut d, uid, uar);
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
    let uar0 = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    let eqn = create_eq(&mut d, uar0, 6, 1, 0);
    let uar = alloc_uar(&mut d, uid);
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

#[test]
fn objects_use_only_their_own_uids_objects_or_shared_ones() {
    let mut d = cx5();
    let a = create_uctx(&mut d);
    let b = create_uctx(&mut d);
    let pd_a = alloc_pd(&mut d, a);
    let pd_0 = alloc_pd(&mut d, 0);
    let ref_mismatch = bad(CmdStatus::BadParameter, synd::REF_UID_MISMATCH);
    // A key in another context's PD or in the kernel's PD: refused before
    // anything else is looked at.
    for (uid, pd) in [(b, pd_a), (a, pd_0)] {
        let out = d.exec(&mkey_in_pd(uid, pd), 0x10);
        assert_eq!(status(&out), ref_mismatch, "uid {uid} pd {pd}");
    }
    // The kernel's key in a context's PD is taken (Linux registers a
    // device-memory MR of a user PD so, mlx5_ib_get_dm_mr).
    let key = create_mkey_out::MKEY_INDEX.get(&d.ok(&mkey_in_pd(0, pd_a), 0x10));
    let mut dk0 = uid_cmd(0x202, 0, destroy_mkey_in::SIZE_BYTES);
    destroy_mkey_in::MKEY_INDEX.set(&mut dk0, key);
    d.ok(&dk0, 0x10);
    let key = create_mkey_out::MKEY_INDEX.get(&d.ok(&mkey_in_pd(a, pd_a), 0x10));
    let mut dk = uid_cmd(0x202, a, destroy_mkey_in::SIZE_BYTES);
    destroy_mkey_in::MKEY_INDEX.set(&mut dk, key);
    d.ok(&dk, 0x10);
    // A QP naming another uid's PD, or (with its own PD) the kernel's UAR.
    let uar0 = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    let mut q = uid_cmd(0x500, b, create_qp_in::SIZE_BYTES);
    let x = create_qp_in::QPC.off / 8;
    qpc::PD.set(&mut q[x..], u64::from(pd_a));
    assert_eq!(status(&d.exec(&q, 0x10)), ref_mismatch);
    let pd_b = alloc_pd(&mut d, b);
    qpc::PD.set(&mut q[x..], u64::from(pd_b));
    qpc::UAR_PAGE.set(&mut q[x..], u64::from(uar0));
    assert_eq!(status(&d.exec(&q, 0x10)), ref_mismatch);

    // A PD under the shared uid: every context may use it, only the
    // kernel (uid 0) manages it.
    let shared = alloc_pd(&mut d, SHARED_RESOURCE_UID);
    let key = create_mkey_out::MKEY_INDEX.get(&d.ok(&mkey_in_pd(a, shared), 0x10));
    destroy_mkey_in::MKEY_INDEX.set(&mut dk, key);
    d.ok(&dk, 0x10);
    let mut dp = uid_cmd(0x801, a, dealloc_pd_in::SIZE_BYTES);
    dealloc_pd_in::PD.set(&mut dp, u64::from(shared));
    assert_eq!(
        status(&d.exec(&dp, 0x10)),
        bad(CmdStatus::BadParameter, synd::UID_MISMATCH)
    );
    dp[2..4].copy_from_slice(&0u16.to_be_bytes());
    d.ok(&dp, 0x10);
    for (uid, pd) in [(a, pd_a), (0, pd_0), (b, pd_b)] {
        let mut dp = uid_cmd(0x801, uid, dealloc_pd_in::SIZE_BYTES);
        dealloc_pd_in::PD.set(&mut dp, u64::from(pd));
        d.ok(&dp, 0x10);
    }
}

#[test]
fn the_shared_uid_exists_only_where_devx_does() {
    let mut d = Drv::new();
    d.bring_up();
    let out = d.exec(&uid_cmd(0x800, SHARED_RESOURCE_UID, 0x10), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, crate::fw::synd::BAD_UID)
    );
    // Linux allocates its Q counters under the shared uid when the
    // function offers DevX (mlx5_ib_alloc_counters).
    let mut d = cx5();
    let out = d.ok(&uid_cmd(0x771, SHARED_RESOURCE_UID, 0x10), 0x10);
    assert_ne!(out[11], 0);
}

/// A general object command on `ty`/`id` under `uid`, `extra` bytes of
/// object after the header.
fn gen_cmd(opcode: u16, uid: u16, ty: u16, id: u32, extra: usize) -> Vec<u8> {
    let mut c = uid_cmd(opcode, uid, general_obj_in_cmd_hdr::SIZE_BYTES + extra);
    general_obj_in_cmd_hdr::OBJ_TYPE.set(&mut c, u64::from(ty));
    general_obj_in_cmd_hdr::OBJ_ID.set(&mut c, u64::from(id));
    c
}

/// CREATE_GENERAL_OBJECT of a DEK: 256-bit AES-XTS in `pd`.
fn dek_in(uid: u16, pd: u32, size: u64) -> Vec<u8> {
    let mut c = gen_cmd(0xa00, uid, DEK, 0, encryption_key_obj::SIZE_BYTES);
    let o = &mut c[create_encryption_key_in::ENCRYPTION_KEY_OBJECT.off / 8..];
    encryption_key_obj::KEY_SIZE.set(o, size);
    encryption_key_obj::KEY_PURPOSE.set(o, 3);
    encryption_key_obj::PD.set(o, u64::from(pd));
    encryption_key_obj::OPAQUE.set(o, 0x1234_5678_9abc_def0);
    let k = encryption_key_obj::KEY.off / 8;
    for (i, b) in o[k..k + 64].iter_mut().enumerate() {
        *b = i as u8 + 1;
    }
    c
}

#[test]
fn a_connectx7_creates_queries_and_destroys_deks() {
    let bit = 1u64 << DEK;
    for p in [Profile::ConnectX5, Profile::ConnectX6] {
        assert_eq!(p.caps().get(0, cmd_hca_cap::GENERAL_OBJ_TYPES), 0, "{p:?}");
    }
    let caps = Profile::ConnectX7.caps();
    assert_eq!(caps.get(0, cmd_hca_cap::GENERAL_OBJ_TYPES), bit);
    assert_ne!(caps.get(0, cmd_hca_cap::LOG_MAX_DEK), 0);
    let mut d = Drv::with(DeviceConfig {
        profile: Profile::ConnectX7,
        ..DeviceConfig::default()
    });
    d.bring_up();
    let a = create_uctx(&mut d);
    let b = create_uctx(&mut d);
    let (pd_a, pd_b) = (alloc_pd(&mut d, a), alloc_pd(&mut d, b));
    let bad_param = |s| bad(CmdStatus::BadParameter, s);

    // What CREATE refuses: a key size firmware does not know, another
    // uid's PD, no PD, a short input.
    assert_eq!(
        status(&d.exec(&dek_in(a, pd_a, 7), 0x10)),
        bad_param(synd::DEK_BAD_PARAM)
    );
    assert_eq!(
        status(&d.exec(&dek_in(a, pd_b, 1), 0x10)),
        bad_param(synd::REF_UID_MISMATCH)
    );
    assert_eq!(
        status(&d.exec(&dek_in(a, 0x777, 1), 0x10)),
        bad(CmdStatus::BadResource, synd::DEK_BAD_PD)
    );
    assert_eq!(
        status(&d.exec(&dek_in(a, pd_a, 1)[..0x40], 0x10)).0,
        CmdStatus::BadInputLength.to_raw()
    );
    let id = general_obj_out_cmd_hdr::OBJ_ID.get(&d.ok(&dek_in(a, pd_a, 1), 0x10)) as u32;
    assert_ne!(id, 0);

    // QUERY: state, size, purpose, PD and opaque; never the key.
    let q = gen_cmd(0xa02, a, DEK, id, 0);
    let out = d.ok(
        &q,
        general_obj_out_cmd_hdr::SIZE_BYTES + encryption_key_obj::SIZE_BYTES,
    );
    assert_eq!(general_obj_out_cmd_hdr::OBJ_ID.get(&out), u64::from(id));
    let o = &out[general_obj_out_cmd_hdr::SIZE_BYTES..];
    assert_eq!(encryption_key_obj::STATE.get(o), 0);
    assert_eq!(encryption_key_obj::KEY_SIZE.get(o), 1);
    assert_eq!(encryption_key_obj::KEY_PURPOSE.get(o), 3);
    assert_eq!(encryption_key_obj::PD.get(o), u64::from(pd_a));
    assert_eq!(encryption_key_obj::OPAQUE.get(o), 0x1234_5678_9abc_def0);
    let k = encryption_key_obj::KEY;
    assert!(o[k.off / 8..(k.off + k.width) / 8].iter().all(|&b| b == 0));

    // Another uid (the kernel may), a modification, an unknown number.
    let q = gen_cmd(0xa02, b, DEK, id, 0);
    assert_eq!(status(&d.exec(&q, 0x10)), bad_param(synd::UID_MISMATCH));
    d.ok(
        &gen_cmd(0xa02, 0, DEK, id, 0),
        general_obj_out_cmd_hdr::SIZE_BYTES + encryption_key_obj::SIZE_BYTES,
    );
    let m = gen_cmd(0xa01, a, DEK, id, encryption_key_obj::SIZE_BYTES);
    assert_eq!(
        status(&d.exec(&m, 0x10)),
        bad_param(synd::GENERAL_OBJ_NOT_MODIFIABLE)
    );
    let q = gen_cmd(0xa02, a, DEK, id + 1, 0);
    assert_eq!(
        status(&d.exec(&q, 0x10)),
        bad(CmdStatus::BadResource, synd::GENERAL_OBJ_UNKNOWN)
    );
    // A type general_obj_types does not list (FLOW_METER_ASO, 0x24), and
    // one beyond its 64 bits (MLX5_OBJ_TYPE_MKEY, 0xff01).
    for ty in [0x24, 0xff01] {
        let c = gen_cmd(0xa00, a, ty, 0, 0x40);
        assert_eq!(
            status(&d.exec(&c, 0x10)),
            bad_param(synd::GENERAL_OBJ_BAD_TYPE)
        );
    }

    // The key keeps its context; DESTROY, then the context can go.
    let mut dc = cmd_in(0xa06, 0, destroy_uctx_in::SIZE_BYTES);
    destroy_uctx_in::UID.set(&mut dc, u64::from(a));
    assert_eq!(
        status(&d.exec(&dc, 0x10)),
        bad(CmdStatus::BadResourceState, synd::UCTX_IN_USE)
    );
    d.ok(&gen_cmd(0xa03, a, DEK, id, 0), 0x10);
    assert_eq!(
        status(&d.exec(&gen_cmd(0xa03, a, DEK, id, 0), 0x10)),
        bad(CmdStatus::BadResource, synd::GENERAL_OBJ_UNKNOWN)
    );
    let mut dp = uid_cmd(0x801, a, dealloc_pd_in::SIZE_BYTES);
    dealloc_pd_in::PD.set(&mut dp, u64::from(pd_a));
    d.ok(&dp, 0x10);
    d.ok(&dc, 0x10);
}

/// CREATE_RQ under `uid`: a cyclic ring of 64 16-byte WQEs at `off` of
/// UMEM `id`, its doorbell record at 0x80 of the same UMEM, no PAS (as
/// DPDK's mlx5 PMD makes its receive queues with DevX).
fn rq_in_umem(uid: u16, cqn: u32, pd: u32, id: u32, off: u64) -> Vec<u8> {
    use mlx5_hw::ifc::{create_rq_in, rqc, wq};
    let mut c = uid_cmd(0x908, uid, create_rq_in::SIZE_BYTES);
    let x = &mut c[create_rq_in::CTX.off / 8..];
    rqc::CQN.set(x, u64::from(cqn));
    let w = &mut x[rqc::WQ.off / 8..];
    wq::WQ_TYPE.set(w, mlx5_hw::eth::WQ_TYPE_CYCLIC);
    wq::PD.set(w, u64::from(pd));
    wq::LOG_WQ_STRIDE.set(w, 4);
    wq::LOG_WQ_SZ.set(w, 6);
    wq::WQ_UMEM_VALID.set(w, 1);
    wq::WQ_UMEM_ID.set(w, u64::from(id));
    wq::WQ_UMEM_OFFSET.set(w, off);
    wq::DBR_UMEM_VALID.set(w, 1);
    wq::DBR_UMEM_ID.set(w, u64::from(id));
    wq::DBR_ADDR.set(w, 0x80);
    c
}

/// An RQ whose ring and doorbell record are in a UMEM (DevX; DPDK's mlx5
/// PMD makes every queue so, its drop queue first): taken without a PAS
/// list from a UMEM the device may only read, refused past the UMEM's
/// end, and the UMEM kept while it stands.
#[test]
fn umem_backs_an_rq_as_dpdk_makes_them() {
    use mlx5_hw::ifc::{create_rq_out, destroy_rq_in};
    let (mut d, _mem) = cx5_with_umem_memory();
    let (_, eqn, uid, uar) = user_context(&mut d);
    let pd = alloc_pd(&mut d, uid);
    let id = create_umem_out::UMEM_ID.get(&d.ok(&umem_cmd(uid, 0, 4, 3), 0x10)) as u32;
    let out = d.ok(&cq_in_umem(uid, uar, eqn, id, 0x2000, 0x40), 0x10);
    let cqn = create_cq_out::CQN.get(&out) as u32;
    // The RQ's UMEM lets the device read only (rd_en: DPDK registers its
    // queues' UMEMs with no access flags): a ring and doorbell record
    // the device only reads need no more; a CQ there is refused.
    let id = create_umem_out::UMEM_ID.get(&d.ok(&umem_cmd(uid, 0, 4, 1), 0x10)) as u32;
    assert_eq!(
        status(&d.exec(&cq_in_umem(uid, uar, eqn, id, 0x2000, 0x40), 0x10)),
        bad(CmdStatus::BadParameter, synd::UMEM_NO_WRITE)
    );
    // 1 KiB of ring at 12 KiB + 3 KiB: past the UMEM's 16 KiB.
    let out = d.exec(&rq_in_umem(uid, cqn, pd, id, 0x3c00 + 0x100), 0x10);
    assert_eq!(
        status(&out),
        bad(CmdStatus::BadParameter, synd::UMEM_OUT_OF_RANGE)
    );
    let out = d.ok(&rq_in_umem(uid, cqn, pd, id, 0x1000), 0x10);
    let rqn = create_rq_out::RQN.get(&out) as u32;
    let du = destroy_umem_cmd(uid, id);
    assert_eq!(
        status(&d.exec(&du, 0x10)),
        bad(CmdStatus::BadResourceState, synd::UMEM_IN_USE)
    );
    let mut x = uid_cmd(0x90a, uid, destroy_rq_in::SIZE_BYTES);
    destroy_rq_in::RQN.set(&mut x, u64::from(rqn));
    d.ok(&x, 0x10);
    let mut x = uid_cmd(0x401, uid, destroy_cq_in::SIZE_BYTES);
    destroy_cq_in::CQN.set(&mut x, u64::from(cqn));
    d.ok(&x, 0x10);
    d.ok(&du, 0x10);
}
