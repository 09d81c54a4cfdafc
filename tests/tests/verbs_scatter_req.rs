//! End to end, requester scatter to CQE (issue 22): on an RC QP whose
//! sends are all signaled (or created with
//! `MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE`), READ responses of up to 32
//! bytes (64-byte send CQEs) or 64 bytes (128-byte ones) and atomic
//! results come back in the requester's CQE; the poll copies them into
//! the READ's or atomic's data segments (libmlx5's
//! `mlx5_copy_to_send_wqe`) or hands them out in place
//! ([`Cq::poll_inline`]), leaving the buffer alone. Larger READs,
//! unsignaled ones and QPs created with
//! `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` get their data in the buffer.

mod verbs_common;

use mlx5_emu::Profile;
use verbs::cq::{Cq, Wc, WcOpcode, WcStatus};
use verbs::mr::Sge;
use verbs::qp::{send_flags as sf, Payload, Qp, QpInitAttr, QpType, SendOp, SendWr};
use verbs::scatter_cqe::{dv_flags, InlineRecv};
use verbs_common::*;

/// Side a's QP (the requester) with a send CQ of `cqe_size` CQEs, all
/// sends signaled or not, created with mlx5dv `flags`; side b's plain.
fn rig(cqe_size: usize, sig_all: bool, flags: u32) -> (Pair, Qp, Qp) {
    let mut p = pair_profile(1 << 16, Profile::ConnectX5, ALL);
    p.a.cq = p.a.ctx.create_cq_sized(256, None, None, cqe_size).unwrap();
    let mut qa =
        p.a.pd
            .create_qp_dv(
                &QpInitAttr {
                    send_cq: &p.a.cq,
                    recv_cq: &p.a.cq,
                    srq: None,
                    cap: cap(16),
                    qp_type: QpType::Rc,
                    sq_sig_all: sig_all,
                },
                flags,
            )
            .unwrap();
    let mut qb = create_qp(&p.b, QpType::Rc, cap(16));
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &p.a.ctx, &p.b.ctx, nb);
    connect(&mut qb, &p.b.ctx, &p.a.ctx, na);
    (p, qa, qb)
}

/// Posts a READ of `len` bytes from b's offset 0 into `segs` (offset,
/// length) of a's MR, signaled when `signaled`; a's buffer starts as a
/// pattern b never holds. Returns what b holds.
fn post_read(
    p: &mut Pair,
    qa: &mut Qp,
    segs: &[(u64, u32)],
    len: usize,
    signaled: bool,
) -> Vec<u8> {
    p.a.buf.write(0, &[0xee; 4096]).unwrap();
    let data = fill(&p.b.buf, 0, len, len as u8 ^ 0x5a);
    let sges: Vec<Sge> = segs
        .iter()
        .map(|&(o, l)| p.a.mr.sge(o, l).unwrap())
        .collect();
    qa.post_send(&[SendWr {
        wr_id: 9,
        op: SendOp::RdmaRead {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&sges),
        flags: if signaled { sf::SIGNALED } else { 0 },
        ud: None,
    }])
    .unwrap();
    data
}

/// Polls one completion in place.
fn poll_inline_one(cq: &mut Cq) -> (Wc, InlineRecv) {
    let mut wc = [Wc::default()];
    let mut d = [InlineRecv::default()];
    tests::wait::until("a completion", || {
        cq.poll_inline(&mut wc, &mut d).unwrap() == 1
    });
    (wc[0], d[0])
}

#[test]
fn small_reads_land_in_64_byte_cqes_and_are_copied_to_the_buffer() {
    let (mut p, mut qa, _qb) = rig(64, true, 0);
    for len in [1usize, 8, 32] {
        let data = post_read(&mut p, &mut qa, &[(0, len as u32)], len, true);
        let wc = poll_n(&mut p.a.cq, 1)[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
            (9, WcStatus::Success, WcOpcode::RdmaRead, len as u32),
            "{len}"
        );
        assert_eq!(read(&p.a.buf, 0, len), data, "{len}: copied");
        assert_eq!(read(&p.a.buf, len, 1), vec![0xee], "nothing past it");
        // In place: the bytes come out of the CQE, the buffer stays.
        let data = post_read(&mut p, &mut qa, &[(0, len as u32)], len, true);
        let (wc, d) = poll_inline_one(&mut p.a.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len as u32));
        assert_eq!(usize::from(d.len), len, "{len}: in the CQE");
        assert_eq!(&d.data[..len], &data[..]);
        assert_eq!(read(&p.a.buf, 0, len), vec![0xee; len], "buffer untouched");
    }
    // 33 bytes do not fit a 64-byte CQE: the buffer, as ever.
    let data = post_read(&mut p, &mut qa, &[(0, 33)], 33, true);
    let (wc, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!((wc.status, wc.byte_len, d.len), (WcStatus::Success, 33, 0));
    assert_eq!(read(&p.a.buf, 0, 33), data);
}

#[test]
fn up_to_64_bytes_land_in_128_byte_cqes_and_follow_the_segments() {
    let (mut p, mut qa, _qb) = rig(128, true, 0);
    let data = post_read(&mut p, &mut qa, &[(0, 64)], 64, true);
    let (wc, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!((wc.status, d.len), (WcStatus::Success, 64));
    assert_eq!(&d.data[..64], &data[..]);
    // 48 bytes over segments of 10, 20 and 18 bytes at scattered places.
    let data = post_read(
        &mut p,
        &mut qa,
        &[(100, 10), (1000, 20), (2000, 18)],
        48,
        true,
    );
    let wc = poll_n(&mut p.a.cq, 1)[0];
    assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 48));
    assert_eq!(read(&p.a.buf, 100, 10), data[..10]);
    assert_eq!(read(&p.a.buf, 1000, 20), data[10..30]);
    assert_eq!(read(&p.a.buf, 2000, 18), data[30..]);
    assert_eq!(read(&p.a.buf, 110, 1), vec![0xee], "nothing past a segment");
    let data = post_read(&mut p, &mut qa, &[(0, 65)], 65, true);
    let (_, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!(d.len, 0, "65 bytes: the buffer");
    assert_eq!(read(&p.a.buf, 0, 65), data);
}

#[test]
fn atomic_results_come_in_the_cqe() {
    let (mut p, mut qa, _qb) = rig(64, true, 0);
    // The values in memory as the function's atomics take them: host
    // order when it offers host-endian atomics (IBV_ATOMIC_HCA), else
    // network order (verbs_rc's atomics say why).
    let hca = p.a.ctx.query_device().unwrap().atomic_cap == 1;
    let enc = |v: u64| {
        if hca {
            v.to_ne_bytes()
        } else {
            v.to_be_bytes()
        }
    };
    p.b.buf.write(0, &enc(40)).unwrap();
    p.a.buf.write(0, &[0xee; 8]).unwrap();
    let sge = p.a.mr.sge(0, 8).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 5,
        op: SendOp::AtomicFetchAdd {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
            add: 2,
        },
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let (wc, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len, d.len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8, 8)
    );
    assert_eq!(&d.data[..8], &enc(40), "the old value, in the CQE");
    assert_eq!(read(&p.a.buf, 0, 8), vec![0xee; 8], "buffer untouched");
    let mut now = [0u8; 8];
    p.b.buf.read(0, &mut now).unwrap();
    assert_eq!(now, enc(42), "added once");
    // Copied by the ordinary poll.
    qa.post_send(&[SendWr {
        wr_id: 6,
        op: SendOp::AtomicCmpSwp {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
            compare: 42,
            swap: 7,
        },
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let wc = poll_n(&mut p.a.cq, 1)[0];
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    assert_eq!(read(&p.a.buf, 0, 8), enc(42).to_vec());
}

#[test]
fn unsignaled_disabled_or_not_all_signaled_reads_use_the_buffer() {
    // ALLOW on a QP whose sends are not all signaled: an unsignaled READ
    // has no CQE to carry its bytes, so they go to the buffer; a signaled
    // one after it scatters.
    let (mut p, mut qa, _qb) = rig(64, false, dv_flags::ALLOW_SCATTER_TO_CQE);
    let first = post_read(&mut p, &mut qa, &[(0, 16)], 16, false);
    let data2 = fill(&p.b.buf, 64, 16, 3);
    let sge = p.a.mr.sge(64, 16).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 10,
        op: SendOp::RdmaRead {
            raddr: p.b.mr.addr() + 64,
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let (wc, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!((wc.wr_id, wc.status, d.len), (10, WcStatus::Success, 16));
    assert_eq!(&d.data[..16], &data2[..]);
    assert_eq!(read(&p.a.buf, 0, 16), first, "the unsignaled READ: buffer");
    // Neither flag and not all signaled: mlx5_ib asks for no scatter.
    let (mut p, mut qa, _qb) = rig(64, false, 0);
    let data = post_read(&mut p, &mut qa, &[(0, 16)], 16, true);
    let (_, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!(d.len, 0);
    assert_eq!(read(&p.a.buf, 0, 16), data);
    // DISABLE, all signaled: none either.
    let (mut p, mut qa, _qb) = rig(64, true, dv_flags::DISABLE_SCATTER_TO_CQE);
    let data = post_read(&mut p, &mut qa, &[(0, 16)], 16, true);
    let (_, d) = poll_inline_one(&mut p.a.cq);
    assert_eq!(d.len, 0);
    assert_eq!(read(&p.a.buf, 0, 16), data);
}
