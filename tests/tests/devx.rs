//! DevX through the driver against the model: a user context, a UMEM over
//! a DMA buffer, a CQ created by a raw command with its CQEs and doorbell
//! record in the UMEM, and what firmware refuses (uid isolation, unknown
//! object types, a queue past the UMEM's end, destroying a UMEM in use),
//! each with its PRM status and syndrome.

use std::sync::Arc;

use mlx5_emu::{devx_synd, Fabric, Profile};
use mlx5_hw::ifc::{
    alloc_uar_in, alloc_uar_out, cqc, create_cq_in, create_cq_out, dealloc_uar_in, destroy_uctx_in,
    general_obj_in_cmd_hdr, query_cq_in, query_cq_out, query_hca_cap_in, query_hca_cap_out,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use verbs::device::Context;
use verbs::devx::{self, DevxCtx};
use verbs::hca::HcaOptions;
use verbs::Error;
use vfio::{DmaBuffer, PciFunction};

fn open(p: Profile) -> (Fabric, Context) {
    let fabric = Fabric::cabled(1, p);
    let f = fabric.function(0).expect("function") as Arc<dyn PciFunction>;
    let ctx = Context::open(f, HcaOptions::default()).unwrap_or_else(|e| panic!("open: {e}"));
    (fabric, ctx)
}

/// The status and syndrome of a failed command.
fn refused<T: std::fmt::Debug>(r: verbs::Result<T>) -> (CmdStatus, u32) {
    match r {
        Err(Error::Cmd {
            status, syndrome, ..
        }) => (status, syndrome),
        other => panic!("expected a firmware refusal, got {other:?}"),
    }
}

fn cmd(op: Opcode, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; len];
    general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(op.to_raw()));
    c
}

/// CREATE_CQ of 64 64-byte CQEs at `off` of UMEM `id`, its doorbell
/// record at byte 0x40 of the same UMEM.
fn create_cq(uar: u32, eqn: u8, id: u32, off: u64) -> Vec<u8> {
    let mut c = cmd(Opcode::CreateCq, create_cq_in::SIZE_BYTES);
    create_cq_in::CQ_UMEM_VALID.set(&mut c, 1);
    create_cq_in::CQ_UMEM_ID.set(&mut c, u64::from(id));
    create_cq_in::CQ_UMEM_OFFSET.set(&mut c, off);
    let x = &mut c[create_cq_in::CQ_CONTEXT.off / 8..];
    cqc::LOG_CQ_SIZE.set(x, 6);
    cqc::UAR_PAGE.set(x, u64::from(uar));
    cqc::C_EQN_OR_APU_ELEMENT.set(x, u64::from(eqn));
    cqc::DBR_UMEM_VALID.set(x, 1);
    cqc::DBR_UMEM_ID.set(x, u64::from(id));
    cqc::DBR_ADDR.set(x, 0x40);
    c
}

#[test]
fn devx_cq_in_a_umem_and_what_firmware_refuses() {
    let (_fabric, ctx) = open(Profile::ConnectX5);
    assert!(devx::supported(&ctx));
    let dx = DevxCtx::open(&ctx, 0).unwrap();
    let other = DevxCtx::open(&ctx, 0).unwrap();
    assert_ne!(dx.uid(), 0);
    assert_ne!(dx.uid(), other.uid());
    let buf = DmaBuffer::new(4 * 4096).unwrap();
    let mut umem = dx.umem_reg_buffer(&buf, 0, 4 * 4096, true).unwrap();
    let out = dx
        .general_cmd(
            &cmd(Opcode::AllocUar, alloc_uar_in::SIZE_BYTES),
            alloc_uar_out::SIZE_BYTES,
        )
        .unwrap();
    let uar = alloc_uar_out::UAR.get(&out) as u32;
    let eqn = ctx.hca().comp_eqns()[0];

    let cq = dx
        .obj_create(
            &create_cq(uar, eqn, umem.umem_id(), 0x1000),
            create_cq_out::SIZE_BYTES,
        )
        .unwrap();
    let cqn = create_cq_out::CQN.get(cq.create_out());
    assert_ne!(cqn, 0);
    let mut q = cmd(Opcode::QueryCq, query_cq_in::SIZE_BYTES);
    query_cq_in::CQN.set(&mut q, cqn);
    let out = cq.query(&q, query_cq_out::SIZE_BYTES).unwrap();
    let x = &out[query_cq_out::CQ_CONTEXT.off / 8..];
    assert_eq!(cqc::LOG_CQ_SIZE.get(x), 6);
    assert_eq!(cqc::C_EQN_OR_APU_ELEMENT.get(x), u64::from(eqn));

    // Another user context cannot query it; the driver's own uid 0 can
    // (firmware trusts the kernel with every uid's objects: Linux queries
    // user QPs without their uid).
    assert_eq!(
        refused(other.general_cmd(&q, query_cq_out::SIZE_BYTES)),
        (CmdStatus::BadParameter, devx_synd::UID_MISMATCH)
    );
    ctx.hca()
        .cmd()
        .exec(&q, query_cq_out::SIZE_BYTES)
        .expect("uid 0 queries a user context's CQ");
    // Nor use this context's UAR, nor (with a UAR of its own) place a CQ
    // in this context's UMEM.
    assert_eq!(
        refused(other.obj_create(
            &create_cq(uar, eqn, umem.umem_id(), 0),
            create_cq_out::SIZE_BYTES
        )),
        (CmdStatus::BadParameter, devx_synd::REF_UID_MISMATCH)
    );
    let other_uar = other.alloc_uar().unwrap();
    assert_eq!(
        refused(other.obj_create(
            &create_cq(other_uar.index(), eqn, umem.umem_id(), 0),
            create_cq_out::SIZE_BYTES
        )),
        (CmdStatus::BadParameter, devx_synd::UID_MISMATCH)
    );
    // 4 KiB of CQEs from 0x3800 run past the 16 KiB UMEM.
    assert_eq!(
        refused(dx.obj_create(
            &create_cq(uar, eqn, umem.umem_id(), 0x3800),
            create_cq_out::SIZE_BYTES
        )),
        (CmdStatus::BadParameter, devx_synd::UMEM_OUT_OF_RANGE)
    );
    // An object type general_obj_types does not list (0xc, the DEK).
    let mut g = cmd(
        Opcode::CreateGeneralObject,
        general_obj_in_cmd_hdr::SIZE_BYTES + 0x40,
    );
    general_obj_in_cmd_hdr::OBJ_TYPE.set(&mut g, 0xc);
    assert_eq!(
        refused(dx.obj_create(&g, 0x10)),
        (CmdStatus::BadParameter, devx_synd::GENERAL_OBJ_BAD_TYPE)
    );
    // The CQ keeps its UMEM; the context keeps its objects.
    assert_eq!(
        refused(umem.dereg()),
        (CmdStatus::BadResourceState, devx_synd::UMEM_IN_USE)
    );
    cq.destroy().unwrap();
    umem.dereg().unwrap();
    drop(other_uar);
    other.close().unwrap();
    // The context's UAR keeps it alive until it goes back.
    assert_eq!(
        refused(dx_close_probe(&ctx, dx.uid())),
        (CmdStatus::BadResourceState, devx_synd::UCTX_IN_USE)
    );
    let mut d = cmd(Opcode::DeallocUar, dealloc_uar_in::SIZE_BYTES);
    dealloc_uar_in::UAR.set(&mut d, u64::from(uar));
    dx.general_cmd(&d, 0x10).unwrap();
    dx.close().unwrap();
}

/// DESTROY_UCTX of `uid` sent by the driver itself (as a context's close
/// would), for a refusal the context survives.
fn dx_close_probe(ctx: &Context, uid: u16) -> verbs::Result<Vec<u8>> {
    let mut c = cmd(Opcode::DestroyUctx, destroy_uctx_in::SIZE_BYTES);
    destroy_uctx_in::UID.set(&mut c, u64::from(uid));
    ctx.hca().cmd().exec(&c, 0x10)
}

#[test]
fn a_connectx4_lx_offers_no_devx() {
    let (_fabric, ctx) = open(Profile::ConnectX4Lx);
    assert!(!devx::supported(&ctx));
    assert!(matches!(DevxCtx::open(&ctx, 0), Err(Error::Invalid(_))));
    // The raw command, too, is an unknown operation there.
    let c = cmd(Opcode::CreateUctx, mlx5_hw::ifc::create_uctx_in::SIZE_BYTES);
    assert_eq!(
        refused(ctx.hca().cmd().exec(&c, 0x10)).0,
        CmdStatus::BadOperation
    );
}

#[test]
fn short_inputs_are_refused_and_short_outputs_answered_truncated() {
    let (_fabric, ctx) = open(Profile::ConnectX5);
    let dx = DevxCtx::open(&ctx, 0).unwrap();
    // An input shorter than the command's layout: BAD_INPUT_LENGTH.
    let c = cmd(Opcode::CreateCq, create_cq_in::SIZE_BYTES);
    let (status, syndrome) = refused(dx.obj_create(&c[..0x20], create_cq_out::SIZE_BYTES));
    assert_eq!(status, CmdStatus::BadInputLength);
    assert_ne!(syndrome, 0);
    // An output shorter than the layout: the first bytes of the answer,
    // as firmware answers a driver built with the 0x800-byte capability
    // union of older mlx5_ifc.h (QUERY_HCA_CAP, general caps, current).
    let mut q = cmd(Opcode::QueryHcaCap, query_hca_cap_in::SIZE_BYTES);
    query_hca_cap_in::OP_MOD.set(&mut q, 1);
    let full = ctx
        .hca()
        .cmd()
        .exec(&q, query_hca_cap_out::SIZE_BYTES)
        .unwrap();
    let short = dx.general_cmd(&q, 0x810).unwrap();
    assert_eq!(short.len(), 0x810);
    assert_eq!(short[..], full[..0x810]);
    // A DevX query with only the status and syndrome room.
    let uar = dx.alloc_uar().unwrap();
    let buf = DmaBuffer::new(2 * 4096).unwrap();
    let mut umem = dx.umem_reg_buffer(&buf, 0, 2 * 4096, true).unwrap();
    let cq = dx
        .obj_create(
            &create_cq(
                uar.index(),
                ctx.hca().comp_eqns()[0],
                umem.umem_id(),
                0x1000,
            ),
            create_cq_out::SIZE_BYTES,
        )
        .unwrap();
    let mut q = cmd(Opcode::QueryCq, query_cq_in::SIZE_BYTES);
    query_cq_in::CQN.set(&mut q, create_cq_out::CQN.get(cq.create_out()));
    assert_eq!(cq.query(&q, 0x10).unwrap().len(), 0x10);
    cq.destroy().unwrap();
    umem.dereg().unwrap();
    drop(uar);
    dx.close().unwrap();
}

/// The uid relation through the driver: a DevX memory key may not live in
/// the driver's own PD (uid 0), nor in another context's; in its own
/// context's PD it may.
#[test]
fn devx_objects_name_only_their_own_contexts_objects() {
    use mlx5_hw::ifc::{alloc_pd_in, alloc_pd_out, create_mkey_in, create_mkey_out, mkc};
    let (_fabric, ctx) = open(Profile::ConnectX5);
    let dx = DevxCtx::open(&ctx, 0).unwrap();
    let other = DevxCtx::open(&ctx, 0).unwrap();
    let verbs_pd = ctx.alloc_pd().unwrap();
    let own_pd = dx
        .obj_create(
            &cmd(Opcode::AllocPd, alloc_pd_in::SIZE_BYTES),
            alloc_pd_out::SIZE_BYTES,
        )
        .unwrap();
    let other_pd = other
        .obj_create(
            &cmd(Opcode::AllocPd, alloc_pd_in::SIZE_BYTES),
            alloc_pd_out::SIZE_BYTES,
        )
        .unwrap();
    let key_in = |pd: u64| {
        let mut c = cmd(Opcode::CreateMkey, create_mkey_in::SIZE_BYTES);
        let x = &mut c[create_mkey_in::MEMORY_KEY_MKEY_ENTRY.off / 8..];
        mkc::PD.set(x, pd);
        mkc::LR.set(x, 1);
        mkc::QPN.set(x, 0xff_ffff);
        mkc::LEN.set(x, 0x1000);
        c
    };
    for pd in [
        u64::from(verbs_pd.pdn()),
        alloc_pd_out::PD.get(other_pd.create_out()),
    ] {
        assert_eq!(
            refused(dx.obj_create(&key_in(pd), create_mkey_out::SIZE_BYTES)),
            (CmdStatus::BadParameter, devx_synd::REF_UID_MISMATCH),
            "pd {pd}"
        );
    }
    let key = dx
        .obj_create(
            &key_in(alloc_pd_out::PD.get(own_pd.create_out())),
            create_mkey_out::SIZE_BYTES,
        )
        .unwrap();
    key.destroy().unwrap();
    own_pd.destroy().unwrap();
    other_pd.destroy().unwrap();
    other.close().unwrap();
    dx.close().unwrap();
}
