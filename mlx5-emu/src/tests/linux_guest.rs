//! What Linux 6.12's mlx5_ib and libmlx5 sent the model in the QEMU guest
//! (issue 17, part 4) on the way to `ibv_rc_pingpong`, each as a test:
//! the UMR QP it creates without a PD, the translation it points at
//! through its UMR PD's DMA key and pads to 64 bytes, and a user QP whose
//! `page_offset` counts 1/64ths of a page larger than 4 KiB.

use mlx5_hw::init::{page_offset_bytes, page_offset_field};
use mlx5_hw::wqe::MKC_ACCESS_MODE_PA;

use super::*;

/// A physical-address key of `pd` with local read and write over all of
/// IOVA space: what `ib_alloc_pd` gets from mlx5_ib's `get_dma_mr` as the
/// PD's `local_dma_lkey` (mlx5 has no reserved one to offer).
fn dma_mkey(n: &mut Node, pd: u32) -> u32 {
    let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES);
    let m = &mut c[0x10..0x50];
    mkc::ACCESS_MODE_1_0.set(m, MKC_ACCESS_MODE_PA.into());
    mkc::LW.set(m, 1);
    mkc::LR.set(m, 1);
    mkc::LENGTH64.set(m, 1);
    mkc::QPN.set(m, 0xff_ffff);
    mkc::MKEY_7_0.set(m, 0x5a);
    mkc::PD.set(m, u64::from(pd));
    let idx = be32(&n.d.ok(&c, 16), 8) & 0xff_ffff;
    idx << 8 | 0x5a
}

#[test]
fn a_umr_qp_needs_no_pd_and_an_rc_qp_does() {
    let (_f, _a, mut b) = pair();
    b.create_cq();
    // An RC QP with PD 0 (never allocated): bad resource, QP_BAD_PD.
    let mut c = cmd_in(0x500, 0, create_qp_in::SIZE_BYTES + 8);
    qpc::ST.set(&mut c[create_qp_in::QPC.off / 8..], 0);
    let o = b.d.exec(&c, 16);
    assert_eq!(
        (o[0], be32(&o, 4)),
        (0x05, crate::fw::synd::QP_BAD_PD),
        "RC QP without a PD"
    );
    // Linux's create_kernel_qp for MLX5_IB_QPT_REG_UMR leaves pd 0 (and
    // sets latency_sensitive): taken.
    let pd = b.pd;
    b.pd = 0;
    let q = b.create_qp(0xc, 0, 0, None);
    b.pd = pd;
    let (g, qpn) = (b.gid, q.qpn);
    b.connect(&q, g, qpn, 5, false);
}

#[test]
fn linux_user_mr_registration_through_the_umr_qp() {
    let (_f, mut a, mut b, mut qa, _qb) = rc_pair(5);
    // The mkey cache's key: 4 MTT entries (2 octowords), free, umr_en.
    let k = free_mkey(&mut b, MKC_ACCESS_MODE_MTT, 4, true);
    // The UMR QP, PD-less, and the UMR PD with its DMA key.
    let pd = b.pd;
    b.pd = 0;
    let mut qu = b.create_qp(0xc, 0, 0, None);
    b.pd = pd;
    let (g, qpn) = (b.gid, qu.qpn);
    b.connect(&qu, g, qpn, 5, false);
    let umr_pd = be32(&b.d.ok(&cmd_in(0x800, 0, 16), 16), 8) & 0xff_ffff;
    let dma = dma_mkey(&mut b, umr_pd);
    // Two pages, padded to 64 bytes (8 entries) as
    // mlx5r_umr_update_mr_pas pads them (MLX5_UMR_FLEX_ALIGNMENT), in
    // memory at b's data offset 0x8_0000, pointed at through the DMA key.
    let pages = [DATA_IOVA + 0x2_1000, DATA_IOVA + 0x2_0000, 0, 0, 0, 0, 0, 0];
    b.data.write(0x8_0000, &mtt(&pages)).unwrap();
    let va = DATA_VA + 0x80_0000;
    let seg = mkey_seg(&b, 0x33, va, 0x2000, 0b01111, false);
    let ptr = data_seg(64, dma, DATA_IOVA + 0x8_0000);
    let segs = umr_segs(UMR_CHECK_NOT_FREE, 4, 0, ENABLE_MASK, &seg, &ptr);
    b.post_send(&mut qu, UMR, k, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0), "UMR completes");
    // The key now carries a write across its page boundary.
    let rkey = k & !0xff | 0x33;
    let d = fill(&a, 0, 64, 9);
    let mut w = raddr_seg(va + 0x1000 - 32, rkey).to_vec();
    w.extend_from_slice(&data_seg(64, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(read(&b, 0x2_1fe0, 32), d[..32]);
    assert_eq!(read(&b, 0x2_0000, 32), d[32..]);
    // Past the 64-byte unit the key's room ends: 8 entries at offset 1.
    let segs = umr_segs(
        UMR_TRANSLATION_OFFSET_EN,
        4,
        1,
        0,
        &[0; 64],
        &data_seg(64, dma, DATA_IOVA + 0x8_0000),
    );
    b.post_send(&mut qu, UMR, rkey, &segs, true);
    assert_eq!(outcome(&mut b), (13, 0x02), "translation past the room");
}

#[test]
fn page_offset_counts_64ths_of_the_queue_page() {
    assert_eq!(page_offset_bytes(1, 12), 64);
    assert_eq!(page_offset_bytes(28, 17), 28 * 2048);
    assert_eq!(page_offset_field(0xe000, 17), 28);
    assert_eq!(page_offset_field(0x1_0000 + 0x80, 12), 2);
    let (_f, mut a, mut b) = pair();
    for n in [&mut a, &mut b] {
        n.create_cq();
        n.create_cq();
    }
    let mut qa = a.create_qp(0, 0, 1, None);
    // b's QP 0x2000 into a 32 KiB page (libmlx5's buffer in a contiguous
    // user region, Linux picking the largest page that fits): page_offset
    // 16 (0x2000 / (32 KiB / 64)); only the queue itself is mapped.
    let (page, at) = (0x6800_0000u64, 0x2000u64);
    let size = (RQ_STRIDE << LOG_RQ) + (64 << LOG_SQ);
    let buf = DmaBuffer::new(size.next_multiple_of(4096)).unwrap();
    b.d.f.dma_map(Iova(page + at), &buf).unwrap();
    let dbr = b.alloc_dbr();
    let mut c = cmd_in(0x500, 0, create_qp_in::SIZE_BYTES + 8);
    let x = &mut c[create_qp_in::QPC.off / 8..];
    qpc::ST.set(x, 0);
    qpc::PD.set(x, u64::from(b.pd));
    qpc::LOG_PAGE_SIZE.set(x, 3);
    qpc::PAGE_OFFSET.set(x, page_offset_field(at, 15));
    qpc::LOG_RQ_SIZE.set(x, u64::from(LOG_RQ));
    qpc::LOG_RQ_STRIDE.set(x, (RQ_STRIDE.trailing_zeros() - 4) as u64);
    qpc::LOG_SQ_SIZE.set(x, u64::from(LOG_SQ));
    qpc::UAR_PAGE.set(x, u64::from(b.uar));
    qpc::CQN_SND.set(x, u64::from(b.cq[0].0));
    qpc::CQN_RCV.set(x, u64::from(b.cq[1].0));
    qpc::DBR_ADDR.set(x, DBR_IOVA + dbr as u64);
    assert_eq!(qpc::PAGE_OFFSET.get(x), 16);
    let pas = create_qp_in::SIZE_BYTES;
    c[pas..pas + 8].copy_from_slice(&page.to_be_bytes());
    let qpn = be32(&b.d.ok(&c, 16), 8) & 0xff_ffff;
    let mut qb = Q {
        qpn,
        buf,
        dbr,
        sq_pi: 0,
        rq_pi: 0,
        log_sq: LOG_SQ,
    };
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&qa, gb, qb.qpn, 5, false);
    b.connect(&qb, ga, qa.qpn, 5, false);
    // A SEND into b's receive queue, then one back from b's send queue.
    let msg = fill(&a, 0, 100, 3);
    b.post_recv(&mut qb, DATA_VA + 0x1000, 128);
    a.post_send(&mut qa, 0x0a, 0, &data_seg(100, a.lkey, DATA_VA), true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(opcode(&b.poll(1)), 2, "RESP_SEND into the offset RQ");
    assert_eq!(read(&b, 0x1000, 100), msg);
    a.post_recv(&mut qa, DATA_VA + 0x3000, 128);
    b.post_send(
        &mut qb,
        0x0a,
        0,
        &data_seg(100, b.lkey, DATA_VA + 0x1000),
        true,
    );
    assert_eq!(opcode(&b.poll(0)), 0, "REQ from the offset SQ");
    assert_eq!(opcode(&a.poll(1)), 2);
    assert_eq!(read(&a, 0x3000, 100), msg);
    // QUERY_QP gives the offset back in the same units.
    let mut q = cmd_in(0x50b, 0, 16);
    q[8..12].copy_from_slice(&qpn.to_be_bytes());
    let o = b.d.ok(&q, query_qp_out_len());
    let ctx = &o[mlx5_hw::ifc::query_qp_out::QPC.off / 8..];
    assert_eq!(qpc::PAGE_OFFSET.get(ctx), 16);
    assert_eq!(qpc::LOG_PAGE_SIZE.get(ctx), 3);
}

fn query_qp_out_len() -> usize {
    mlx5_hw::ifc::query_qp_out::SIZE_BYTES
}
