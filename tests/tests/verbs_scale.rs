//! End to end, scale: 1000 QPs at once, 64K outstanding WQEs on one QP,
//! a 1 GiB MR.

mod verbs_common;

use verbs::cq::{WcOpcode, WcStatus};
use verbs::mr::access;
use verbs::qp::{
    send_flags as sf, Payload, PostError, QpCap, QpInitAttr, QpType, RecvWr, SendOp, SendWr,
};
use verbs_common::*;

/// 1000 QPs on each of two functions, each writing its own bytes.
#[test]
fn a_thousand_qps_at_once() {
    many_qps(1000);
}

/// [`a_thousand_qps_at_once`] at a size the default run affords.
#[test]
fn a_hundred_qps_at_once() {
    many_qps(100);
}

fn many_qps(n: usize) {
    #[allow(non_snake_case)]
    let N = n;
    let mut p = pair(N * 64);
    let c = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let mut qa: Vec<_> = (0..N).map(|_| create_qp(&p.a, QpType::Rc, c)).collect();
    let mut qb: Vec<_> = (0..N).map(|_| create_qp(&p.b, QpType::Rc, c)).collect();
    for (a, b) in qa.iter_mut().zip(qb.iter_mut()) {
        let (na, nb) = (a.qp_num(), b.qp_num());
        connect(a, &p.a.ctx, &p.b.ctx, nb);
        connect(b, &p.b.ctx, &p.a.ctx, na);
    }
    assert!(stats(&p.fabric, 0).qps >= N);
    let qa_qpns: Vec<u32> = qa.iter().map(|q| q.qp_num()).collect();
    let data = fill(&p.a.buf, 0, N * 64, 3);
    // Each QP writes its own 64 bytes; a CQ of 256 is drained as we go.
    let mut done = 0;
    for (i, a) in qa.iter_mut().enumerate() {
        let s = p.a.mr.sge((i * 64) as u64, 64).unwrap();
        a.post_send(&[SendWr {
            wr_id: i as u64,
            op: SendOp::RdmaWrite {
                raddr: p.b.mr.addr() + (i * 64) as u64,
                rkey: p.b.mr.rkey(),
            },
            payload: Payload::Sges(&[s]),
            flags: sf::SIGNALED,
            ud: None,
        }])
        .unwrap();
        if i % 128 == 127 {
            for w in poll_n(&mut p.a.cq, i + 1 - done) {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                assert_eq!(w.qp_num, qa_qpns[w.wr_id as usize]);
                done += 1;
            }
        }
    }
    for w in poll_n(&mut p.a.cq, N - done) {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
        assert_eq!(w.qp_num, qa_qpns[w.wr_id as usize]);
    }
    assert_eq!(read(&p.b.buf, 0, N * 64), data);
    drop(qa);
    drop(qb);
    assert_eq!(stats(&p.fabric, 0).qps, 0);
    assert_eq!(stats(&p.fabric, 1).qps, 0);
}

/// 64K WQEs outstanding on one QP: its send queue and its receive queue
/// both full (32K each: the model's log_max_qp_sz is 15, as a
/// ConnectX-4's), every one posted before any completion is polled.
#[test]
fn sixty_four_k_outstanding_wqes_on_one_qp() {
    const N: usize = 1 << 15;
    let fabric = mlx5_emu::Fabric::cabled(2, mlx5_emu::Profile::ConnectX4Lx);
    let a = side(open(function(&fabric, 0)), N * 8, ALL);
    let b = side(open(function(&fabric, 1)), N * 8, ALL);
    let max_wr = a.ctx.query_device().unwrap().max_qp_wr;
    assert!(max_wr as usize >= N, "device allows {max_wr} WRs per queue");
    let mut cqa = a.ctx.create_cq(2 * N as u32, None, None).unwrap();
    let mut cqb = b.ctx.create_cq(N as u32, None, None).unwrap();
    let c = QpCap {
        max_send_wr: N as u32,
        max_recv_wr: N as u32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 8,
    };
    let mk = |s: &Side, cq| {
        s.pd.create_qp(&QpInitAttr {
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            cap: c,
            qp_type: QpType::Rc,
            sq_sig_all: true,
        })
        .unwrap()
    };
    let mut qa = mk(&a, &cqa);
    let mut qb = mk(&b, &cqb);
    assert_eq!(
        (qa.cap().max_send_wr as usize, qa.cap().max_recv_wr as usize),
        (N, N)
    );
    connect(&mut qa, &a.ctx, &b.ctx, qb.qp_num());
    connect(&mut qb, &b.ctx, &a.ctx, qa.qp_num());
    let words: Vec<[u8; 8]> = (0..N as u64).map(|i| (i * 3 + 1).to_be_bytes()).collect();
    // N receives on qa, each for its own 8 bytes.
    let rsges: Vec<_> = (0..N)
        .map(|i| a.mr.sge((i * 8) as u64, 8).unwrap())
        .collect();
    let rwrs: Vec<_> = (0..N)
        .map(|i| RecvWr {
            wr_id: i as u64,
            sg_list: std::slice::from_ref(&rsges[i]),
        })
        .collect();
    qa.post_recv(&rwrs).unwrap();
    assert_eq!(qa.post_recv(&rwrs[..1]), Err((0, PostError::QueueFull)));
    // N WRITEs from qa into b's buffer.
    let wrs: Vec<_> = (0..N)
        .map(|i| SendWr {
            wr_id: (N + i) as u64,
            op: SendOp::RdmaWrite {
                raddr: b.mr.addr() + (i * 8) as u64,
                rkey: b.mr.rkey(),
            },
            payload: Payload::Inline(&words[i]),
            flags: sf::SIGNALED,
            ud: None,
        })
        .collect();
    for chunk in wrs.chunks(4096) {
        qa.post_send(chunk).unwrap();
    }
    let one_more = SendWr {
        wr_id: 1 << 20,
        ..wrs[0]
    };
    assert_eq!(qa.post_send(&[one_more]), Err((0, PostError::QueueFull)));
    let w = poll_n(&mut cqa, N);
    for (i, w) in w.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.opcode),
            ((N + i) as u64, WcStatus::Success, WcOpcode::RdmaWrite)
        );
    }
    assert_eq!(read(&b.buf, 0, N * 8), words.concat());
    // N SENDs from qb consume qa's receives, in order.
    let sends: Vec<_> = (0..N)
        .map(|i| SendWr {
            wr_id: i as u64,
            op: SendOp::Send,
            payload: Payload::Inline(&words[N - 1 - i]),
            flags: sf::SIGNALED,
            ud: None,
        })
        .collect();
    for chunk in sends.chunks(4096) {
        qb.post_send(chunk).unwrap();
    }
    let w = poll_n(&mut cqa, N);
    for (i, w) in w.iter().enumerate() {
        assert_eq!(
            (w.wr_id, w.status, w.opcode, w.byte_len),
            (i as u64, WcStatus::Success, WcOpcode::Recv, 8)
        );
    }
    let got = read(&a.buf, 0, N * 8);
    let want: Vec<u8> = words.iter().rev().flatten().copied().collect();
    assert_eq!(got, want);
    let w = poll_n(&mut cqb, N);
    assert!(w.iter().all(|w| w.status == WcStatus::Success));
    // Room again.
    qa.post_send(&[one_more]).unwrap();
    assert_eq!(poll_n(&mut cqa, 1)[0].wr_id, 1 << 20);
}

#[test]
fn a_one_gib_mr() {
    const G: usize = 1 << 30;
    let fabric = mlx5_emu::Fabric::cabled(2, mlx5_emu::Profile::ConnectX4Lx);
    let mut a = side(open(function(&fabric, 0)), 1 << 16, ALL);
    let b = side(open(function(&fabric, 1)), 4096, ALL);
    let big = vfio::DmaBuffer::new(G).unwrap();
    let mr =
        b.pd.reg_mr_buffer(
            &big,
            0,
            G,
            access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ,
        )
        .unwrap();
    assert_eq!(mr.len(), G as u64);
    let (mut qa, mut qb) = {
        let mut qa = create_qp(&a, QpType::Rc, cap(8));
        let mut qb = create_qp(&b, QpType::Rc, cap(8));
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        connect(&mut qa, &a.ctx, &b.ctx, nb);
        connect(&mut qb, &b.ctx, &a.ctx, na);
        (qa, qb)
    };
    let d = fill(&a.buf, 0, 8192, 77);
    let s = a.mr.sge(0, 8192).unwrap();
    // First bytes, the middle across the 512 MiB point, the last bytes.
    let offs = [0u64, (G / 2 - 4096) as u64, (G - 8192) as u64];
    let wrs: Vec<_> = offs
        .iter()
        .map(|&o| SendWr {
            wr_id: o,
            op: SendOp::RdmaWrite {
                raddr: mr.addr() + o,
                rkey: mr.rkey(),
            },
            payload: Payload::Sges(std::slice::from_ref(&s)),
            flags: sf::SIGNALED,
            ud: None,
        })
        .collect();
    qa.post_send(&wrs).unwrap();
    let w = poll_n(&mut a.cq, 3);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    for o in offs {
        assert_eq!(read(&big, o as usize, 8192), d, "at {o:#x}");
    }
    // Beyond the end is refused by the device (remote access error).
    let past = SendWr {
        wr_id: 9,
        op: SendOp::RdmaWrite {
            raddr: mr.addr() + G as u64 - 4096,
            rkey: mr.rkey(),
        },
        ..wrs[0]
    };
    qa.post_send(&[past]).unwrap();
    assert_eq!(poll_n(&mut a.cq, 1)[0].status, WcStatus::RemAccessErr);
    let _ = &mut qb;
}

/// A list of 1-SGE RDMA WRITEs (the path that goes straight into the
/// ring) longer than the send queue: posted up to the first WR without
/// room, that one's index and QueueFull back, and the WRs before it
/// executed; with room again, a list mixing that path with an inline
/// WRITE (the general writer) in the middle goes whole, in order.
#[test]
fn a_list_longer_than_the_send_queue_stops_at_the_first_wr_without_room() {
    let mut p = pair(4096);
    // Every WQE one block, so that a WR takes one of the ring's blocks.
    let c = QpCap {
        max_send_sge: 1,
        max_inline_data: 16,
        ..cap(8)
    };
    let mut qa = create_qp(&p.a, QpType::Rc, c);
    let mut qb = create_qp(&p.b, QpType::Rc, c);
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &p.a.ctx, &p.b.ctx, nb);
    connect(&mut qb, &p.b.ctx, &p.a.ctx, na);
    let n = qa.send_ring().free() as usize;
    assert!(n >= qa.cap().max_send_wr as usize);
    let data = fill(&p.a.buf, 0, (n + 3) * 64, 9);
    let inline = [0xa5u8; 16];
    let sges: Vec<_> = (0..n + 3)
        .map(|i| p.a.mr.sge((i * 64) as u64, 64).unwrap())
        .collect();
    let write = |i: usize| SendWr {
        wr_id: i as u64,
        op: SendOp::RdmaWrite {
            raddr: p.b.mr.addr() + (i * 64) as u64,
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(std::slice::from_ref(&sges[i])),
        flags: sf::SIGNALED,
        ud: None,
    };
    let wrs: Vec<_> = (0..n + 2).map(write).collect();
    assert_eq!(qa.post_send(&wrs), Err((n, PostError::QueueFull)));
    let w = poll_n(&mut p.a.cq, n);
    for (i, w) in w.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, WcStatus::Success));
    }
    assert_eq!(read(&p.b.buf, 0, n * 64), data[..n * 64]);
    assert_eq!(
        read(&p.b.buf, n * 64, 128),
        vec![0; 128],
        "WRs n, n+1 not posted"
    );
    // Room again: WRITE n, an inline WRITE into n+1's place, WRITE n+2.
    let mixed = [
        write(n),
        SendWr {
            payload: Payload::Inline(&inline),
            ..write(n + 1)
        },
        write(n + 2),
    ];
    qa.post_send(&mixed).unwrap();
    let w = poll_n(&mut p.a.cq, 3);
    let ids: Vec<_> = w.iter().map(|w| (w.wr_id, w.status)).collect();
    let want: Vec<_> = (n..n + 3).map(|i| (i as u64, WcStatus::Success)).collect();
    assert_eq!(ids, want);
    assert_eq!(read(&p.b.buf, n * 64, 64), data[n * 64..(n + 1) * 64]);
    assert_eq!(read(&p.b.buf, (n + 1) * 64, 16), inline);
    assert_eq!(
        read(&p.b.buf, (n + 2) * 64, 64),
        data[(n + 2) * 64..(n + 3) * 64]
    );
    let _ = &mut qb;
}
