//! Indirect keys beyond KLM lists, built by UMR on the REG_UMR QP: KSM
//! (fixed-size entries), the repeat block (strided / interleaved, as
//! rdma-core's `mlx5dv_wr_mr_interleaved` builds it), and chains of
//! indirect keys as deep as `max_indirection` allows.

use mlx5_hw::ifc::{
    cmd_hca_cap, query_mkey_in, query_mkey_out, wqe_umr_repeat_block_seg as rb,
    wqe_umr_repeat_ent_seg as re,
};
use mlx5_hw::wqe::{MKC_ACCESS_MODE_KSM, UMR_REPEAT_BLOCK_OP};

use super::*;

/// Makes `key` (free, from [`free_mkey`]) a live key over `[va, va + len)`
/// with the translation `xlt` inline; the (CQE opcode, syndrome).
fn enable(b: &mut Node, q: &mut Q, key: u32, va: u64, len: u64, xlt: &[u8]) -> (u8, u8) {
    let seg = mkey_seg(b, 0x10, va, len, 0b01111, false);
    let octs = xlt.len().div_ceil(16) as u16;
    let segs = umr_segs(
        UMR_INLINE | UMR_CHECK_NOT_FREE,
        octs,
        0,
        ENABLE_MASK,
        &seg,
        xlt,
    );
    b.post_send(q, UMR, key, &segs, true);
    outcome(b)
}

/// a writes `len` bytes (seed `seed`) to `raddr` through `rkey` on a fresh
/// RC pair; the data written, and the CQE syndrome (0: success).
fn write_through(
    a: &mut Node,
    b: &mut Node,
    raddr: u64,
    rkey: u32,
    len: u32,
    seed: u8,
) -> (Vec<u8>, u8) {
    let (mut qa, qb) = (a.create_qp(0, 0, 1, None), b.create_qp(0, 0, 1, None));
    let (ga, gb) = (a.gid, b.gid);
    a.connect(&qa, gb, qb.qpn, 5, false);
    b.connect(&qb, ga, qa.qpn, 5, false);
    let d = fill(a, 0, len as usize, seed);
    let mut w = raddr_seg(raddr, rkey).to_vec();
    w.extend_from_slice(&data_seg(len, a.lkey, DATA_VA));
    a.post_send(&mut qa, 0x08, 0, &w, true);
    let e = a.poll(0);
    (d, if opcode(&e) == 13 { e[0x37] } else { 0 })
}

fn ksm(key: u32, va: u64) -> [u8; 16] {
    let mut e = [0u8; 16];
    e[4..8].copy_from_slice(&key.to_be_bytes());
    e[8..].copy_from_slice(&va.to_be_bytes());
    e
}

#[test]
fn ksm_key_maps_fixed_size_entries() {
    let (_f, mut a, mut b, _qa, _qb) = rc_pair(5);
    let k = free_mkey(&mut b, MKC_ACCESS_MODE_KSM, 4, true);
    let mut q = umr_qp(&mut b);
    // Two 4 KiB entries (log_page_size 12): key page 0 -> data 0x3_0000,
    // page 1 -> data 0x5_0000.
    let mut xlt = ksm(b.lkey, DATA_VA + 0x3_0000).to_vec();
    xlt.extend_from_slice(&ksm(b.lkey, DATA_VA + 0x5_0000));
    let va = 0x2_0000_0000u64;
    assert_eq!(enable(&mut b, &mut q, k, va, 0x2000, &xlt), (0, 0));
    let rkey = k & !0xff | 0x10;
    let (d, s) = write_through(&mut a, &mut b, va + 0x1000 - 32, rkey, 64, 4);
    assert_eq!(s, 0, "across the entry boundary");
    assert_eq!(read(&b, 0x3_0fe0, 32), d[..32]);
    assert_eq!(read(&b, 0x5_0000, 32), d[32..]);
    // Entry 1 rewritten alone (translation offset 1): page 1 -> 0x6_0000.
    let segs = umr_segs(
        UMR_INLINE | UMR_CHECK_FREE | UMR_TRANSLATION_OFFSET_EN,
        1,
        1,
        0,
        &[0; 64],
        &ksm(b.lkey, DATA_VA + 0x6_0000),
    );
    b.post_send(&mut q, UMR, rkey, &segs, true);
    assert_eq!(outcome(&mut b), (0, 0));
    let (d, s) = write_through(&mut a, &mut b, va + 0x1010, rkey, 16, 5);
    assert_eq!((s, read(&b, 0x6_0010, 16)), (0, d));
    // Past the key (and its entries): remote access error.
    assert_eq!(
        write_through(&mut a, &mut b, va + 0x1ff8, rkey, 16, 6).1,
        0x13
    );
    // An entry past the key's room (4): refused, the key unchanged.
    let segs = umr_segs(
        UMR_INLINE | UMR_TRANSLATION_OFFSET_EN,
        1,
        4,
        0,
        &[0; 64],
        &ksm(b.lkey, DATA_VA),
    );
    let mut q2 = umr_qp(&mut b);
    b.post_send(&mut q2, UMR, rkey, &segs, true);
    assert_eq!(outcome(&mut b), (13, 0x02));
    // QUERY_MKEY: the room it was made with, in octowords (one entry each).
    let mut c = cmd_in(0x201, 0, query_mkey_in::SIZE_BYTES);
    query_mkey_in::MKEY_INDEX.set(&mut c, u64::from(k >> 8));
    let out = b.d.ok(&c, query_mkey_out::SIZE_BYTES);
    let m = &out[query_mkey_out::MEMORY_KEY_MKEY_ENTRY.off / 8..];
    assert_eq!(mkc::TRANSLATIONS_OCTWORD_SIZE.get(m), 4);
    assert_eq!(mkc::ACCESS_MODE_1_0.get(m), u64::from(MKC_ACCESS_MODE_KSM));
}

/// A repeat block: `count` repetitions of the entries (stride, bytes,
/// key, va); `block` overrides the header's byte count.
fn repeat(count: u32, ents: &[(u16, u16, u32, u64)], block: Option<u32>) -> Vec<u8> {
    let mut h = [0u8; 16];
    let sum: u32 = ents.iter().map(|e| u32::from(e.1)).sum();
    rb::BYTE_COUNT.set(&mut h, u64::from(block.unwrap_or(sum)));
    rb::OP.set(&mut h, u64::from(UMR_REPEAT_BLOCK_OP));
    rb::REPEAT_COUNT.set(&mut h, u64::from(count));
    rb::NUM_ENT.set(&mut h, ents.len() as u64);
    let mut v = h.to_vec();
    for &(stride, bc, key, va) in ents {
        let mut e = [0u8; 16];
        re::STRIDE.set(&mut e, u64::from(stride));
        re::BYTE_COUNT.set(&mut e, u64::from(bc));
        re::MEMKEY.set(&mut e, u64::from(key));
        re::VA.set(&mut e, va);
        v.extend_from_slice(&e);
    }
    v
}

#[test]
fn repeat_block_interleaves_two_buffers() {
    let (_f, mut a, mut b, _qa, _qb) = rc_pair(5);
    let k = free_mkey(&mut b, MKC_ACCESS_MODE_KLMS, 4, true);
    let mut q = umr_qp(&mut b);
    // Each 24-byte repetition: 16 bytes of data 0x3_0000 (stride 64),
    // then 8 bytes of data 0x5_0000 (stride 32); 4 repetitions, 96 bytes.
    let xlt = repeat(
        4,
        &[
            (64, 16, b.lkey, DATA_VA + 0x3_0000),
            (32, 8, b.lkey, DATA_VA + 0x5_0000),
        ],
        None,
    );
    assert_eq!(enable(&mut b, &mut q, k, 0, 96, &xlt), (0, 0));
    let rkey = k & !0xff | 0x10;
    let (d, s) = write_through(&mut a, &mut b, 0, rkey, 96, 7);
    assert_eq!(s, 0);
    for r in 0..4 {
        let piece = &d[r * 24..r * 24 + 24];
        assert_eq!(
            read(&b, 0x3_0000 + r * 64, 16),
            piece[..16],
            "repetition {r}"
        );
        assert_eq!(
            read(&b, 0x5_0000 + r * 32, 8),
            piece[16..],
            "repetition {r}"
        );
    }
    // Mid-way into a repetition: bytes 20..44 are entry 1 of repetition 0
    // (from byte 4), all of repetition 1.
    let (d, s) = write_through(&mut a, &mut b, 20, rkey, 24, 8);
    assert_eq!(s, 0);
    assert_eq!(read(&b, 0x5_0004, 4), d[..4]);
    assert_eq!(read(&b, 0x3_0040, 16), d[4..20]);
    assert_eq!(read(&b, 0x5_0020, 4), d[20..]);
    // Past the last repetition: remote access error.
    assert_eq!(write_through(&mut a, &mut b, 90, rkey, 8, 9).1, 0x13);

    // Refused: the header's byte count is not the entries' sum; more
    // entries than the key has room for; no repetition.
    let k2 = free_mkey(&mut b, MKC_ACCESS_MODE_KLMS, 1, true);
    let bad = [
        (k, repeat(2, &[(16, 16, b.lkey, DATA_VA)], Some(12))),
        (
            k2,
            repeat(
                2,
                &[(16, 8, b.lkey, DATA_VA), (16, 8, b.lkey, DATA_VA)],
                None,
            ),
        ),
        (k2, repeat(0, &[(16, 16, b.lkey, DATA_VA)], None)),
    ];
    for (i, (key, xlt)) in bad.into_iter().enumerate() {
        let mut q = umr_qp(&mut b);
        let seg = mkey_seg(&b, 0x10, 0, 32, 0b01111, false);
        let segs = umr_segs(
            UMR_INLINE,
            xlt.len().div_ceil(16) as u16,
            0,
            ENABLE_MASK,
            &seg,
            &xlt,
        );
        b.post_send(&mut q, UMR, key | 0x10, &segs, true);
        assert_eq!(outcome(&mut b), (13, 0x02), "bad repeat block {i}");
    }
}

#[test]
fn indirect_chains_resolve_to_max_indirection_and_no_deeper() {
    let (_f, mut a, mut b, _qa, _qb) = rc_pair(5);
    let caps = crate::profile::Profile::default().caps();
    let depth = caps.get(
        crate::profile::cap_type::GENERAL,
        cmd_hca_cap::MAX_INDIRECTION,
    ) as u32;
    assert_eq!(depth, 4, "the ConnectX-4 trace's max_indirection");
    let mut q = umr_qp(&mut b);
    // keys[0] -> b's MTT key; keys[i] -> keys[i - 1]: keys[i] is a chain
    // of i + 1 indirect keys.
    let mut keys: Vec<u32> = Vec::new();
    for i in 0..=depth {
        let k = free_mkey(&mut b, MKC_ACCESS_MODE_KLMS, 1, true);
        let (inner, va) = match keys.last() {
            Some(&p) => (p, 0),
            None => (b.lkey, DATA_VA + 0x7_0000),
        };
        let xlt = klm(0x1000, inner, va);
        assert_eq!(
            enable(&mut b, &mut q, k, 0, 0x1000, &xlt),
            (0, 0),
            "key {i}"
        );
        keys.push(k & !0xff | 0x10);
    }
    for (i, &k) in keys.iter().enumerate() {
        let (d, s) = write_through(&mut a, &mut b, 0x100, k, 16, i as u8);
        if i < depth as usize {
            assert_eq!((s, read(&b, 0x7_0100, 16)), (0, d), "a chain of {}", i + 1);
        } else {
            assert_eq!(s, 0x13, "a chain of {} is too deep", i + 1);
        }
    }
}

#[test]
fn create_mkey_of_a_ksm_key_takes_its_entries_and_checks_the_entity_size() {
    let (_f, mut a, mut b, _qa, _qb) = rc_pair(5);
    // Two 8 KiB entries inline: key bytes 0x2000.. -> data 0x4_0000.
    let ksm_key = |b: &mut Node, log: u64| {
        let mut c = cmd_in(0x200, 0, create_mkey_in::SIZE_BYTES + 32);
        create_mkey_in::TRANSLATIONS_OCTWORD_ACTUAL_SIZE.set(&mut c, 2);
        let m = &mut c[0x10..0x50];
        mkc::ACCESS_MODE_1_0.set(m, u64::from(MKC_ACCESS_MODE_KSM & 3));
        mkc::LR.set(m, 1);
        mkc::LW.set(m, 1);
        mkc::RW.set(m, 1);
        mkc::QPN.set(m, 0xff_ffff);
        mkc::MKEY_7_0.set(m, 0x22);
        mkc::PD.set(m, u64::from(b.pd));
        mkc::LEN.set(m, 0x4000);
        mkc::LOG_PAGE_SIZE.set(m, log);
        mkc::TRANSLATIONS_OCTWORD_SIZE.set(m, 2);
        let at = create_mkey_in::SIZE_BYTES;
        c[at..at + 16].copy_from_slice(&ksm(b.lkey, DATA_VA + 0x8_0000));
        c[at + 16..at + 32].copy_from_slice(&ksm(b.lkey, DATA_VA + 0x4_0000));
        b.d.exec(&c, 16)
    };
    let out = ksm_key(&mut b, 11);
    assert_eq!(out[0], 0x3, "BAD_PARAMETER: entity size under 4 KiB");
    let out = ksm_key(&mut b, 13);
    assert_eq!(out[0], 0);
    let k = be32(&out, 8) << 8 | 0x22;
    let (d, s) = write_through(&mut a, &mut b, 0x2000 + 0x10, k, 32, 3);
    assert_eq!((s, read(&b, 0x4_0010, 32)), (0, d));
}
