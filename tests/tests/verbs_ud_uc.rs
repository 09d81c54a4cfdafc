//! End to end, UC and UD (the opcodes that apply), shared receive queues
//! and completion channels.

mod verbs_common;

use std::time::Duration;

use verbs::cq::{wc_flags, WcOpcode, WcStatus};
use verbs::qp::{
    send_flags as sf, Payload, PostError, QpInitAttr, QpType, RecvWr, SendOp, SendWr, UdDest,
};
use verbs_common::*;

const GRH: usize = 40;

#[test]
fn uc_send_write_and_write_imm() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Uc, cap(8));
    let r = p.b.mr.sge(0, 1024).unwrap();
    qb.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &[r],
        },
        RecvWr {
            wr_id: 2,
            sg_list: &[r],
        },
    ])
    .unwrap();
    let d = fill(&p.a.buf, 0, 3000, 11);
    let small = p.a.mr.sge(0, 500).unwrap();
    let big = p.a.mr.sge(0, 3000).unwrap();
    qa.post_send(&[
        SendWr {
            wr_id: 10,
            op: SendOp::SendImm(7),
            payload: Payload::Sges(&[small]),
            flags: sf::SIGNALED,
            ud: None,
        },
        SendWr {
            wr_id: 11,
            op: SendOp::RdmaWrite {
                raddr: p.b.mr.addr() + 8192,
                rkey: p.b.mr.rkey(),
            },
            payload: Payload::Sges(&[big]),
            flags: sf::SIGNALED,
            ud: None,
        },
        SendWr {
            wr_id: 12,
            op: SendOp::RdmaWriteImm {
                raddr: p.b.mr.addr() + 16384,
                rkey: p.b.mr.rkey(),
                imm: 8,
            },
            payload: Payload::Sges(&[big]),
            flags: sf::SIGNALED,
            ud: None,
        },
    ])
    .unwrap();
    let sw = poll_n(&mut p.a.cq, 3);
    assert_eq!(
        sw.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::RdmaWrite),
            (12, WcStatus::Success, WcOpcode::RdmaWrite),
        ]
    );
    let rw = poll_n(&mut p.b.cq, 2);
    assert_eq!(
        rw.iter()
            .map(|w| (
                w.wr_id,
                w.opcode,
                w.byte_len,
                w.imm(),
                w.wc_flags & wc_flags::WITH_IMM
            ))
            .collect::<Vec<_>>(),
        vec![
            (1, WcOpcode::Recv, 500, Some(7), wc_flags::WITH_IMM),
            (
                2,
                WcOpcode::RecvRdmaWithImm,
                3000,
                Some(8),
                wc_flags::WITH_IMM
            ),
        ]
    );
    assert_eq!(read(&p.b.buf, 0, 500), d[..500].to_vec());
    assert_eq!(read(&p.b.buf, 8192, 3000), d);
    assert_eq!(read(&p.b.buf, 16384, 3000), d);
}

#[test]
fn uc_and_ud_refuse_reads_and_atomics_at_post() {
    let p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Uc, cap(8));
    let s = [p.a.mr.sge(0, 8).unwrap()];
    let rd = SendWr {
        wr_id: 1,
        op: SendOp::RdmaRead {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&s),
        flags: sf::SIGNALED,
        ud: None,
    };
    assert_eq!(qa.post_send(&[rd]), Err((0, PostError::BadOp)));
    let fa = SendWr {
        op: SendOp::AtomicFetchAdd {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
            add: 1,
        },
        ..rd
    };
    assert_eq!(qa.post_send(&[fa]), Err((0, PostError::BadOp)));
    let (mut ua, _ub) = qp_pair(&p, QpType::Ud, cap(8));
    let wr = SendWr {
        op: SendOp::RdmaWrite {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        ..rd
    };
    assert_eq!(ua.post_send(&[wr]), Err((0, PostError::BadOp)));
    let no_dest = SendWr {
        op: SendOp::Send,
        ..rd
    };
    assert_eq!(
        ua.post_send(&[no_dest]),
        Err((0, PostError::BadOp)),
        "UD needs an address"
    );
}

#[test]
fn ud_send_carries_grh_src_qp_and_qkey() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Ud, cap(8));
    let r = p.b.mr.sge(0, 2048).unwrap();
    qb.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &[r],
        },
        RecvWr {
            wr_id: 2,
            sg_list: &[r],
        },
    ])
    .unwrap();
    let ah = ah(&p.a, &p.b);
    let d = fill(&p.a.buf, 0, 1000, 21);
    let s = p.a.mr.sge(0, 1000).unwrap();
    let dest = |qkey| UdDest {
        ah: &ah,
        remote_qpn: qb.qp_num(),
        remote_qkey: qkey,
    };
    // A wrong Q_Key is dropped by the receiver (no completion there).
    qa.post_send(&[SendWr {
        wr_id: 5,
        op: SendOp::Send,
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: Some(dest(QKEY ^ 1)),
    }])
    .unwrap();
    assert_eq!(
        poll_n(&mut p.a.cq, 1)[0].status,
        WcStatus::Success,
        "UD sends complete anyway"
    );
    assert!(nothing_more(&p.fabric, &mut p.b.cq), "wrong Q_Key dropped");
    assert!(stats(&p.fabric, 1).dropped >= 1);
    qa.post_send(&[SendWr {
        wr_id: 6,
        op: SendOp::SendImm(0x4242),
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: Some(dest(QKEY)),
    }])
    .unwrap();
    let sw = poll_n(&mut p.a.cq, 1);
    assert_eq!(
        (sw[0].wr_id, sw[0].status, sw[0].opcode),
        (6, WcStatus::Success, WcOpcode::Send)
    );
    let rw = poll_n(&mut p.b.cq, 1);
    let w = rw[0];
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (1, WcStatus::Success, WcOpcode::Recv),
        "{w:?}"
    );
    assert_eq!(w.byte_len, (GRH + 1000) as u32, "GRH counted");
    assert_eq!(w.src_qp, qa.qp_num());
    assert_eq!(w.qp_num, qb.qp_num());
    assert_eq!(w.imm(), Some(0x4242));
    assert_eq!(w.wc_flags & wc_flags::GRH, wc_flags::GRH);
    assert_eq!(w.wc_flags & wc_flags::WITH_IMM, wc_flags::WITH_IMM);
    assert_eq!(read(&p.b.buf, GRH, 1000), d, "payload after the GRH");
    // RoCEv2 over IPv6: the GRH area holds the IPv6 header, its source
    // address being the sender's GID.
    let grh = read(&p.b.buf, 0, GRH);
    assert_eq!(grh[0] >> 4, 6, "IPv6 version");
    assert_eq!(&grh[8..24], &p.a.ctx.query_gid(1, 0).unwrap());
    assert_eq!(&grh[24..40], &p.b.ctx.query_gid(1, 0).unwrap());
}

#[test]
fn srq_feeds_two_qps() {
    let mut p = pair(1 << 16);
    let srq = p.b.pd.create_srq(16, 1).unwrap();
    let r0 = p.b.mr.sge(0, 256).unwrap();
    let r1 = p.b.mr.sge(256, 256).unwrap();
    srq.post_recv(&[
        RecvWr {
            wr_id: 70,
            sg_list: &[r0],
        },
        RecvWr {
            wr_id: 71,
            sg_list: &[r1],
        },
    ])
    .unwrap();
    let mk = |s: &Side, srq| {
        s.pd.create_qp(&QpInitAttr {
            send_cq: &s.cq,
            recv_cq: &s.cq,
            srq,
            cap: cap(8),
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap()
    };
    let mut a1 = mk(&p.a, None);
    let mut a2 = mk(&p.a, None);
    let mut b1 = mk(&p.b, Some(&srq));
    let mut b2 = mk(&p.b, Some(&srq));
    connect(&mut a1, &p.a.ctx, &p.b.ctx, b1.qp_num());
    connect(&mut b1, &p.b.ctx, &p.a.ctx, a1.qp_num());
    connect(&mut a2, &p.a.ctx, &p.b.ctx, b2.qp_num());
    connect(&mut b2, &p.b.ctx, &p.a.ctx, a2.qp_num());
    assert_eq!(
        b1.post_recv(&[RecvWr {
            wr_id: 0,
            sg_list: &[r0]
        }]),
        Err((0, PostError::BadOp)),
        "receives of an SRQ QP go to the SRQ"
    );
    fill(&p.a.buf, 0, 64, 1);
    fill(&p.a.buf, 64, 64, 2);
    let send = |qp: &mut verbs::qp::Qp, off, wr_id| {
        let s = p.a.mr.sge(off, 64).unwrap();
        qp.post_send(&[SendWr {
            wr_id,
            op: SendOp::Send,
            payload: Payload::Sges(&[s]),
            flags: 0,
            ud: None,
        }])
        .unwrap();
    };
    send(&mut a1, 0, 1);
    let w1 = poll_n(&mut p.b.cq, 1);
    send(&mut a2, 64, 2);
    let w2 = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (w1[0].wr_id, w1[0].qp_num, w1[0].byte_len),
        (70, b1.qp_num(), 64)
    );
    assert_eq!(
        (w2[0].wr_id, w2[0].qp_num, w2[0].byte_len),
        (71, b2.qp_num(), 64)
    );
    assert_eq!(read(&p.b.buf, 0, 64), read(&p.a.buf, 0, 64));
    assert_eq!(read(&p.b.buf, 256, 64), read(&p.a.buf, 64, 64));
    poll_n(&mut p.a.cq, 2);
}

#[test]
fn completion_channel_fires_after_arm() {
    let fabric = mlx5_emu::Fabric::cabled(2, mlx5_emu::Profile::ConnectX4Lx);
    let a = side(open(function(&fabric, 0)), 1 << 16, ALL);
    let b = side(open(function(&fabric, 1)), 1 << 16, ALL);
    let ch = b.ctx.create_comp_channel().unwrap();
    let mut rcq = b.ctx.create_cq(64, Some(&ch), None).unwrap();
    let mut qb =
        b.pd.create_qp(&QpInitAttr {
            send_cq: &b.cq,
            recv_cq: &rcq,
            srq: None,
            cap: cap(8),
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .unwrap();
    let mut qa = create_qp(&a, QpType::Rc, cap(8));
    connect(&mut qa, &a.ctx, &b.ctx, qb.qp_num());
    connect(&mut qb, &b.ctx, &a.ctx, qa.qp_num());
    let r = b.mr.sge(0, 64).unwrap();
    qb.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &[r],
        },
        RecvWr {
            wr_id: 2,
            sg_list: &[r],
        },
    ])
    .unwrap();
    let s = a.mr.sge(0, 16).unwrap();
    let send = |qa: &mut verbs::qp::Qp| {
        qa.post_send(&[SendWr {
            wr_id: 0,
            op: SendOp::Send,
            payload: Payload::Sges(&[s]),
            flags: 0,
            ud: None,
        }])
        .unwrap()
    };
    // Not armed: a completion raises no event (no EQE, once the models
    // have done all they had to).
    let eqes = stats(&fabric, 1).eqes;
    send(&mut qa);
    assert_eq!(poll_n(&mut rcq, 1)[0].wr_id, 1);
    settle(&fabric);
    assert_eq!(stats(&fabric, 1).eqes, eqes, "an EQE for an unarmed CQ");
    assert_eq!(ch.get_cq_event(Duration::ZERO).unwrap(), None);
    // Armed: the fd becomes readable and the event names the CQ.
    rcq.req_notify(false).unwrap();
    send(&mut qa);
    let mut pfd = libc::pollfd {
        fd: ch.fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, 5000) };
    assert_eq!(n, 1, "channel fd readable");
    assert_eq!(
        ch.get_cq_event(Duration::from_secs(1)).unwrap(),
        Some(rcq.cqn())
    );
    assert_eq!(poll_n(&mut rcq, 1)[0].wr_id, 2);
}

/// A receive WR `wr_id` on `q`: 2 KiB of `s`'s region at `0x1000 * wr_id`.
fn recv(q: &mut verbs::qp::Qp, s: &Side, wr_id: u64) {
    let r = s.mr.sge(0x1000 * wr_id, 2048).unwrap();
    q.post_recv(&[RecvWr {
        wr_id,
        sg_list: &[r],
    }])
    .unwrap();
}

/// A signaled UD SEND of `s` on `q` to the multicast group `group`
/// addresses (remote QPN 0xFFFFFF).
fn send_to_group(q: &mut verbs::qp::Qp, wr_id: u64, s: verbs::mr::Sge, group: &verbs::ah::Ah) {
    q.post_send(&[SendWr {
        wr_id,
        op: SendOp::Send,
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: Some(UdDest {
            ah: group,
            remote_qpn: verbs::mcast::MULTICAST_QPN,
            remote_qkey: QKEY,
        }),
    }])
    .unwrap();
}

/// Multicast: UD QPs on both cabled functions join a group
/// (`attach_mcast`, ATTACH_TO_MCG); a SEND to the group's GID and QP
/// 0xFFFFFF reaches each member once, on the other port and on the
/// sender's own, and no QP outside the group; a member that left
/// (DETACH_FROM_MCG) gets nothing more. Refusals: a unicast GID and an RC
/// QP before the device is asked, leaving a group twice by the device.
#[test]
fn ud_multicast_reaches_every_member_on_both_ports() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Ud, cap(8));
    let (mut qa2, mut qb2) = qp_pair(&p, QpType::Ud, cap(8));
    let mgid = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
    qb.attach_mcast(&mgid).unwrap();
    qa2.attach_mcast(&mgid).unwrap();
    recv(&mut qb, &p.b, 1);
    recv(&mut qa2, &p.a, 2);
    recv(&mut qb2, &p.b, 3);
    let group_ah = |dgid| {
        p.a.pd
            .create_ah(&verbs::qp::AhAttr {
                dgid,
                sgid_index: 0,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            })
            .unwrap()
    };
    let group = group_ah(mgid);
    let d = fill(&p.a.buf, 0, 500, 31);
    let s = p.a.mr.sge(0, 500).unwrap();
    let send = |q: &mut verbs::qp::Qp, wr_id| send_to_group(q, wr_id, s, &group);
    send(&mut qa, 10);
    // A: the send and the copy its own port gave QP a2.
    let mut wa = poll_n(&mut p.a.cq, 2);
    wa.sort_by_key(|w| w.wr_id);
    assert_eq!(
        wa.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.qp_num))
            .collect::<Vec<_>>(),
        vec![
            (2, WcStatus::Success, WcOpcode::Recv, qa2.qp_num()),
            (10, WcStatus::Success, WcOpcode::Send, qa.qp_num()),
        ]
    );
    // B: member b once, b2 (not in the group) nothing.
    let wb = poll_n(&mut p.b.cq, 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].qp_num, wb[0].src_qp, wb[0].byte_len),
        (1, qb.qp_num(), qa.qp_num(), (GRH + 500) as u32)
    );
    assert_eq!(read(&p.b.buf, 0x1000 + GRH, 500), d);
    assert_eq!(
        &read(&p.b.buf, 0x1000 + 24, 16)[..],
        &mgid,
        "GRH: the group"
    );
    assert!(nothing_more(&p.fabric, &mut p.b.cq), "b2 is not a member");
    // b leaves; a2 stays.
    qb.detach_mcast(&mgid).unwrap();
    recv(&mut qa2, &p.a, 4);
    send(&mut qa, 11);
    let mut wa = poll_n(&mut p.a.cq, 2);
    wa.sort_by_key(|w| w.wr_id);
    assert_eq!((wa[0].wr_id, wa[1].wr_id), (4, 11));
    assert!(nothing_more(&p.fabric, &mut p.b.cq), "b left the group");
    // RoCE v2 over IPv4: an IPv4-mapped group address (239.1.2.3).
    let mut v4 = [0u8; 16];
    v4[10..].copy_from_slice(&[0xff, 0xff, 239, 1, 2, 3]);
    qb.attach_mcast(&v4).unwrap();
    recv(&mut qb, &p.b, 5);
    let group4 = group_ah(v4);
    qa.post_send(&[SendWr {
        wr_id: 12,
        op: SendOp::Send,
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: Some(UdDest {
            ah: &group4,
            remote_qpn: verbs::mcast::MULTICAST_QPN,
            remote_qkey: QKEY,
        }),
    }])
    .unwrap();
    assert_eq!(poll_n(&mut p.a.cq, 1)[0].wr_id, 12);
    let wb = poll_n(&mut p.b.cq, 1);
    assert_eq!((wb[0].wr_id, wb[0].qp_num), (5, qb.qp_num()));
    assert!(
        nothing_more(&p.fabric, &mut p.a.cq),
        "a2 is not in that group"
    );
    // Refusals.
    assert!(qb.detach_mcast(&mgid).is_err(), "not a member any more");
    let unicast = p.b.ctx.query_gid(1, 0).unwrap();
    assert!(matches!(
        qa.attach_mcast(&unicast),
        Err(verbs::Error::Invalid(_))
    ));
    let (rc, _rc2) = qp_pair(&p, QpType::Rc, cap(8));
    assert!(matches!(
        rc.attach_mcast(&mgid),
        Err(verbs::Error::Invalid(_))
    ));
}

/// Multicast loopback blocked (`IBV_QP_CREATE_BLOCK_SELF_MCAST_LB`,
/// `qpc.block_lb_mc`): a UD QP made with it sends to a group whose members
/// are a QP on its own function and one on the other; only the other
/// port's member gets the datagram, while a plain UD QP's SEND to the same
/// group reaches both. Another QP type is refused.
#[test]
fn a_qp_blocking_multicast_loopback_reaches_the_other_port_only() {
    let mut p = pair(1 << 16);
    let attr = verbs::qp::QpInitAttr {
        send_cq: &p.a.cq,
        recv_cq: &p.a.cq,
        srq: None,
        cap: cap(8),
        qp_type: QpType::Ud,
        sq_sig_all: false,
    };
    let mut blocking = p.a.pd.create_qp_blocking_mcast_loopback(&attr).unwrap();
    let rc = verbs::qp::QpInitAttr {
        qp_type: QpType::Rc,
        ..attr
    };
    assert!(matches!(
        p.a.pd.create_qp_blocking_mcast_loopback(&rc),
        Err(verbs::Error::Invalid(_))
    ));
    connect(&mut blocking, &p.a.ctx, &p.b.ctx, 0);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Ud, cap(8));
    let (mut qa2, _qb2) = qp_pair(&p, QpType::Ud, cap(8));
    let mgid = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x56, 0x78];
    qb.attach_mcast(&mgid).unwrap();
    qa2.attach_mcast(&mgid).unwrap();
    recv(&mut qb, &p.b, 1);
    recv(&mut qa2, &p.a, 2);
    let group =
        p.a.pd
            .create_ah(&verbs::qp::AhAttr {
                dgid: mgid,
                sgid_index: 0,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            })
            .unwrap();
    fill(&p.a.buf, 0, 100, 7);
    let s = p.a.mr.sge(0, 100).unwrap();
    let send = |q: &mut verbs::qp::Qp, wr_id| send_to_group(q, wr_id, s, &group);
    send(&mut blocking, 10);
    let wb = poll_n(&mut p.b.cq, 1);
    assert_eq!((wb[0].wr_id, wb[0].src_qp), (1, blocking.qp_num()));
    let wa = poll_n(&mut p.a.cq, 1);
    assert_eq!((wa[0].wr_id, wa[0].opcode), (10, WcOpcode::Send));
    assert!(
        nothing_more(&p.fabric, &mut p.a.cq),
        "the sender's own port delivered to a2"
    );
    // The plain QP's SEND loops back to a2 (still waiting with its WR).
    recv(&mut qb, &p.b, 3);
    send(&mut qa, 11);
    let mut wa = poll_n(&mut p.a.cq, 2);
    wa.sort_by_key(|w| w.wr_id);
    assert_eq!((wa[0].wr_id, wa[0].qp_num), (2, qa2.qp_num()));
    assert_eq!(wa[1].wr_id, 11);
    assert_eq!(poll_n(&mut p.b.cq, 1)[0].wr_id, 3);
}
