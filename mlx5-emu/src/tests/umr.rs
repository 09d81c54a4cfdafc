//! UMR WQEs by hand: a REG_UMR QP (as Linux's mlx5_ib) and an RC QP (as
//! mlx5dv) modify mkeys; the keys then carry (or refuse) RDMA.

use mlx5_hw::wqe::{
    MKC_ACCESS_MODE_KLMS, MKC_ACCESS_MODE_MTT, MKEY_MASK_FREE, MKEY_MASK_KEY, MKEY_MASK_LEN,
    MKEY_MASK_LR, MKEY_MASK_LW, MKEY_MASK_PAGE_SIZE, MKEY_MASK_PD, MKEY_MASK_RR, MKEY_MASK_RW,
    MKEY_MASK_START_ADDR, UMR_CHECK_FREE, UMR_CHECK_NOT_FREE, UMR_INLINE,
    UMR_TRANSLATION_OFFSET_EN,
};

use super::*;

const UMR: u8 = 0x25;
const ENABLE_MASK: u64 = MKEY_MASK_FREE
    | MKEY_MASK_KEY
    | MKEY_MASK_LEN
    | MKEY_MASK_START_ADDR
    | MKEY_MASK_PD
    | MKEY_MASK_PAGE_SIZE
    | MKEY_MASK_LR
    | MKEY_MASK_LW
    | MKEY_MASK_RR
    | MKEY_MASK_RW;

/// A free, UMR-enabled mkey (as Linux's mkey cache and mlx5dv make them)
/// with room for `entries` translation entries of `mode`.
fn free_mkey(n: &mut Node, mode: u8, entries: usize, umr_en: bool) -> u32 {
    let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES);
    let m = &mut c[0x10..0x50];
    mkc::ACCESS_MODE_1_0.set(m, mode.into());
    mkc::FREE.set(m, 1);
    mkc::UMR_EN.set(m, u64::from(umr_en));
    mkc::QPN.set(m, 0xff_ffff);
    mkc::MKEY_7_0.set(m, 0x10);
    mkc::PD.set(m, u64::from(n.pd));
    mkc::LOG_PAGE_SIZE.set(m, 12);
    let octs = if mode == MKC_ACCESS_MODE_MTT {
        entries.div_ceil(2)
    } else {
        entries
    };
    mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, octs as u64);
    let idx = be32(&n.d.ok(&c, 16), 8) & 0xff_ffff;
    idx << 8 | 0x10
}

/// The mkey context segment: key byte, PD, range, page size, access
/// (`acc`: a|rw|rr|lw|lr), free.
fn mkey_seg(n: &Node, key: u8, start: u64, len: u64, acc: u8, free: bool) -> [u8; 64] {
    let mut m = [0u8; 64];
    mkc::FREE.set(&mut m, u64::from(free));
    mkc::RW.set(&mut m, u64::from(acc >> 3 & 1));
    mkc::RR.set(&mut m, u64::from(acc >> 2 & 1));
    mkc::LW.set(&mut m, u64::from(acc >> 1 & 1));
    mkc::LR.set(&mut m, u64::from(acc & 1));
    mkc::QPN.set(&mut m, 0xff_ffff);
    mkc::MKEY_7_0.set(&mut m, u64::from(key));
    mkc::PD.set(&mut m, u64::from(n.pd));
    mkc::START_ADDR.set(&mut m, start);
    mkc::LEN.set(&mut m, len);
    mkc::LOG_PAGE_SIZE.set(&mut m, 12);
    m
}

/// UMR control segment + mkey segment + translation (inline bytes, or a
/// pointer data segment).
fn umr_segs(flags: u8, octs: u16, offset: u16, mask: u64, seg: &[u8; 64], xlt: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 48];
    s[0] = flags;
    s[4..6].copy_from_slice(&octs.to_be_bytes());
    s[6..8].copy_from_slice(&offset.to_be_bytes());
    s[8..16].copy_from_slice(&mask.to_be_bytes());
    s.extend_from_slice(seg);
    s.extend_from_slice(xlt);
    s.resize(s.len().next_multiple_of(16), 0);
    s
}

/// MTT entries as Linux writes them by UMR: each page present
/// (`MLX5_IB_MTT_PRESENT`), a 0 (padding) left absent.
fn mtt(iovas: &[u64]) -> Vec<u8> {
    iovas
        .iter()
        .map(|&i| {
            if i == 0 {
                0
            } else {
                i | mlx5_hw::wqe::MTT_PRESENT
            }
        })
        .flat_map(|i| i.to_be_bytes())
        .collect()
}

fn klm(bcount: u32, key: u32, va: u64) -> [u8; 16] {
    data_seg(bcount, key, va)
}

/// A REG_UMR QP on CQ 0, in RTS.
fn umr_qp(n: &mut Node) -> Q {
    let q = n.create_qp(0xc, 0, 0, None);
    let (g, qpn) = (n.gid, q.qpn);
    n.connect(&q, g, qpn, 5, false);
    q
}

/// (CQE opcode, syndrome) of the next completion on CQ 0.
fn outcome(n: &mut Node) -> (u8, u8) {
    let e = n.poll(0);
    (opcode(&e), if opcode(&e) == 13 { e[0x37] } else { 0 })
}

#[test]
fn umr_on_the_umr_qp_enables_an_mtt_key_that_then_carries_writes() {
    let (_f, mut a, mut b, mut qa, _qb) = rc_pair(5);
    let k = free_mkey(&mut b, MKC_ACCESS_MODE_MTT, 4, true);
    let mut qu = umr_qp(&mut b);
    // Two pages, out of order: VA page 0 -> data page 0x21, page 1 -> 0x20.
    let va = DATA_VA + 0x80_0000;
    let seg = mkey_seg(&b, 0x33, va, 0x2000, 0b01111, false);
    let xlt = mtt(&[DATA_IOVA + 0x2_1000, DATA_IOVA + 0x2_0000]);
    let segs = umr_segs(
        UMR_INLINE | UMR_CHECK_NOT_FREE,
        1,
        0,
        ENABLE_MASK,
        &seg,
        &xlt,
    );
    b.post_send(&mut qu, UMR, k, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0), "UMR completes");
    let rkey = k & !0xff | 0x33;
    // 64 bytes across the page boundary.
    let d = fill(&a, 0, 64, 7);
    let mut w = raddr_seg(va + 0x1000 - 32, rkey).to_vec();
    w.extend_from_slice(&data_seg(64, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(read(&b, 0x2_1fe0, 32), d[..32]);
    assert_eq!(read(&b, 0x2_0000, 32), d[32..]);
    // The old key byte no longer names it.
    let mut w = raddr_seg(va, k).to_vec();
    w.extend_from_slice(&data_seg(8, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    assert_eq!(a.poll(0)[0x37], 0x13, "remote access error");

    // Translation update at octoword 1 (the offset's unit: 16 bytes, MTT
    // entries 2 and 3, as Linux's mlx5r_umr_update_offset computes it),
    // the key grown to 4 pages, entries 0 and 1 kept: page 2 of the key
    // lands in data page 0x22, page 3 in 0x23.
    let mut qu2 = umr_qp(&mut b);
    let grown = mkey_seg(&b, 0x33, va, 0x4000, 0b01111, false);
    let segs = umr_segs(
        UMR_INLINE | UMR_CHECK_FREE | UMR_TRANSLATION_OFFSET_EN,
        1,
        1,
        MKEY_MASK_LEN,
        &grown,
        &mtt(&[DATA_IOVA + 0x2_2000, DATA_IOVA + 0x2_3000]),
    );
    b.post_send(&mut qu2, UMR, rkey, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0));
    // qa is in error after the refused WRITE: a fresh pair of QPs.
    let (mut qa3, qb3) = (a.create_qp(0, 0, 1, None), b.create_qp(0, 0, 1, None));
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&qa3, gb, qb3.qpn, 5, false);
    b.connect(&qb3, ga, qa3.qpn, 5, false);
    for (page, data_page, seed) in [
        (2u64, 0x2_2000usize, 9u8),
        (3, 0x2_3000, 10),
        (0, 0x2_1000, 11),
    ] {
        let mut w = raddr_seg(va + page * 0x1000, rkey).to_vec();
        let d = fill(&a, 0, 16, seed);
        w.extend_from_slice(&data_seg(16, a.lkey, DATA_VA));
        a.post_send(&mut qa3, 0x08, 0, &w, true);
        assert_eq!(opcode(&a.poll(0)), 0, "page {page}");
        assert_eq!(read(&b, data_page, 16), d, "page {page}");
    }
}

/// What, on which key, the WQE's segments, the (CQE opcode, syndrome).
type Case = (&'static str, u32, Vec<u8>, (u8, u8));

#[test]
fn refused_umrs_complete_in_error_and_leave_the_key_alone() {
    let (_f, _a, mut b) = pair();
    b.create_cq();
    b.create_cq();
    let k = free_mkey(&mut b, MKC_ACCESS_MODE_MTT, 2, true);
    let no_umr = free_mkey(&mut b, MKC_ACCESS_MODE_MTT, 2, false);
    let seg = mkey_seg(&b, 0x10, DATA_VA, 0x1000, 0b00011, false);
    let one = mtt(&[DATA_IOVA, 0]);
    let cases: [Case; 6] = [
        (
            "not umr_en",
            no_umr,
            umr_segs(UMR_INLINE, 1, 0, ENABLE_MASK, &seg, &one),
            (13, 0x04),
        ),
        (
            "no such mkey",
            0x00ff_ff10,
            umr_segs(UMR_INLINE, 1, 0, ENABLE_MASK, &seg, &one),
            (13, 0x04),
        ),
        (
            "check not free on a free key",
            k,
            umr_segs(UMR_INLINE | UMR_CHECK_FREE, 1, 0, ENABLE_MASK, &seg, &one),
            (13, 0x04),
        ),
        (
            "translation past the key's entries",
            k,
            umr_segs(
                UMR_INLINE | UMR_TRANSLATION_OFFSET_EN,
                1,
                // The key's 2 entries have room for 8 (64 bytes): 7 + 2 is past it.
                7,
                ENABLE_MASK,
                &seg,
                &one,
            ),
            (13, 0x02),
        ),
        (
            "inline translation longer than the WQE",
            k,
            umr_segs(UMR_INLINE, 4, 0, ENABLE_MASK, &seg, &one),
            (13, 0x02),
        ),
        (
            "page size below 4 KiB",
            k,
            {
                let mut s = seg;
                mkc::LOG_PAGE_SIZE.set(&mut s, 11);
                umr_segs(UMR_INLINE, 1, 0, ENABLE_MASK, &s, &one)
            },
            (13, 0x02),
        ),
    ];
    for (what, key, segs, want) in cases {
        let mut q = umr_qp(&mut b);
        b.post_send(&mut q, UMR, key, &segs, true);
        assert_eq!(outcome(&mut b), want, "{what}");
    }
    // None of them changed k: still free, so CHECK_NOT_FREE (fail if not free) passes.
    let mut q = umr_qp(&mut b);
    let segs = umr_segs(
        UMR_INLINE | UMR_CHECK_NOT_FREE,
        1,
        0,
        ENABLE_MASK,
        &seg,
        &one,
    );
    b.post_send(&mut q, UMR, k, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0));
    assert_eq!(b.d.f.model().stats().error_cqes, 6);
}

#[test]
fn umr_on_an_rc_qp_builds_an_indirect_key_and_invalidates_it() {
    let (_f, mut a, mut b, mut qa, mut qb) = rc_pair(5);
    // b builds a KLM key over two pieces of its buffer, the list pointed
    // to in memory (at data offset 0x9_0000), posted on its RC QP.
    let ind = free_mkey(&mut b, MKC_ACCESS_MODE_KLMS, 4, true);
    let mut list = klm(0x100, b.lkey, DATA_VA + 0x3_0000).to_vec();
    list.extend_from_slice(&klm(0x100, b.lkey, DATA_VA + 0x5_0000));
    b.data.write(0x9_0000, &list).unwrap();
    let va = 0x1_0000_0000u64;
    let seg = mkey_seg(&b, 0x10, va, 0x200, 0b01111, false);
    let ptr = data_seg(32, b.lkey, DATA_VA + 0x9_0000);
    let segs = umr_segs(UMR_CHECK_NOT_FREE, 2, 0, ENABLE_MASK, &seg, &ptr);
    b.post_send(&mut qb, UMR, ind, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0), "UMR with a KLM pointer");
    // a writes 64 bytes across the two entries.
    let d = fill(&a, 0, 64, 3);
    let mut w = raddr_seg(va + 0xe0, ind).to_vec();
    w.extend_from_slice(&data_seg(64, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(read(&b, 0x3_00e0, 32), d[..32]);
    assert_eq!(read(&b, 0x5_0000, 32), d[32..]);
    // And reads back through it.
    let mut w = raddr_seg(va + 0xe0, ind).to_vec();
    w.extend_from_slice(&data_seg(64, a.lkey, DATA_VA + 0x1000));
    a.post_send(&mut qa, 0x10, 0, &w, true);
    assert_eq!(opcode(&a.poll(0)), 0);
    assert_eq!(read(&a, 0x1000, 64), d);
    // Local invalidate (UMR setting free): the next access fails.
    let mut free = [0u8; 64];
    mkc::FREE.set(&mut free, 1);
    let segs = umr_segs(0, 0, 0, MKEY_MASK_FREE, &free, &[]);
    b.post_send(&mut qb, UMR, ind, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0), "local invalidate");
    let mut w = raddr_seg(va, ind).to_vec();
    w.extend_from_slice(&data_seg(8, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    assert_eq!(
        a.poll(0)[0x37],
        0x13,
        "remote access error after invalidation"
    );
}

#[test]
fn umr_on_an_rc_qp_is_refused_for_another_pds_key_and_past_the_klm_list() {
    let (_f, mut a, mut b, mut qa, mut qb) = rc_pair(5);
    let ind = free_mkey(&mut b, MKC_ACCESS_MODE_KLMS, 1, true);
    let pd2 = be32(&b.d.ok(&cmd_in(0x800, 0, 16), 16), 8) & 0xff_ffff;
    let other = b.mkey(pd2, 0x7f, 0, 4096, 0x44);
    let va = 0x1_0000_0000u64;
    let seg = mkey_seg(&b, 0x10, va, 0x200, 0b01111, false);
    let one = klm(0x100, b.lkey, DATA_VA);
    // The KLM list covers 0x100 of the key's 0x200 bytes: past it is out
    // of bounds for a remote access.
    let segs = umr_segs(
        UMR_INLINE | UMR_CHECK_NOT_FREE,
        1,
        0,
        ENABLE_MASK,
        &seg,
        &one,
    );
    b.post_send(&mut qb, UMR, ind, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0));
    let mut w = raddr_seg(va + 0xf8, ind).to_vec();
    w.extend_from_slice(&data_seg(16, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    assert_eq!(a.poll(0)[0x37], 0x13, "remote access error past the list");
    // A key of another PD, on an RC QP of this PD: local protection
    // error (on a fresh QP: b's went to error with the NAK above).
    let mut q2 = b.create_qp(0, 0, 1, None);
    let g = b.gid;
    b.connect(&q2, g, qa.qpn, 5, false);
    let segs = umr_segs(0, 0, 0, MKEY_MASK_FREE, &[0; 64], &[]);
    b.post_send(&mut q2, UMR, other, &segs, true);
    assert_eq!(outcome(&mut b), (13, 0x04));
}

#[path = "linux_guest.rs"]
mod linux_guest;

#[path = "umr_layouts.rs"]
mod umr_layouts;

#[path = "umr_libmlx5.rs"]
mod umr_libmlx5;
