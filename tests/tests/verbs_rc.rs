//! End to end, RC: every opcode between two cabled device-model functions,
//! byte-exact data and the completion fields.

mod verbs_common;

use verbs::cq::{wc_flags, WcOpcode, WcStatus};
use verbs::qp::{send_flags as sf, Payload, QpType, RecvWr, SendOp, SendWr};
use verbs_common::*;

const SIG: u32 = sf::SIGNALED;

#[test]
fn rc_rdma_write_lands_byte_exact() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let data = fill(&p.a.buf, 0, 4096, 7);
    let sge = p.a.mr.sge(0, 4096).unwrap();
    let raddr = p.b.mr.addr() + 8192;
    qa.post_send(&[SendWr {
        wr_id: 42,
        op: SendOp::RdmaWrite {
            raddr,
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&[sge]),
        flags: SIG,
        ud: None,
    }])
    .unwrap();
    let wc = poll_n(&mut p.a.cq, 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    assert_eq!(wc[0].wr_id, 42);
    assert_eq!(wc[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(wc[0].qp_num, qa.qp_num());
    assert_eq!(read(&p.b.buf, 8192, 4096), data);
    assert_eq!(
        read(&p.b.buf, 8192 + 4096, 16),
        vec![0; 16],
        "nothing beyond"
    );
    assert!(
        nothing_more(&p.fabric, &mut p.b.cq),
        "a WRITE consumes no receive"
    );
}

#[test]
fn rc_send_and_send_imm_complete_on_both_sides() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(16));
    let r0 = p.b.mr.sge(0, 1024).unwrap();
    let r1 = p.b.mr.sge(1024, 1024).unwrap();
    qb.post_recv(&[
        RecvWr {
            wr_id: 100,
            sg_list: &[r0],
        },
        RecvWr {
            wr_id: 101,
            sg_list: &[r1],
        },
    ])
    .unwrap();
    let d0 = fill(&p.a.buf, 0, 700, 1);
    let d1 = fill(&p.a.buf, 4096, 300, 2);
    // Two SGEs gathered into one message.
    let s0 = p.a.mr.sge(0, 350).unwrap();
    let s1 = p.a.mr.sge(350, 350).unwrap();
    let s2 = p.a.mr.sge(4096, 300).unwrap();
    qa.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            payload: Payload::Sges(&[s0, s1]),
            flags: SIG,
            ud: None,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::SendImm(0xdead_beef),
            payload: Payload::Sges(&[s2]),
            flags: SIG | sf::SOLICITED,
            ud: None,
        },
    ])
    .unwrap();
    let sw = poll_n(&mut p.a.cq, 2);
    assert_eq!(
        sw.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::Send)
        ]
    );
    let rw = poll_n(&mut p.b.cq, 2);
    assert_eq!(rw[0].wr_id, 100);
    assert_eq!(rw[0].status, WcStatus::Success, "{:?}", rw[0]);
    assert_eq!(rw[0].opcode, WcOpcode::Recv);
    assert_eq!(rw[0].byte_len, 700);
    assert_eq!(rw[0].qp_num, qb.qp_num());
    assert_eq!(rw[0].wc_flags & wc_flags::WITH_IMM, 0);
    assert_eq!(rw[1].wr_id, 101);
    assert_eq!(rw[1].byte_len, 300);
    assert_eq!(rw[1].opcode, WcOpcode::Recv);
    assert_eq!(rw[1].wc_flags & wc_flags::WITH_IMM, wc_flags::WITH_IMM);
    assert_eq!(rw[1].imm(), Some(0xdead_beef));
    assert_eq!(read(&p.b.buf, 0, 700), d0);
    assert_eq!(read(&p.b.buf, 1024, 300), d1);
}

#[test]
fn rc_inline_send_and_write() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(16));
    let r = p.b.mr.sge(0, 256).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &[r],
    }])
    .unwrap();
    let msg = b"inline bytes travel inside the WQE";
    qa.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            payload: Payload::Inline(msg),
            flags: SIG,
            ud: None,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite {
                raddr: p.b.mr.addr() + 1000,
                rkey: p.b.mr.rkey(),
            },
            payload: Payload::Inline(&[0xab; 60]),
            flags: SIG,
            ud: None,
        },
    ])
    .unwrap();
    let sw = poll_n(&mut p.a.cq, 2);
    assert!(sw.iter().all(|w| w.status == WcStatus::Success), "{sw:?}");
    let rw = poll_n(&mut p.b.cq, 1);
    assert_eq!((rw[0].wr_id, rw[0].byte_len), (9, msg.len() as u32));
    assert_eq!(read(&p.b.buf, 0, msg.len()), msg.to_vec());
    assert_eq!(read(&p.b.buf, 1000, 60), vec![0xab; 60]);
}

#[test]
fn rc_write_with_imm_consumes_a_receive() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(16));
    let r = p.b.mr.sge(0, 16).unwrap();
    qb.post_recv(&[RecvWr {
        wr_id: 77,
        sg_list: &[r],
    }])
    .unwrap();
    let d = fill(&p.a.buf, 0, 2000, 3);
    let s = p.a.mr.sge(0, 2000).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 5,
        op: SendOp::RdmaWriteImm {
            raddr: p.b.mr.addr() + 4096,
            rkey: p.b.mr.rkey(),
            imm: 0x0102_0304,
        },
        payload: Payload::Sges(&[s]),
        flags: SIG,
        ud: None,
    }])
    .unwrap();
    let sw = poll_n(&mut p.a.cq, 1);
    assert_eq!(
        (sw[0].status, sw[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let rw = poll_n(&mut p.b.cq, 1);
    assert_eq!(rw[0].wr_id, 77);
    assert_eq!(rw[0].status, WcStatus::Success);
    assert_eq!(rw[0].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(rw[0].byte_len, 2000);
    assert_eq!(rw[0].imm(), Some(0x0102_0304));
    assert_eq!(rw[0].wc_flags & wc_flags::WITH_IMM, wc_flags::WITH_IMM);
    assert_eq!(read(&p.b.buf, 4096, 2000), d);
    assert_eq!(
        read(&p.b.buf, 0, 16),
        vec![0; 16],
        "receive buffer untouched"
    );
}

#[test]
fn rc_rdma_read_fetches_remote_bytes() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let d = fill(&p.b.buf, 12288, 5000, 9);
    let s0 = p.a.mr.sge(100, 2500).unwrap();
    let s1 = p.a.mr.sge(30000, 2500).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 3,
        op: SendOp::RdmaRead {
            raddr: p.b.mr.addr() + 12288,
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&[s0, s1]),
        flags: SIG,
        ud: None,
    }])
    .unwrap();
    let w = poll_n(&mut p.a.cq, 1);
    assert_eq!(
        (w[0].status, w[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead),
        "{:?}",
        w[0]
    );
    assert_eq!(w[0].byte_len, 5000);
    let mut got = read(&p.a.buf, 100, 2500);
    got.extend(read(&p.a.buf, 30000, 2500));
    assert_eq!(got, d);
}

#[test]
fn rc_atomics_return_the_old_value() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    // The function offers no host-endianness atomic mode
    // (atomic_req_8B_endianness_mode stays MLX5_ATOMIC_REQ_MODE_BE), so the
    // device reads and writes the 8 bytes big-endian, and returns them so.
    let remote = p.b.mr.addr() + 64;
    let old0 = p.a.mr.sge(0, 8).unwrap();
    let old1 = p.a.mr.sge(8, 8).unwrap();
    let old2 = p.a.mr.sge(16, 8).unwrap();
    p.b.buf.write_u64_be(64, 10).unwrap();
    qa.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::AtomicFetchAdd {
                raddr: remote,
                rkey: p.b.mr.rkey(),
                add: 5,
            },
            payload: Payload::Sges(&[old0]),
            flags: SIG,
            ud: None,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::AtomicCmpSwp {
                raddr: remote,
                rkey: p.b.mr.rkey(),
                compare: 15,
                swap: 1000,
            },
            payload: Payload::Sges(&[old1]),
            flags: SIG,
            ud: None,
        },
        SendWr {
            wr_id: 3,
            op: SendOp::AtomicCmpSwp {
                raddr: remote,
                rkey: p.b.mr.rkey(),
                compare: 15,
                swap: 7,
            },
            payload: Payload::Sges(&[old2]),
            flags: SIG,
            ud: None,
        },
    ])
    .unwrap();
    let w = poll_n(&mut p.a.cq, 3);
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success, WcOpcode::FetchAdd, 8),
            (2, WcStatus::Success, WcOpcode::CompSwap, 8),
            (3, WcStatus::Success, WcOpcode::CompSwap, 8),
        ]
    );
    let word = |b: &vfio::DmaBuffer, o| b.read_u64_be(o).unwrap();
    assert_eq!(word(&p.a.buf, 0), 10, "fetch-add returns the old value");
    assert_eq!(
        word(&p.a.buf, 8),
        15,
        "cmp-swp returns the old value (equal)"
    );
    assert_eq!(
        word(&p.a.buf, 16),
        1000,
        "cmp-swp returns the old value (not equal)"
    );
    assert_eq!(word(&p.b.buf, 64), 1000, "only the matching swap happened");
}

#[test]
fn rc_wr_batch_api_posts_every_opcode() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = qp_pair(&p, QpType::Rc, cap(32));
    let r = p.b.mr.sge(0, 512).unwrap();
    qb.post_recv(&[
        RecvWr {
            wr_id: 1,
            sg_list: &[r],
        },
        RecvWr {
            wr_id: 2,
            sg_list: &[r],
        },
        RecvWr {
            wr_id: 3,
            sg_list: &[r],
        },
    ])
    .unwrap();
    fill(&p.a.buf, 0, 512, 4);
    let s = p.a.mr.sge(0, 64).unwrap();
    let rk = p.b.mr.rkey();
    let rb = p.b.mr.addr();
    p.b.buf.write_u64_be(40960, 100).unwrap();
    {
        let mut b = qa.wr_start();
        b.wr_id(10, SIG).send().set_sge(s);
        b.wr_id(11, SIG).send_imm(0x55).set_inline_data(b"hi");
        b.wr_id(12, SIG).rdma_write(rk, rb + 8192).set_sge(s);
        b.wr_id(13, SIG)
            .rdma_write_imm(rk, rb + 16384, 0x66)
            .set_sge_list(&[s, s]);
        b.wr_id(14, SIG)
            .rdma_read(rk, rb + 8192)
            .set_sge(p.a.mr.sge(20000, 64).unwrap());
        b.wr_id(15, SIG)
            .atomic_fetch_add(rk, rb + 40960, 1)
            .set_sge(p.a.mr.sge(30000, 8).unwrap());
        b.wr_id(16, SIG)
            .atomic_cmp_swp(rk, rb + 40960, 101, 5)
            .set_sge(p.a.mr.sge(30008, 8).unwrap());
        b.complete().unwrap();
    }
    let w = poll_n(&mut p.a.cq, 7);
    assert_eq!(
        w.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        vec![
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::Send),
            (12, WcStatus::Success, WcOpcode::RdmaWrite),
            (13, WcStatus::Success, WcOpcode::RdmaWrite),
            (14, WcStatus::Success, WcOpcode::RdmaRead),
            (15, WcStatus::Success, WcOpcode::FetchAdd),
            (16, WcStatus::Success, WcOpcode::CompSwap),
        ]
    );
    let rw = poll_n(&mut p.b.cq, 3);
    assert_eq!(
        rw.iter()
            .map(|w| (w.wr_id, w.opcode, w.byte_len, w.imm()))
            .collect::<Vec<_>>(),
        vec![
            (1, WcOpcode::Recv, 64, None),
            (2, WcOpcode::Recv, 2, Some(0x55)),
            (3, WcOpcode::RecvRdmaWithImm, 128, Some(0x66)),
        ]
    );
    let s64 = read(&p.a.buf, 0, 64);
    assert_eq!(read(&p.b.buf, 8192, 64), s64);
    assert_eq!(
        read(&p.b.buf, 16384, 128),
        [s64.clone(), s64.clone()].concat()
    );
    assert_eq!(read(&p.a.buf, 20000, 64), s64, "read back what was written");
    let word = |b: &vfio::DmaBuffer, o| b.read_u64_be(o).unwrap();
    assert_eq!(word(&p.a.buf, 30000), 100);
    assert_eq!(word(&p.a.buf, 30008), 101);
    assert_eq!(word(&p.b.buf, 40960), 5);
}

#[test]
fn rc_fast_path_post_rdma_write() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let data = fill(&p.a.buf, 0, 256, 99);
    for i in 0..40u64 {
        let sge = p.a.mr.sge(i % 4 * 64, 64).unwrap();
        let raddr = p.b.mr.addr() + 4096 + i * 64;
        qa.post_rdma_write(i, &sge, raddr, p.b.mr.rkey(), SIG)
            .unwrap();
        let w = poll_n(&mut p.a.cq, 1);
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].opcode),
            (i, WcStatus::Success, WcOpcode::RdmaWrite)
        );
    }
    for i in 0..40usize {
        assert_eq!(
            read(&p.b.buf, 4096 + i * 64, 64),
            data[i % 4 * 64..i % 4 * 64 + 64].to_vec()
        );
    }
}

/// The fast path's RDMA WRITE of an empty SGE moves no bytes (a WQE with
/// no data segment, as `post_send` writes it: a data segment's byte count
/// of 0 would mean 2 GiB to the device).
#[test]
fn rc_fast_path_post_rdma_write_of_nothing() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    fill(&p.a.buf, 0, 64, 7);
    let before = fill(&p.b.buf, 0, 4096, 3);
    let sge = p.a.mr.sge(0, 0).unwrap();
    qa.post_rdma_write(1, &sge, p.b.mr.addr(), p.b.mr.rkey(), SIG)
        .unwrap();
    let w = poll_n(&mut p.a.cq, 1);
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(read(&p.b.buf, 0, 4096), before);
}

/// Two QPs share a CQ and their completions are polled 16 at a time, so
/// one poll runs across both QPs' CQEs (the poll frees a QP's send queue
/// once per run of its completions): each wr_id comes back once with its
/// QP's number, and each QP's queue is freed up to its own last
/// completion: each round fills both queues (eight one-block WQEs in
/// eight blocks), so a queue left unfreed by one poll refuses the next
/// round's last post.
#[test]
fn qps_sharing_a_cq_polled_sixteen_at_a_time_free_each_send_queue() {
    use verbs::cq::Wc;
    use verbs::qp::QpCap;
    let mut p = pair(4096);
    let c = QpCap {
        max_send_wr: 8,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let (mut a1, _b1) = qp_pair(&p, QpType::Rc, c);
    let (mut a2, _b2) = qp_pair(&p, QpType::Rc, c);
    let (n1, n2) = (a1.qp_num(), a2.qp_num());
    for round in 0..16u64 {
        let before = cqes_written(&p);
        for i in 0..8 {
            post_writes(&p, &mut a1, round * 100 + i, 1);
            post_writes(&p, &mut a2, 10_000 + round * 100 + i, 1);
        }
        tests::wait::until("16 CQEs", || cqes_written(&p) >= before + 16);
        let mut wc = [Wc::default(); 16];
        assert_eq!(p.a.cq.poll(&mut wc).expect("poll"), 16, "round {round}");
        let mut got: Vec<(u32, u64)> = wc.iter().map(|w| (w.qp_num, w.wr_id)).collect();
        got.sort_unstable();
        let mut want: Vec<(u32, u64)> = (0..8)
            .map(|i| (n1, round * 100 + i))
            .chain((0..8).map(|i| (n2, 10_000 + round * 100 + i)))
            .collect();
        want.sort_unstable();
        assert_eq!(got, want, "round {round}");
        assert!(wc
            .iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::RdmaWrite));
    }
}

#[test]
fn completions_carry_the_device_clock_and_convert_to_wall_time() {
    // On a clock the test holds: two WRITEs completed 1 ms of model time
    // apart are stamped device_frequency_khz cycles apart, and the
    // context's clock info converts the stamps to wall times 1 ms apart.
    let clock = vfio::clock::ManualClock::new();
    let mut p = pair_on(1 << 16, &clock);
    let khz = p.a.ctx.device_frequency_khz();
    assert!(khz > 0, "the profile reports its clock");
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(4));
    let mut stamps = Vec::new();
    for i in 0..2u64 {
        post_writes(&p, &mut qa, i, 1);
        let mut wc = [verbs::cq::WcStamped::default(); 1];
        tests::wait::until("the WRITE's completion", || {
            p.a.cq.poll_stamped(&mut wc).expect("poll") == 1
        });
        assert_eq!(wc[0].wc.wr_id, i);
        assert_eq!(wc[0].wc.status, WcStatus::Success);
        stamps.push(wc[0].timestamp);
        clock.advance(std::time::Duration::from_millis(1));
    }
    assert_eq!(stamps[1] - stamps[0], u64::from(khz), "1 ms of cycles");
    let info = p.a.ctx.clock_info().expect("clock info");
    assert_eq!(info.mask, verbs::clock::CYCLES_MASK);
    let ns = (info.to_ns(stamps[0]), info.to_ns(stamps[1]));
    assert!(
        (ns.1 - ns.0).abs_diff(1_000_000) <= 1,
        "1 ms of wall time: {ns:?}"
    );
    // The snapshot is of the clock as the BAR shows it, beside the wall
    // clock: the stamps lie within a second of it.
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(ns.1.abs_diff(wall) < 1_000_000_000, "{ns:?} vs {wall}");
    // Kept until the context's clock moves on a second, then retaken.
    assert_eq!(p.a.ctx.clock_info().unwrap(), info);
    clock.advance(verbs::clock::CLOCK_INFO_REFRESH);
    let now = stamps[1] + u64::from(khz) + u64::from(khz) * 1000;
    tests::wait::until("the internal timer to catch up", || {
        p.a.ctx.read_clock().unwrap() == now
    });
    let again = p.a.ctx.clock_info().unwrap();
    assert_eq!(again.last_cycles, now & verbs::clock::CYCLES_MASK);
    assert_eq!(again.mult, info.mult);
}
