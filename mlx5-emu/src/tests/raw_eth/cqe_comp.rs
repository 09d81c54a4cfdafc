//! CQE compression (`transport/cqe_comp.rs`): the same traffic goes once
//! to a CQ without compression and once to one with it; the second ring,
//! expanded the way mlx5e expands it (`mlx5e_decompress_cqes_start` and
//! `_cont`: the title slot, mini CQE arrays at slots 1, 8, 16, ..., the
//! WQE counter worked out from the title), must give the first's CQEs
//! but for what compression loses (timestamps, and the hash or the
//! checksum by the mini CQE format). Then the CQ context refusals, and
//! an SQ whose CQ has no room left.

use std::sync::atomic::Ordering;

use mlx5_hw::cqe::{
    self, MINI_CQE_RES_FORMAT_CSUM, MINI_CQE_RES_FORMAT_CSUM_STRIDX,
    MINI_CQE_RES_FORMAT_FTAG_STRIDX, MINI_CQE_RES_FORMAT_HASH,
};
use mlx5_hw::eth::{MPWRQ_CQE_FILLER, MPWRQ_CQE_STRIDES_SHIFT};
use mlx5_hw::ifc::{cqc, cqe64, create_cq_in, destroy_cq_in, query_cq_in, query_cq_out};

use super::super::eth::{num, DBR_IOVA, RING_IOVA};
use super::super::{cmd_in, until};
use super::*;

/// CREATE_CQ with the context `set` fills (on a new EQ-less context:
/// the caller names the EQ); the command's status and CQ number.
fn create_cq(e: &mut Eth, eqn: u64, set: impl FnOnce(&mut [u8])) -> (u8, u32) {
    let mut c = cmd_in(0x400, 0, create_cq_in::SIZE_BYTES + 8);
    let x = &mut c[create_cq_in::CQ_CONTEXT.off / 8..];
    cqc::LOG_CQ_SIZE.set(x, 6);
    cqc::UAR_PAGE.set(x, u64::from(e.uar));
    cqc::C_EQN_OR_APU_ELEMENT.set(x, eqn);
    cqc::DBR_ADDR.set(x, DBR_IOVA);
    set(x);
    c[create_cq_in::SIZE_BYTES..].copy_from_slice(&RING_IOVA.to_be_bytes());
    let out = e.d.exec(&c, 16);
    (out[0], num(&out))
}

/// QUERY_CQ of `cqn`: its context.
fn query_cq(e: &mut Eth, cqn: u32) -> Vec<u8> {
    let mut c = cmd_in(0x402, 0, query_cq_in::SIZE_BYTES);
    query_cq_in::CQN.set(&mut c, u64::from(cqn));
    let out = e.d.ok(&c, query_cq_out::SIZE_BYTES + 8);
    let at = query_cq_out::CQ_CONTEXT.off / 8;
    out[at..at + cqc::SIZE_BYTES].to_vec()
}

/// Replaces `e`'s CQ (nothing on it yet) by one on the same ring whose
/// CQEs are compressed with mini CQEs of `format` (`None`: not
/// compressed); the ring's entries marked invalid again.
fn replace_cq(e: &mut Eth, format: Option<u8>) {
    let old = e.cqn;
    let eqn = cqc::C_EQN_OR_APU_ELEMENT.get(&query_cq(e, old));
    assert_eq!(e.destroy(0x401, destroy_cq_in::CQN, old), 0);
    let (status, cqn) = create_cq(e, eqn, |x| {
        if let Some(f) = format {
            cqc::CQE_COMP_EN.set(x, 1);
            cqc::MINI_CQE_RES_FORMAT.set(x, u64::from(f));
        }
    });
    assert_eq!(status, 0);
    e.cqn = cqn;
    for i in 0..64 {
        e.bufs[0].write(i * 64 + 63, &[0xf0]).unwrap();
    }
}

/// Slot `i` of `e`'s 64-entry ring.
fn slot(e: &Eth, i: u32) -> [u8; 64] {
    let mut b = [0u8; 64];
    e.bufs[0].read((i as usize & 63) * 64, &mut b).unwrap();
    b
}

/// `n` CQEs of `e`'s ring from the start, as mlx5e reads them: a slot
/// whose format is `MLX5_COMPRESSED` starts a session (its `byte_cnt`
/// the count) whose CQEs are the title's with each mini CQE's byte count
/// and checksum (or hash, `hash`), the WQE counter the title's plus one
/// per CQE (`striding`: plus the strides each consumed). Each CQE's
/// owner bit is checked for its index.
fn expand(e: &Eth, n: u32, striding: bool, hash: bool) -> (Vec<[u8; 64]>, u32) {
    expand_from(e, 0, n, striding, hash)
}

/// [`expand`] from CQE `cc` (the start of a session or a plain CQE).
fn expand_from(e: &Eth, mut cc: u32, n: u32, striding: bool, hash: bool) -> (Vec<[u8; 64]>, u32) {
    let mut out = Vec::new();
    let mut sessions = 0;
    while cc < n {
        let s = slot(e, cc);
        let op_own = s[63];
        assert_eq!(op_own & 1, (cc >> 6 & 1) as u8, "owner bit of slot {cc}");
        if cqe::cqe_format(op_own) != cqe::CQE_FORMAT_COMPRESSED {
            out.push(s);
            cc += 1;
            continue;
        }
        sessions += 1;
        let left = cqe64::BYTE_CNT.get(&s) as u32;
        assert!((2..=16).contains(&left), "session of {left} at {cc}");
        let mut counter = cqe64::WQE_COUNTER.get(&s) as u16;
        let mut arr = slot(e, cc + 1);
        for i in 0..left {
            if i > 0 && i % 8 == 0 {
                arr = slot(e, cc + i);
            }
            let m = &arr[(i as usize % 8) * 8..][..8];
            let mut c = s;
            c[cqe64::BYTE_CNT.off / 8..][..4].copy_from_slice(&m[4..8]);
            if hash {
                c[cqe64::RSS_HASH_RESULT.off / 8..][..4].copy_from_slice(&m[..4]);
            } else {
                c[cqe64::CHECK_SUM.off / 8..][..2].copy_from_slice(&m[..2]);
            }
            c[cqe64::WQE_COUNTER.off / 8..][..2].copy_from_slice(&counter.to_be_bytes());
            c[63] = op_own & 0xf0 | ((cc + i) >> 6 & 1) as u8;
            let bc = u32::from_be_bytes(m[4..8].try_into().unwrap());
            counter = counter.wrapping_add(if striding {
                (bc >> MPWRQ_CQE_STRIDES_SHIFT) as u16
            } else {
                1
            });
            out.push(c);
        }
        cc += left;
    }
    assert_eq!(cc, n, "a session ran past the CQEs written");
    (out, sessions)
}

/// `c` less what compression may lose: the timestamp, and the hash or
/// the checksum the mini CQE does not carry.
fn kept(mut c: [u8; 64], hash: bool) -> [u8; 64] {
    c[cqe64::TIMESTAMP_H.off / 8..][..8].fill(0);
    if hash {
        c[cqe64::CHECK_SUM.off / 8..][..2].fill(0);
    } else {
        c[cqe64::RSS_HASH_RESULT.off / 8..][..4].fill(0);
    }
    c
}

/// B's CQEs counted by the model reach `n`.
fn wait_cqes(b: &Eth, n: u64) {
    let r = &b.d.f.model().inner.rdma;
    until("B's CQEs", || r.counters.cqes.load(Ordering::Acquire) >= n);
}

/// A UDP frame to port 1000 of `n` payload bytes, numbered `k`, its
/// payload in A's buffer at `DATA + 256 k`: the segments of its send WQE.
fn staged(a: &mut Eth, alkey: u32, k: usize, n: usize) -> Vec<u8> {
    let f = udp_frame(k, n);
    a.bufs[0]
        .write(DATA as usize + k * 256, &f[HDRS..])
        .unwrap();
    send_segs(&f[..HDRS], alkey, k as u64 * 256, n as u32)
}

/// Bursts of UDP frames (one doorbell each) from A to B's cyclic RQ on
/// ConnectX-5, B's CQ compressing with `format` or not, each burst
/// completed (or B's CQ in error) before the next, B's CQ then consumed
/// if `consume` (its consumer counter moved past what was written): B,
/// the frames sent, and the model's session and compressed-CQE counts.
fn cyclic_run(format: Option<u8>, bursts: &[usize], consume: bool) -> (Eth, u32, u64, u64, Fabric) {
    let (fab, mut a, mut b) = pair_on(Profile::ConnectX5);
    replace_cq(&mut b, format);
    let blkey = b.rw_mkey();
    let rq = b.ready_rq(0);
    b.post_recv(0, blkey, 64);
    // Each WQE posted twice over (the ring's 64 again, as a driver
    // reposts them): more frames than the CQ's 64 entries find a WQE.
    b.bufs[1].write_u32_be(RQ_DBR[0] as usize, 128).unwrap();
    let tir = b.direct_tir(rq);
    let t = b.udp_table();
    assert_eq!(b.udp_rule(t, 0, 1000, Some(tir), None), 0);
    let alkey = a.rw_mkey();
    let sqn = a.ready_sq();
    let (mut idx, mut k) = (0u16, 0usize);
    for &n in bursts {
        // Payloads of 20 to 209 bytes (B's buffers hold 256 with the
        // headers), staged in 32 places.
        let w: Vec<Vec<u8>> = (k..k + n)
            .map(|j| staged(&mut a, alkey, j % 32, 20 + j % 64 * 3))
            .collect();
        a.post_burst(sqn, idx, 0x0a, &w);
        idx += 2 * n as u16;
        k += n;
        let r = &b.d.f.model().inner.rdma;
        let cq = crate::transport::rlock(&r.cqs)[&b.cqn].clone();
        until("B's CQEs", || {
            r.counters.cqes.load(Ordering::Acquire) >= k as u64 || crate::lock(&cq.st).error
        });
        // A's CQ consumed as far as it is written (its ring never fills).
        a.bufs[1].write_u32_be(0, k as u32).unwrap();
        if consume {
            b.bufs[1].write_u32_be(0, k as u32).unwrap();
        }
    }
    let c = &b.d.f.model().inner.rdma.counters;
    let s = c.compressed_sessions.load(Ordering::Relaxed);
    let z = c.cqes_compressed.load(Ordering::Relaxed);
    (b, k as u32, s, z, fab)
}

/// Bursts of 12, 1, 20 and 8 frames to a cyclic RQ (mlx5e's legacy RQ,
/// DPDK's non-MPRQ queue) whose CQ compresses with the checksum format
/// (mlx5e's): sessions of 12, then one plain CQE (a burst of one), 16
/// (the most `cqe_compression_max_num` allows) and 4, then 8; expanded,
/// the same CQEs as without compression.
#[test]
fn a_bursts_cqes_are_compressed_into_sessions_that_expand_to_the_same_cqes() {
    let bursts = [12, 1, 20, 8];
    let (plain, n, s0, z0, _f0) = cyclic_run(None, &bursts, false);
    assert_eq!((s0, z0), (0, 0), "no compression asked");
    let (comp, m, s, z, _f1) = cyclic_run(Some(MINI_CQE_RES_FORMAT_CSUM), &bursts, false);
    assert_eq!(n, m);
    assert_eq!((s, z), (4, 40), "sessions and CQEs compressed");
    let (want, none) = expand(&plain, n, false, false);
    assert_eq!(none, 0);
    let (got, sessions) = expand(&comp, n, false, false);
    assert_eq!(sessions, 4);
    // Where each session starts: a title slot of the compressed format.
    for at in [0u32, 13, 29, 33] {
        let op_own = slot(&comp, at)[63];
        assert_eq!(
            cqe::cqe_format(op_own),
            cqe::CQE_FORMAT_COMPRESSED,
            "slot {at}"
        );
    }
    assert_eq!(
        cqe::cqe_format(slot(&comp, 12)[63]),
        cqe::CQE_FORMAT_NO_INLINE_DATA
    );
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(kept(*g, false), kept(*w, false), "CQE {i}");
        assert_ne!(cqe64::CHECK_SUM.get(g), 0, "CQE {i}: its own checksum");
    }
    // The checksums differ frame to frame: each came from its mini CQE.
    let sums: std::collections::BTreeSet<u64> =
        got.iter().map(|c| cqe64::CHECK_SUM.get(c)).collect();
    assert!(sums.len() > 16, "{sums:?}");
    // A reset restarts the counts; their lifetime figures keep them.
    let model = comp.d.f.model();
    model.inner.rdma.reset();
    let st = model.stats();
    assert_eq!((st.compressed_sessions, st.cqes_compressed), (0, 0));
    let l = st.lifetime;
    assert_eq!(
        (l.compressed_sessions, l.cqes_compressed, l.cqes),
        (4, 40, 41)
    );
}

/// A session ends at the ring's last slot: B's CQ consumed after each
/// burst, 58 CQEs, then a burst of 12 (a session of 6 in slots 58-63, one
/// of 6 from slot 0 of the second pass) and one of 16 (slots 6-21);
/// expanded with the owner bit of each pass, the same CQEs as without
/// compression. (DPDK's vectorized receive walks a session without
/// wrapping, and wrote past the ring's end in a guest before this rule.)
#[test]
fn a_session_never_crosses_the_ring_end() {
    let bursts = [16, 16, 16, 10, 12, 16];
    let (plain, n, _, _, _f0) = cyclic_run(None, &bursts, true);
    let (comp, m, s, z, _f1) = cyclic_run(Some(MINI_CQE_RES_FORMAT_CSUM), &bursts, true);
    assert_eq!((n, m), (86, 86));
    assert_eq!((s, z), (7, 86));
    for (at, len) in [(58, 6), (64, 6), (70, 16)] {
        let t = slot(&comp, at);
        assert_eq!(
            cqe::cqe_format(t[63]),
            cqe::CQE_FORMAT_COMPRESSED,
            "slot {at}"
        );
        assert_eq!(cqe64::BYTE_CNT.get(&t), len, "session at {at}");
    }
    // Both rings hold CQEs 22..86 (the first 22 overwritten): compare
    // from the session at 58.
    let from = 58;
    let (want, _) = expand_from(&plain, from, n, false, false);
    let (got, sessions) = expand_from(&comp, from, n, false, false);
    assert_eq!(sessions, 3);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            kept(*g, false),
            kept(*w, false),
            "CQE {}",
            from as usize + i
        );
    }
}

/// A striding RQ (mlx5e's and DPDK's MPRQ) on ConnectX-7 whose CQ
/// compresses with the hash format (DPDK's): frames of 100, 60 and 150
/// bytes take strides 0-1, 2 and 3-5 of WQE 0; one of 130 does not fit,
/// so a filler (never compressed) ends WQE 0 and it takes strides 0-2 of
/// WQE 1, and one of 60 stride 3. One burst: sessions of 3 and 2 around
/// the filler, each expanding (stride indexes worked out from the strides
/// each consumed, the WQE the title's) to the CQEs an uncompressed CQ gets.
#[test]
fn a_striding_rqs_sessions_stay_within_a_wqe_and_expand_by_strides() {
    let run = |format: Option<u8>| {
        let (fab, mut a, mut b) = pair_on(Profile::ConnectX7);
        replace_cq(&mut b, format);
        let blkey = b.rw_mkey();
        let rq = b.striding_rq();
        b.post_striding(blkey);
        let tir = b.direct_tir(rq);
        let t = b.udp_table();
        assert_eq!(b.udp_rule(t, 0, 1000, Some(tir), None), 0);
        let alkey = a.rw_mkey();
        let sqn = a.ready_sq();
        let w: Vec<Vec<u8>> = [100usize, 60, 150, 130, 60]
            .iter()
            .enumerate()
            .map(|(k, &len)| staged(&mut a, alkey, k, len - HDRS))
            .collect();
        a.post_burst(sqn, 0, 0x0a, &w);
        wait_cqes(&b, 6);
        let c = &b.d.f.model().inner.rdma.counters;
        let counts = (
            c.compressed_sessions.load(Ordering::Relaxed),
            c.cqes_compressed.load(Ordering::Relaxed),
        );
        (b, counts, fab)
    };
    let (plain, none, _f0) = run(None);
    assert_eq!(none, (0, 0));
    let (comp, counts, _f1) = run(Some(MINI_CQE_RES_FORMAT_HASH));
    assert_eq!(counts, (2, 5), "sessions and CQEs compressed");
    let (want, _) = expand(&plain, 6, true, true);
    let (got, sessions) = expand(&comp, 6, true, true);
    assert_eq!(sessions, 2);
    let places: Vec<(u64, u64, u32)> = got
        .iter()
        .map(|c| {
            (
                cqe64::WQE_ID.get(c),
                cqe64::WQE_COUNTER.get(c),
                cqe64::BYTE_CNT.get(c) as u32,
            )
        })
        .collect();
    let s = |n: u32, len: u32| n << MPWRQ_CQE_STRIDES_SHIFT | len;
    assert_eq!(
        places,
        [
            (0, 0, s(2, 100)),
            (0, 2, s(1, 60)),
            (0, 3, s(3, 150)),
            (0, 6, MPWRQ_CQE_FILLER | s(2, 0)),
            (1, 0, s(3, 130)),
            (1, 3, s(1, 60)),
        ]
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(kept(*g, true), kept(*w, true), "CQE {i}");
    }
}

/// A session as large as the ring has room for: a burst of 8 frames to
/// a CQ with 4 free slots writes a session of 4 and then overruns (the CQ
/// in error, as QUERY_CQ reports), never writing past the consumer.
#[test]
fn a_session_larger_than_the_room_left_writes_what_fits_and_overruns() {
    let (mut b, _, sessions, z, _f) =
        cyclic_run(Some(MINI_CQE_RES_FORMAT_CSUM), &[16, 16, 16, 12, 8], false);
    // 60 CQEs fill slots 0-59; of the last burst's 8, 4 fit.
    let r = &b.d.f.model().inner.rdma;
    let cq = crate::transport::rlock(&r.cqs)[&b.cqn].clone();
    assert!(crate::lock(&cq.st).error, "the CQ overran");
    assert_eq!(cqc::STATUS.get(&query_cq(&mut b, cq.cqn)), 9);
    assert_eq!((sessions, z), (5, 64));
    let (got, s) = expand(&b, 64, false, false);
    assert_eq!((got.len(), s), (64, 5));
}

/// CREATE_CQ refuses compression the caps do not offer (BAD_PARAM): with
/// 128-byte CQEs (`cqe_compression_128` is 0), the enhanced layout, the
/// stride-index mini CQE without `mini_cqe_resp_stride_index`, the flow
/// tag format; takes the hash and checksum formats, which QUERY_CQ
/// reports.
#[test]
fn cq_compression_refusals_and_query() {
    let (_fab, _a, mut b) = pair_on(Profile::ConnectX4Lx);
    let cqn = b.cqn;
    let eqn = cqc::C_EQN_OR_APU_ELEMENT.get(&query_cq(&mut b, cqn));
    let comp = |f: u8| {
        move |x: &mut [u8]| {
            cqc::CQE_COMP_EN.set(x, 1);
            cqc::MINI_CQE_RES_FORMAT.set(x, u64::from(f));
        }
    };
    let bad = CmdStatus::BadParameter.to_raw();
    let (s, _) = create_cq(&mut b, eqn, |x| {
        comp(MINI_CQE_RES_FORMAT_CSUM)(x);
        cqc::CQE_SZ.set(x, u64::from(cqe::CQE_STRIDE_128));
    });
    assert_eq!(s, bad, "128-byte CQEs");
    let (s, _) = create_cq(&mut b, eqn, |x| {
        comp(MINI_CQE_RES_FORMAT_CSUM)(x);
        cqc::CQE_COMPRESSION_LAYOUT.set(x, u64::from(cqe::CQE_COMPRESS_LAYOUT_ENHANCED));
    });
    assert_eq!(s, bad, "enhanced layout");
    for f in [
        MINI_CQE_RES_FORMAT_CSUM_STRIDX,
        MINI_CQE_RES_FORMAT_FTAG_STRIDX,
    ] {
        assert_eq!(create_cq(&mut b, eqn, comp(f)).0, bad, "format {f}");
    }
    for f in [MINI_CQE_RES_FORMAT_HASH, MINI_CQE_RES_FORMAT_CSUM] {
        let (s, cqn) = create_cq(&mut b, eqn, comp(f));
        assert_eq!(s, 0, "format {f}");
        let q = query_cq(&mut b, cqn);
        assert_eq!(
            (cqc::CQE_COMP_EN.get(&q), cqc::MINI_CQE_RES_FORMAT.get(&q)),
            (1, u64::from(f))
        );
        assert_eq!(b.destroy(0x401, destroy_cq_in::CQN, cqn), 0);
    }
    let q = query_cq(&mut b, cqn);
    assert_eq!(cqc::CQE_COMP_EN.get(&q), 0);
}

/// An SQ whose CQ has no room for a WQE's CQE: the WQE ran (its frame
/// went out once), its CQE is lost, and the SQ goes to ERR, flushing what
/// follows without sending it; the SQ is not run again (it once sent the
/// same frame over and over while the CQ stayed full).
#[test]
fn an_sq_whose_cq_overruns_sends_each_frame_once_and_goes_to_err() {
    let (_fab, mut a, b, _rq, alkey, sqn) = udp_path(Profile::ConnectX4Lx, 64, false);
    b.bufs[1].write_u32_be(RQ_DBR[0] as usize, 128).unwrap();
    let mut idx = 0u16;
    for (k, n) in [(0usize, 32usize), (32, 32), (64, 2)] {
        let w: Vec<Vec<u8>> = (k..k + n)
            .map(|j| staged(&mut a, alkey, j % 32, 40))
            .collect();
        a.post_burst(sqn, idx, 0x0a, &w);
        idx += 2 * n as u16;
        if k < 64 {
            wait_cqes(&b, (k + n) as u64);
            // B's CQ consumed; A's never.
            b.bufs[1].write_u32_be(0, (k + n) as u32).unwrap();
        }
    }
    let sq = crate::transport::rlock(&a.d.f.model().inner.rdma.eth_sqs)[&sqn].clone();
    until("A's SQ drained", || crate::lock(&sq.ring).ci == idx);
    assert_eq!(a.sq_state(sqn), mlx5_hw::eth::QUEUE_STATE_ERR);
    let r = &a.d.f.model().inner.rdma;
    assert_eq!(r.counters.packets_sent.load(Ordering::Relaxed), 65);
    let cq = crate::transport::rlock(&r.cqs)[&a.cqn].clone();
    assert!(crate::lock(&cq.st).error, "A's CQ overran");
    wait_cqes(&b, 65);
    let rb = &b.d.f.model().inner.rdma;
    assert_eq!(rb.counters.packets_received.load(Ordering::Relaxed), 65);
}
