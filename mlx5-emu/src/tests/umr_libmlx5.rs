//! The UMR WQEs rdma-core's libmlx5 posts, laid out as its
//! `providers/mlx5/qp.c` lays them out, on keys made as
//! `mlx5dv_create_mkey` makes them: mlx5dv's mkey configuration
//! (`wr_mr_list` / `wr_mr_interleaved` / `wr_mkey_configure`: inline, the
//! free, key, access and length bits of the mask, no QP, key byte 0, the
//! layout padded to 64 bytes), a SEND through the zero-based key, and
//! LOCAL_INV (`set_bind_wr` with no length, as for a type-2 window:
//! translation offset, inline, CHECK_QPN; free, key and QPN in the mask),
//! which rdma-core's `test_mlx5_mkey` posts on the mlx5dv key itself.

use mlx5_hw::ifc::{wqe_umr_repeat_block_seg as rb, wqe_umr_repeat_ent_seg as re};
use mlx5_hw::wqe::{MKEY_MASK_A, MKEY_MASK_QPN, UMR_CHECK_QPN, UMR_REPEAT_BLOCK_OP};

use super::*;

/// An indirect key as `mlx5dv_create_mkey` makes it: KLM, free, `umr_en`,
/// local read, bound to no QP, key byte 0, room for `entries` rounded up
/// to 4.
fn dv_mkey(n: &mut Node, entries: usize) -> u32 {
    let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES);
    let m = &mut c[0x10..0x50];
    mkc::ACCESS_MODE_1_0.set(m, MKC_ACCESS_MODE_KLMS.into());
    mkc::FREE.set(m, 1);
    mkc::UMR_EN.set(m, 1);
    mkc::LR.set(m, 1);
    mkc::QPN.set(m, 0xff_ffff);
    mkc::PD.set(m, u64::from(n.pd));
    mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, entries.next_multiple_of(4) as u64);
    (be32(&n.d.ok(&c, 16), 8) & 0xff_ffff) << 8
}

/// libmlx5's configuration of an mlx5dv key: local write, `len` bytes,
/// the layout `xlt` (a data-segment list or a repeat block) inline.
fn dv_configure(len: u64, xlt: &[u8]) -> Vec<u8> {
    let mask = MKEY_MASK_FREE
        | MKEY_MASK_KEY
        | MKEY_MASK_LW
        | MKEY_MASK_RR
        | MKEY_MASK_RW
        | MKEY_MASK_A
        | MKEY_MASK_LEN;
    let mut seg = [0u8; 64];
    mkc::QPN.set(&mut seg, 0xff_ffff);
    mkc::LW.set(&mut seg, 1);
    mkc::LEN.set(&mut seg, len);
    let mut x = xlt.to_vec();
    x.resize(xlt.len().next_multiple_of(64), 0);
    umr_segs(UMR_INLINE, (x.len() / 16) as u16, 0, mask, &seg, &x)
}

/// libmlx5's LOCAL_INV (`IBV_WR_LOCAL_INV`: a UMR WQE, the key in the
/// control segment's immediate).
fn local_inv() -> Vec<u8> {
    let mut seg = [0u8; 64];
    mkc::QPN.set(&mut seg, 0xff_ffff);
    mkc::FREE.set(&mut seg, 1);
    let flags = UMR_TRANSLATION_OFFSET_EN | UMR_INLINE | UMR_CHECK_QPN;
    let mask = MKEY_MASK_FREE | MKEY_MASK_KEY | MKEY_MASK_QPN;
    umr_segs(flags, 0, 0, mask, &seg, &[])
}

/// The repeat block `umr_strided_seg_create` writes: `(bytes, skip, key,
/// va)` per entry, the stride their sum.
fn interleaved(count: u32, ents: &[(u16, u16, u32, u64)]) -> Vec<u8> {
    let mut x = vec![0u8; rb::SIZE_BYTES];
    let sum: u64 = ents.iter().map(|e| u64::from(e.0)).sum();
    rb::BYTE_COUNT.set(&mut x, sum);
    rb::OP.set(&mut x, u64::from(UMR_REPEAT_BLOCK_OP));
    rb::REPEAT_COUNT.set(&mut x, u64::from(count));
    rb::NUM_ENT.set(&mut x, ents.len() as u64);
    for &(bytes, skip, key, va) in ents {
        let mut e = [0u8; re::SIZE_BYTES];
        re::STRIDE.set(&mut e, u64::from(bytes + skip));
        re::BYTE_COUNT.set(&mut e, u64::from(bytes));
        re::MEMKEY.set(&mut e, u64::from(key));
        re::VA.set(&mut e, va);
        x.extend_from_slice(&e);
    }
    x
}

/// `test_mlx5_mkey`'s flow on a's key configured by `xlt`: a SEND of 16
/// bytes at 0 through it lands a's bytes 0..8 and 64..72 in b; LOCAL_INV
/// of the key completes; a SEND through it then fails LOCAL_PROT.
fn send_then_invalidate(xlt_len: u64, xlt: impl Fn(u32) -> Vec<u8>) {
    let (_f, mut a, mut b, mut qa, mut qb) = rc_pair(5);
    let k = dv_mkey(&mut a, 3);
    let lkey = a.lkey;
    a.post_send(&mut qa, UMR, k, &dv_configure(xlt_len, &xlt(lkey)), true);
    assert_eq!(outcome(&mut a), (0, 0), "mkey configuration");
    let d = fill(&a, 0, 128, 5);
    b.post_recv(&mut qb, DATA_VA + 0x1000, 64);
    a.post_send(&mut qa, 0x0a, 0, &data_seg(16, k, 0), true);
    assert_eq!(outcome(&mut a), (0, 0), "SEND through the key");
    assert_eq!(opcode(&b.poll(1)), 2, "RESP_SEND");
    let want = [&d[..8], &d[64..72]].concat();
    assert_eq!(read(&b, 0x1000, 16), want);
    // The key is bound to no QP: CHECK_QPN holds on any QP of its PD.
    a.post_send(&mut qa, UMR, k, &local_inv(), true);
    assert_eq!(outcome(&mut a), (0, 0), "LOCAL_INV of the mlx5dv key");
    a.post_send(&mut qa, 0x0a, 0, &data_seg(16, k, 0), true);
    assert_eq!(outcome(&mut a), (13, 0x04), "SEND through the freed key");
}

#[test]
fn mr_list_as_libmlx5_posts_it_sends_and_is_locally_invalidated() {
    send_then_invalidate(16, |lkey| {
        [data_seg(8, lkey, DATA_VA), data_seg(8, lkey, DATA_VA + 64)].concat()
    });
}

#[test]
fn mr_interleaved_as_libmlx5_posts_it_sends_and_is_locally_invalidated() {
    // Two entries of 8 bytes, 2 skipped, 3 repetitions (48 bytes).
    send_then_invalidate(48, |lkey| {
        interleaved(3, &[(8, 2, lkey, DATA_VA), (8, 2, lkey, DATA_VA + 64)])
    });
}
