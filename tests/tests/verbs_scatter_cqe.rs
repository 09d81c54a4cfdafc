//! End to end, scatter to CQE: RC and UC SENDs of up to 32 bytes (64-byte
//! CQEs) or 64 bytes (128-byte CQEs) come back in the receive CQE, and the
//! poll copies them into the receive buffer (libmlx5's behaviour) or hands
//! them out in place ([`Cq::poll_inline`]); a QP created with
//! `MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE` always gets them in the
//! buffer.

mod verbs_common;

use mlx5_emu::Profile;
use verbs::cq::{Cq, Wc, WcOpcode, WcStatus};
use verbs::qp::{send_flags as sf, Payload, Qp, QpInitAttr, QpType, RecvWr, SendOp, SendWr};
use verbs::scatter_cqe::{dv_flags, InlineRecv};
use verbs_common::*;

/// The two sides' QPs of `t`, side b's receive CQ with `cqe_size` CQEs,
/// its QP created with mlx5dv `flags`.
fn rig(cqe_size: usize, t: QpType, flags: u32) -> (Pair, Qp, Qp) {
    let mut p = pair_profile(1 << 16, Profile::ConnectX5, ALL);
    p.b.cq = p.b.ctx.create_cq_sized(256, None, None, cqe_size).unwrap();
    let mut qa = create_qp(&p.a, t, cap(16));
    let mut qb =
        p.b.pd
            .create_qp_dv(
                &QpInitAttr {
                    send_cq: &p.b.cq,
                    recv_cq: &p.b.cq,
                    srq: None,
                    cap: cap(16),
                    qp_type: t,
                    sq_sig_all: false,
                },
                flags,
            )
            .unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &p.a.ctx, &p.b.ctx, nb);
    connect(&mut qb, &p.b.ctx, &p.a.ctx, na);
    (p, qa, qb)
}

/// Posts a receive of `segs` (offset, length) of b's MR, then SENDs
/// `len` bytes from a; returns what was sent.
fn send(p: &mut Pair, qa: &mut Qp, qb: &mut Qp, segs: &[(u64, u32)], len: usize) -> Vec<u8> {
    // The receive buffer starts as a pattern nobody sends.
    p.b.buf.write(0, &[0xee; 4096]).unwrap();
    let sges: Vec<_> = segs
        .iter()
        .map(|&(o, l)| p.b.mr.sge(o, l).unwrap())
        .collect();
    qb.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: &sges,
    }])
    .unwrap();
    let data = fill(&p.a.buf, 0, len, len as u8);
    let sge = p.a.mr.sge(0, len as u32).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    if qa.qp_type() == QpType::Rc {
        assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
    }
    data
}

/// a SENDs the bytes of `sges` (signaled); its completion is a success.
fn a_sends(p: &mut Pair, qa: &mut Qp, sges: &[verbs::mr::Sge]) {
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::Send,
        payload: Payload::Sges(sges),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
}

/// Polls one completion in place.
fn poll_inline_one(cq: &mut Cq) -> (Wc, InlineRecv) {
    let mut wc = [Wc::default()];
    let mut d = [InlineRecv::default()];
    tests::wait::until("a receive completion", || {
        cq.poll_inline(&mut wc, &mut d).unwrap() == 1
    });
    (wc[0], d[0])
}

#[test]
fn small_sends_land_in_64_byte_cqes_and_are_copied_to_the_buffer() {
    for t in [QpType::Rc, QpType::Uc] {
        let (mut p, mut qa, mut qb) = rig(64, t, 0);
        for len in [1usize, 20, 32] {
            let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], len);
            let wc = poll_n(&mut p.b.cq, 1)[0];
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
                (77, WcStatus::Success, WcOpcode::Recv, len as u32),
                "{t:?} {len}"
            );
            assert_eq!(read(&p.b.buf, 0, len), data, "{t:?} {len}: copied");
            assert_eq!(read(&p.b.buf, len, 1), vec![0xee], "nothing past it");
            // In place: the bytes come out of the CQE, the buffer stays.
            let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], len);
            let (wc, d) = poll_inline_one(&mut p.b.cq);
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len as u32));
            assert_eq!(usize::from(d.len), len, "{t:?} {len}: in the CQE");
            assert_eq!(&d.data[..len], &data[..]);
            assert_eq!(read(&p.b.buf, 0, len), vec![0xee; len], "buffer untouched");
        }
        // 33 bytes do not fit a 64-byte CQE: the buffer, as ever.
        let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], 33);
        let (wc, d) = poll_inline_one(&mut p.b.cq);
        assert_eq!((wc.status, wc.byte_len, d.len), (WcStatus::Success, 33, 0));
        assert_eq!(read(&p.b.buf, 0, 33), data);
    }
}

#[test]
fn up_to_64_bytes_land_in_128_byte_cqes() {
    let (mut p, mut qa, mut qb) = rig(128, QpType::Rc, 0);
    for len in [8usize, 33, 64] {
        let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], len);
        let (wc, d) = poll_inline_one(&mut p.b.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len as u32));
        assert_eq!(usize::from(d.len), len);
        assert_eq!(&d.data[..len], &data[..]);
        let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], len);
        assert_eq!(poll_n(&mut p.b.cq, 1)[0].status, WcStatus::Success);
        assert_eq!(read(&p.b.buf, 0, len), data, "{len}: copied");
    }
    let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], 65);
    let (_, d) = poll_inline_one(&mut p.b.cq);
    assert_eq!(d.len, 0);
    assert_eq!(read(&p.b.buf, 0, 65), data);
}

#[test]
fn the_copy_follows_the_receive_segments() {
    let (mut p, mut qa, mut qb) = rig(128, QpType::Rc, 0);
    // 48 bytes over segments of 10, 20 and 30 bytes at scattered places.
    let data = send(
        &mut p,
        &mut qa,
        &mut qb,
        &[(100, 10), (1000, 20), (2000, 30)],
        48,
    );
    assert_eq!(poll_n(&mut p.b.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&p.b.buf, 100, 10), data[..10]);
    assert_eq!(read(&p.b.buf, 1000, 20), data[10..30]);
    assert_eq!(read(&p.b.buf, 2000, 18), data[30..]);
    assert_eq!(read(&p.b.buf, 2018, 12), vec![0xee; 12]);
}

#[test]
fn disabled_per_qp_every_byte_goes_to_the_buffer() {
    let (mut p, mut qa, mut qb) = rig(128, QpType::Rc, dv_flags::DISABLE_SCATTER_TO_CQE);
    for len in [4usize, 32, 64] {
        let data = send(&mut p, &mut qa, &mut qb, &[(0, 256)], len);
        let (wc, d) = poll_inline_one(&mut p.b.cq);
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, len as u32));
        assert_eq!(d.len, 0, "{len}: not in the CQE");
        assert_eq!(read(&p.b.buf, 0, len), data);
    }
}

#[test]
fn bad_create_flags_and_cqe_sizes_are_refused() {
    let p = pair_profile(4096, Profile::ConnectX5, ALL);
    let attr = QpInitAttr {
        send_cq: &p.a.cq,
        recv_cq: &p.a.cq,
        srq: None,
        cap: cap(4),
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let both = dv_flags::DISABLE_SCATTER_TO_CQE | dv_flags::ALLOW_SCATTER_TO_CQE;
    assert!(matches!(
        p.a.pd.create_qp_dv(&attr, both),
        Err(verbs::Error::Invalid(_))
    ));
    assert!(matches!(
        p.a.pd.create_qp_dv(&attr, 1 << 9),
        Err(verbs::Error::Invalid(_))
    ));
    for size in [0, 32, 96, 256] {
        assert!(
            p.a.ctx.create_cq_sized(16, None, None, size).is_err(),
            "{size}"
        );
    }
}

#[test]
fn srq_receives_scatter_too_and_are_copied_into_the_srq_wqe() {
    let mut p = pair_profile(1 << 16, Profile::ConnectX5, ALL);
    p.b.cq = p.b.ctx.create_cq_sized(256, None, None, 64).unwrap();
    let srq = p.b.pd.create_srq(16, 2).unwrap();
    let mut qa = create_qp(&p.a, QpType::Rc, cap(16));
    let attr = QpInitAttr {
        send_cq: &p.b.cq,
        recv_cq: &p.b.cq,
        srq: Some(&srq),
        cap: cap(16),
        qp_type: QpType::Rc,
        sq_sig_all: false,
    };
    let mut qb = p.b.pd.create_qp_dv(&attr, 0).unwrap();
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &p.a.ctx, &p.b.ctx, nb);
    connect(&mut qb, &p.b.ctx, &p.a.ctx, na);
    for (i, len) in [20usize, 32, 33, 32].into_iter().enumerate() {
        p.b.buf.write(0, &[0xee; 4096]).unwrap();
        // Two segments: 16 bytes at 100, the rest at 1000.
        let sges = [p.b.mr.sge(100, 16).unwrap(), p.b.mr.sge(1000, 256).unwrap()];
        srq.post_recv(&[RecvWr {
            wr_id: 90 + i as u64,
            sg_list: &sges,
        }])
        .unwrap();
        let data = fill(&p.a.buf, 0, len, len as u8 + 1);
        let sge = p.a.mr.sge(0, len as u32).unwrap();
        a_sends(&mut p, &mut qa, &[sge]);
        if i == 3 {
            // In place: from the CQE, the SRQ's buffer untouched.
            let (wc, d) = poll_inline_one(&mut p.b.cq);
            assert_eq!(
                (wc.wr_id, wc.status, usize::from(d.len)),
                (93, WcStatus::Success, len)
            );
            assert_eq!(&d.data[..len], &data[..]);
            assert_eq!(read(&p.b.buf, 100, 16), vec![0xee; 16]);
            continue;
        }
        // The copying poll (33 bytes never came in the CQE).
        let wc = poll_n(&mut p.b.cq, 1)[0];
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (90 + i as u64, WcStatus::Success, len as u32),
            "{len}"
        );
        assert_eq!(read(&p.b.buf, 100, 16), data[..16], "{len}");
        assert_eq!(read(&p.b.buf, 1000, len - 16), data[16..], "{len}");
        assert_eq!(read(&p.b.buf, 1000 + len - 16, 1), vec![0xee], "{len}");
    }
}

/// An empty SEND (rdma-core's remote-invalidate test sends one) has
/// nothing to scatter: its receive completes as any, with scatter to CQE
/// on or disabled. The model had put it "in the CQE" even on a QP without
/// `cs_res` (limit 0 >= length 0), and the poll, with no receive ring to
/// copy into, reported GENERAL_ERR.
#[test]
fn an_empty_send_completes_plainly_with_or_without_scatter() {
    for flags in [0, dv_flags::DISABLE_SCATTER_TO_CQE] {
        let (mut p, mut qa, mut qb) = rig(64, QpType::Rc, flags);
        let sge = p.b.mr.sge(0, 64).unwrap();
        qb.post_recv(&[RecvWr {
            wr_id: 5,
            sg_list: &[sge],
        }])
        .unwrap();
        a_sends(&mut p, &mut qa, &[]);
        let w = poll_n(&mut p.b.cq, 1)[0];
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (5, WcStatus::Success, 0),
            "flags {flags:#x}"
        );
    }
}

/// A receive entry of length 0 is left out of the WQE, as libmlx5's
/// `mlx5_post_recv` leaves it out (to the device a byte count of 0 is
/// 2 GiB): the bytes land in the next entry, none at the empty one.
#[test]
fn a_zero_length_receive_entry_takes_no_bytes() {
    let (mut p, mut qa, mut qb) = rig(64, QpType::Rc, dv_flags::DISABLE_SCATTER_TO_CQE);
    p.b.buf.write(0, &[0xee; 1024]).unwrap();
    let empty = p.b.mr.sge(0, 0).unwrap();
    let real = p.b.mr.sge(512, 64).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 6,
        sg_list: &[empty, real],
    }])
    .unwrap();
    let data = fill(&p.a.buf, 0, 16, 3);
    let sge = p.a.mr.sge(0, 16).unwrap();
    a_sends(&mut p, &mut qa, &[sge]);
    let w = poll_n(&mut p.b.cq, 1)[0];
    assert_eq!((w.wr_id, w.status, w.byte_len), (6, WcStatus::Success, 16));
    assert_eq!(read(&p.b.buf, 512, 16), data, "in the second entry");
    assert_eq!(
        read(&p.b.buf, 0, 16),
        vec![0xee; 16],
        "none at the empty one"
    );
}
