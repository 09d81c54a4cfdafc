//! Raw Ethernet through the driver: raw packet QPs on two cabled model
//! functions, frames sent in bursts from A, steered on B by flow rules
//! (UDP destination port to one of two QPs, or dropped), received in
//! bursts; data intact, checksums offloaded and checked, counters.

mod verbs_common;
mod wire_common;

use std::time::Instant;

use tests::wait::HANG_GUARD;
use verbs::cq::Cq;
use verbs::flow::{FlowAction, FlowSpec};
use verbs::mr::access;
use verbs::raw_eth::{
    RawPacketQp, RawQpCap, RawSendWr, RawSges, RxPkt, StridingRq, TxFrame, TxPkt, MAX_EMPW_INLINE,
    MAX_INLINE_HEADERS, ONE_BLOCK_INLINE_HEADERS,
};
use verbs::rss::{rx_hash_fields as rh, RxHashConf, Wq, WqCap};
use verbs_common::{fill, pair_profile, read, settle, stats, Side};

/// Bytes of the headers sent inline: Ethernet, IPv4, UDP.
const HDRS: usize = 42;
/// Bytes of each receive buffer.
const RX_BUF: usize = 2048;

/// Ethernet + IPv4 + UDP from 10.0.0.1:`sport` to 10.0.0.2:`dport` for
/// `payload` bytes (the checksums are left to the device).
fn headers(sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    headers_between(([10, 0, 0, 1], sport), ([10, 0, 0, 2], dport), payload)
}

/// [`headers`] from `src` to `dst` (IPv4 address, UDP port).
fn headers_between(src: ([u8; 4], u16), dst: ([u8; 4], u16), payload: usize) -> Vec<u8> {
    let (sport, dport) = (src.1, dst.1);
    let mut h = vec![0u8; HDRS];
    h[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    h[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    h[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    h[14] = 0x45;
    h[16..18].copy_from_slice(&((28 + payload) as u16).to_be_bytes());
    h[22] = 64;
    h[23] = 17;
    h[26..30].copy_from_slice(&src.0);
    h[30..34].copy_from_slice(&dst.0);
    h[34..36].copy_from_slice(&sport.to_be_bytes());
    h[36..38].copy_from_slice(&dport.to_be_bytes());
    h[38..40].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
    h
}

/// A flow matching IPv4 UDP to `dport`.
fn udp_to(dport: u16) -> FlowSpec {
    FlowSpec {
        ethertype: Some(0x0800),
        ip_protocol: Some(17),
        udp_dport: Some(dport),
        ..FlowSpec::default()
    }
}

/// A raw packet QP on side `s` with its own send and receive CQs.
fn raw_qp(s: &Side) -> (RawPacketQp, Cq, Cq) {
    raw_qp_of(
        s,
        RawQpCap {
            log_sq_bbs: 8,
            log_rq_wqes: 6,
            strip_vlan: false,
            tunnel_offloads: false,
            striding: None,
        },
    )
}

/// [`raw_qp`] with rings of `cap`.
fn raw_qp_of(s: &Side, cap: RawQpCap) -> (RawPacketQp, Cq, Cq) {
    let tx = s.ctx.create_cq(256, None, None).unwrap();
    let rx = s.ctx.create_cq(256, None, None).unwrap();
    let qp = s.ctx.create_raw_packet_qp(&s.pd, &tx, &rx, cap).unwrap();
    (qp, tx, rx)
}

/// Receives `n` packets on `qp` (a hang guard, never a measurement).
fn rx_n(qp: &mut RawPacketQp, cq: &mut Cq, n: usize) -> Vec<RxPkt> {
    let mut out = Vec::new();
    let mut burst = [RxPkt::default(); 16];
    let give_up = Instant::now() + HANG_GUARD;
    while out.len() < n {
        let k = qp.rx_burst(cq, &mut burst);
        out.extend_from_slice(&burst[..k]);
        assert!(Instant::now() < give_up, "only {} of {n}", out.len());
        if k == 0 {
            std::thread::yield_now();
        }
    }
    out
}

#[test]
fn raw_frames_burst_from_a_to_b_steered_dropped_and_counted() {
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let (mut q1, _b1_tx, mut b1_rx) = raw_qp(&p.b);
    let (mut q2, _b2_tx, mut b2_rx) = raw_qp(&p.b);
    // B: 16 buffers on each QP, in B's MR from 0 (q1) and 64 KiB (q2).
    for (q, base) in [(&mut q1, 0u64), (&mut q2, 0x10000)] {
        let bufs: Vec<_> = (0..16u64)
            .map(|k| p.b.mr.sge(base + k * RX_BUF as u64, RX_BUF as u32).unwrap())
            .collect();
        assert_eq!(q.post_rx(&bufs), 16);
    }
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let udp = udp_to;
    steer
        .create_flow(&udp(1000), FlowAction::Queue(&q1))
        .unwrap();
    // Port 2000's rule tags what it steers (IBV_FLOW_SPEC_ACTION_TAG);
    // a tag wider than 24 bits is refused.
    assert!(steer
        .create_flow_tagged(&udp(2000), FlowAction::Queue(&q2), 1 << 24)
        .is_err());
    steer
        .create_flow_tagged(&udp(2000), FlowAction::Queue(&q2), 0xabcdef)
        .unwrap();
    steer.create_flow(&udp(3000), FlowAction::Drop).unwrap();
    // A: 12 packets in one burst, payloads in A's MR (no copy: the WQEs
    // point at them), ports in turn 1000, 2000, 3000.
    let ports = [1000u16, 2000, 3000];
    let hdrs: Vec<_> = (0..12)
        .map(|k| headers(5000 + k as u16, ports[k % 3], 100 + k))
        .collect();
    let payloads: Vec<_> = (0..12)
        .map(|k| fill(&p.a.buf, k * 512, 100 + k, k as u8))
        .collect();
    let pkts: Vec<_> = (0..12)
        .map(|k| TxPkt {
            headers: &hdrs[k],
            payload: Some(p.a.mr.sge(k as u64 * 512, 100 + k as u32).unwrap()),
            csum: true,
            mss: 0,
            vlan: None,
        })
        .collect();
    let doorbells = stats(&p.fabric, 0).doorbells;
    assert_eq!(qa.tx_burst(&pkts), 12);
    tx_done(&mut qa, &mut a_tx);
    // The model may have run the WQEs from its sweep of the doorbell
    // records before it saw the UAR doorbell: count after whole passes.
    settle(&p.fabric);
    assert_eq!(
        stats(&p.fabric, 0).doorbells - doorbells,
        1,
        "one doorbell per burst"
    );
    // B: 4 frames on each QP, in order, intact, checksums good.
    for (q, cq, first, base, tag) in [
        (&mut q1, &mut b1_rx, 0, 0usize, 0),
        (&mut q2, &mut b2_rx, 1, 0x10000, 0xabcdef),
    ] {
        let got = rx_n(q, cq, 4);
        for (n, r) in got.iter().enumerate() {
            let k = first + 3 * n;
            assert_eq!(r.error, None, "frame {k}");
            assert_eq!(r.flow_tag, tag, "frame {k}: its rule's tag");
            assert_eq!(r.len as usize, HDRS + 100 + k, "frame {k}");
            assert_eq!(usize::from(r.slot), n);
            assert!(r.ipv4 && r.udp && r.l3_ok && r.l4_ok, "frame {k}: {r:?}");
            let frame = read(&p.b.buf, base + n * RX_BUF, r.len as usize);
            assert_eq!(&frame[HDRS..], &payloads[k][..], "frame {k} payload");
            assert_eq!(&frame[34..38], &hdrs[k][34..38], "frame {k} ports");
        }
    }
    // The port took 12 frames and dropped the 4 to port 3000.
    let sb = stats(&p.fabric, 1);
    assert_eq!(sb.packets_received, 12);
    assert_eq!(sb.dropped, 4);
    assert_eq!(stats(&p.fabric, 0).packets_sent, 12);
    steer.destroy().unwrap();
    for q in [qa, q1, q2] {
        q.destroy().unwrap();
    }
}

#[test]
fn raw_qp_refuses_one_cq_and_short_headers() {
    let p = pair_profile(1 << 16, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let cq = p.a.ctx.create_cq(16, None, None).unwrap();
    let cap = RawQpCap {
        log_sq_bbs: 4,
        log_rq_wqes: 4,
        strip_vlan: false,
        tunnel_offloads: false,
        striding: None,
    };
    assert!(p
        .a
        .ctx
        .create_raw_packet_qp(&p.a.pd, &cq, &cq, cap)
        .is_err());
    let (mut qa, _tx, _rx) = raw_qp(&p.a);
    let short = TxPkt {
        headers: &[0u8; 10],
        payload: None,
        csum: false,
        mss: 0,
        vlan: None,
    };
    assert_eq!(qa.tx_burst(&[short]), 0, "headers shorter than Ethernet's");
    // Destroyed, a raw packet QP gives its UAR page back (DEALLOC_UAR).
    let uars = stats(&p.fabric, 0).uars;
    qa.destroy().unwrap();
    assert_eq!(stats(&p.fabric, 0).uars, uars - 1, "the SQ's UAR freed");
}

/// Waits for the send completion of a burst.
fn tx_done(qp: &mut RawPacketQp, cq: &mut Cq) {
    tests::wait::until("the send completion", || qp.poll_tx(cq).unwrap() > 0);
}

/// Posts `n` receive buffers of [`RX_BUF`] bytes from the start of B's MR.
fn post_b(p: &verbs_common::Pair, qb: &mut RawPacketQp, n: usize) {
    let bufs: Vec<_> = (0..n as u64)
        .map(|k| p.b.mr.sge(k * RX_BUF as u64, RX_BUF as u32).unwrap())
        .collect();
    assert_eq!(qb.post_rx(&bufs), n);
}

/// `lens.len()` UDP frames to port 1000 written 2 KiB apart into A's MR,
/// payload `len` bytes each, a pattern of their number and `round`.
fn frames_in_a(p: &verbs_common::Pair, round: usize, lens: &[usize]) -> Vec<Vec<u8>> {
    lens.iter()
        .enumerate()
        .map(|(k, &len)| {
            let mut f = headers(7000 + k as u16, 1000, len);
            f.extend((0..len).map(|i| (i + k * 7 + round) as u8));
            p.a.buf.write(k * 2048, &f).unwrap();
            f
        })
        .collect()
}

/// Sends `frames` (as [`frames_in_a`] wrote them into A's MR) in one
/// burst on `qa`: headers inline, payloads by reference, checksums
/// offloaded; waits for the send completion.
fn send_frames(p: &verbs_common::Pair, qa: &mut RawPacketQp, a_tx: &mut Cq, frames: &[Vec<u8>]) {
    let pkts: Vec<_> = frames
        .iter()
        .enumerate()
        .map(|(k, f)| TxPkt {
            headers: &f[..HDRS],
            payload: Some(
                p.a.mr
                    .sge((k * 2048 + HDRS) as u64, (f.len() - HDRS) as u32)
                    .unwrap(),
            ),
            csum: true,
            mss: 0,
            vlan: None,
        })
        .collect();
    assert_eq!(qa.tx_burst(&pkts), pkts.len());
    tx_done(qa, a_tx);
}

/// The frames B received in `round` (in B's buffers from its MR's start,
/// as many a round) are `frames`, in order (the receive ring's slots, 64
/// of them), intact but for the checksums the device filled in (which B's
/// CQEs say are good).
fn check_rx(p: &verbs_common::Pair, got: &[RxPkt], frames: &[Vec<u8>], round: usize) {
    for (k, r) in got.iter().enumerate() {
        let slot = (round * frames.len() + k) % 64;
        assert_eq!(
            usize::from(r.slot),
            slot,
            "round {round} frame {k}: in order"
        );
        assert_eq!(r.error, None, "round {round} frame {k}");
        assert!(
            r.ipv4 && r.udp && r.l3_ok && r.l4_ok,
            "round {round} frame {k}: {r:?}"
        );
        let f = &frames[k];
        let got = read(&p.b.buf, k * RX_BUF, r.len as usize);
        assert_eq!(got.len(), f.len(), "round {round} frame {k}");
        assert_eq!(got[..24], f[..24], "round {round} frame {k}");
        assert_eq!(got[26..40], f[26..40], "round {round} frame {k}");
        assert_eq!(got[HDRS..], f[HDRS..], "round {round} frame {k}");
    }
}

/// A's raw packet QP on a 16-block send ring, B's taking IPv4 UDP to port
/// 1000 (its flow steering kept alive with it).
fn small_ring(
    p: &verbs_common::Pair,
) -> (
    RawPacketQp,
    Cq,
    Cq,
    RawPacketQp,
    Cq,
    Cq,
    verbs::flow::FlowSteering,
) {
    let cap = RawQpCap {
        log_sq_bbs: 4,
        log_rq_wqes: 6,
        strip_vlan: false,
        tunnel_offloads: false,
        striding: None,
    };
    let (qa, a_tx, a_rx) = raw_qp_of(&p.a, cap);
    let (qb, b_tx, b_rx) = raw_qp(&p.b);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    steer
        .create_flow(&udp_to(1000), FlowAction::Queue(&qb))
        .unwrap();
    (qa, a_tx, a_rx, qb, b_tx, b_rx, steer)
}

#[test]
fn one_and_two_block_wqes_mix_and_wrap_a_small_ring() {
    // Headers of 14 bytes (Ethernet only: IP and UDP ride in the payload)
    // make one-block WQEs, 42 bytes two-block ones; on a 16-block ring,
    // bursts of 5 + 5 (15 blocks) wrap it, a two-block WQE straddling
    // the ring's end in some rounds.
    const ETH: usize = 14;
    const _: () = assert!(ETH <= ONE_BLOCK_INLINE_HEADERS && HDRS > ONE_BLOCK_INLINE_HEADERS);
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx, mut qb, _b_tx, mut b_rx, steer) = small_ring(&p);
    for round in 0..6usize {
        post_b(&p, &mut qb, 10);
        // Whole frames in A's MR at 2 KiB apart; each packet's inline
        // headers are the frame's first 14 or 42 bytes.
        let lens: Vec<usize> = (0..10).map(|k| 60 + round * 10 + k).collect();
        let frames = frames_in_a(&p, round, &lens);
        let pkts: Vec<_> = (0..10)
            .map(|k| {
                let ihs = if k % 2 == 0 { ETH } else { HDRS };
                TxPkt {
                    headers: &frames[k][..ihs],
                    payload: Some(
                        p.a.mr
                            .sge((k * 2048 + ihs) as u64, (frames[k].len() - ihs) as u32)
                            .unwrap(),
                    ),
                    csum: true,
                    mss: 0,
                    vlan: None,
                }
            })
            .collect();
        assert_eq!(qa.tx_burst(&pkts), 10, "round {round}");
        tx_done(&mut qa, &mut a_tx);
        check_rx(&p, &rx_n(&mut qb, &mut b_rx, 10), &frames, round);
    }
    // An empty 16-block ring takes 8 two-block WQEs of a burst of 12.
    let f = headers(1, 1000, 0);
    let two = TxPkt {
        headers: &f,
        payload: None,
        csum: false,
        mss: 0,
        vlan: None,
    };
    assert_eq!(qa.tx_burst(&[two; 12]), 8, "room for eight");
    assert_eq!(qa.tx_burst(&[two]), 0, "the ring is full");
    tx_done(&mut qa, &mut a_tx);
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
}

/// Enhanced multi-packet sends (`tx_burst_empw`) on ConnectX-5, which
/// offers them and wants no headers inline: six rounds of 20 UDP frames of
/// 60 to 1,000 bytes, the small ones copied into the WQE, the rest by
/// pointer, through a 16-block ring (WQEs fill it, wrap it and wait for
/// room: the burst takes what fits and the rest goes after a completion);
/// B receives every frame in order, intact but for the checksums the
/// device filled in. A frame shorter than an Ethernet header ends a burst;
/// ConnectX-4 Lx (no `enhanced_multi_pkt_send_wqe`) refuses the call.
#[test]
fn enhanced_multi_packet_bursts_arrive_whole_and_in_order() {
    const N: usize = 20;
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx, mut qb, _b_tx, mut b_rx, steer) = small_ring(&p);
    let (mut inline, mut by_ref) = (0, 0);
    for round in 0..6usize {
        post_b(&p, &mut qb, N);
        let lens: Vec<usize> = (0..N).map(|k| 18 + (round * 37 + k * 53) % 940).collect();
        let frames = frames_in_a(&p, round, &lens);
        let tx: Vec<_> = frames
            .iter()
            .enumerate()
            .map(|(k, f)| {
                if f.len() <= MAX_EMPW_INLINE && k % 2 == 0 {
                    inline += 1;
                    TxFrame::Inline(f)
                } else {
                    by_ref += 1;
                    TxFrame::Ref(p.a.mr.sge((k * 2048) as u64, f.len() as u32).unwrap())
                }
            })
            .collect();
        let mut sent = 0;
        while sent < N {
            let k = qa.tx_burst_empw(&tx[sent..], true).unwrap();
            sent += k;
            if k == 0 || qa.tx_in_flight() > 0 {
                tx_done(&mut qa, &mut a_tx);
            }
        }
        check_rx(&p, &rx_n(&mut qb, &mut b_rx, N), &frames, round);
    }
    assert!(
        inline > 10 && by_ref > 50,
        "both kinds: {inline} inline, {by_ref} by pointer"
    );
    // A short frame ends the burst after the frames before it.
    let f = headers(1, 1000, 0);
    let short = [
        TxFrame::Inline(&f),
        TxFrame::Inline(&f[..10]),
        TxFrame::Inline(&f),
    ];
    assert_eq!(qa.tx_burst_empw(&short, false).unwrap(), 1);
    tx_done(&mut qa, &mut a_tx);
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();

    let p = pair_profile(1 << 16, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, _tx, _rx) = raw_qp(&p.a);
    assert!(
        qa.tx_burst_empw(&[TxFrame::Inline(&f)], false).is_err(),
        "no eMPW"
    );
}

/// A VXLAN frame (RFC 7348): UDP from A to B's port 4789 carrying the
/// VXLAN header (`flags`, `vni`) and an inner UDP frame to `inner_dport`.
fn vxlan_frame(flags: u8, vni: u32, inner_dport: u16) -> Vec<u8> {
    let mut inner = headers(5555, inner_dport, 16);
    inner.extend([0x11; 16]);
    let mut f = headers_between(
        ([10, 0, 0, 1], 40000),
        ([10, 0, 0, 2], 4789),
        8 + inner.len(),
    );
    f.extend([flags, 0, 0, 0]);
    f.extend(&vni.to_be_bytes()[1..]);
    f.push(0);
    f.extend(inner);
    f
}

/// VXLAN flow specs: on B, port 4789 parsed as VXLAN
/// (`add_vxlan_udp_dport`), two rules on VNI 42 by the inner UDP port and
/// a plain rule on outer UDP port 4789 after them. Each frame lands where
/// its VNI and inner headers say: a VNI no rule names, or a VXLAN header
/// without its I flag, falls to the outer rule; once the port is deleted
/// nothing is parsed as VXLAN. Bad specs are refused.
#[test]
fn vxlan_specs_steer_by_vni_and_inner_headers() {
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let mut qb: Vec<_> = (0..3).map(|_| raw_qp(&p.b)).collect();
    p.b.ctx.add_vxlan_udp_dport(4789).unwrap();
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let vxlan = |vni: u32, dport: u16| FlowSpec {
        vxlan_vni: Some(vni),
        inner: Some(Box::new(udp_to(dport))),
        ..FlowSpec::default()
    };
    steer
        .create_flow(&vxlan(42, 1000), FlowAction::Queue(&qb[0].0))
        .unwrap();
    steer
        .create_flow(&vxlan(42, 2000), FlowAction::Queue(&qb[1].0))
        .unwrap();
    steer
        .create_flow(&udp_to(4789), FlowAction::Queue(&qb[2].0))
        .unwrap();
    let cases = [
        (vxlan_frame(0x08, 42, 1000), 0),
        (vxlan_frame(0x08, 42, 2000), 1),
        (vxlan_frame(0x08, 7, 1000), 2),
        (vxlan_frame(0x00, 42, 1000), 2),
    ];
    let mut send = |f: &[u8]| {
        let pkt = TxPkt {
            headers: &f[..HDRS],
            payload: None,
            csum: true,
            mss: 0,
            vlan: None,
        };
        p.a.buf.write(0, &f[HDRS..]).unwrap();
        let pkt = TxPkt {
            payload: Some(p.a.mr.sge(0, (f.len() - HDRS) as u32).unwrap()),
            ..pkt
        };
        assert_eq!(qa.tx_burst(&[pkt]), 1);
        tx_done(&mut qa, &mut a_tx);
    };
    for (k, (f, to)) in cases.iter().enumerate() {
        let (q, _, rx) = &mut qb[*to];
        assert_eq!(q.post_rx(&[p.b.mr.sge(0, RX_BUF as u32).unwrap()]), 1);
        send(f);
        let got = rx_n(q, rx, 1);
        assert_eq!(got[0].len as usize, f.len(), "frame {k} on queue {to}");
        assert_eq!(read(&p.b.buf, 0, f.len())[HDRS..], f[HDRS..], "frame {k}");
    }
    // Port 4789 no longer VXLAN: the VNI 42 frame is plain UDP.
    p.b.ctx.delete_vxlan_udp_dport(4789).unwrap();
    let (q, _, rx) = &mut qb[2];
    assert_eq!(q.post_rx(&[p.b.mr.sge(0, RX_BUF as u32).unwrap()]), 1);
    send(&cases[0].0);
    assert_eq!(rx_n(q, rx, 1)[0].len as usize, cases[0].0.len());
    for bad in [
        vxlan(1 << 24, 1000),
        FlowSpec {
            inner: Some(Box::new(udp_to(1))),
            ..FlowSpec::default()
        },
        FlowSpec {
            vxlan_vni: Some(1),
            inner: Some(Box::new(vxlan(2, 3))),
            ..FlowSpec::default()
        },
    ] {
        assert!(
            steer.create_flow(&bad, FlowAction::Drop).is_err(),
            "{bad:?}"
        );
    }
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    for (q, _, _) in qb {
        q.destroy().unwrap();
    }
}

/// A striding RQ (multi-packet receive, DPDK's MPRQ) on B: buffers of 512
/// strides of 64 bytes (32 KiB), 120 frames of 60 to 1,500 bytes land one
/// after another in them, each at its stride (`RxPkt::offset`), intact; a
/// frame that no longer fits a buffer goes to the next one (the device's
/// filler completion is not a packet); a buffer whose strides are all used
/// is free again. Geometry out of range is refused.
#[test]
fn striding_rq_packs_frames_into_buffers_by_stride() {
    const BUF: u64 = 32 << 10;
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let st = StridingRq {
        log_num_strides: 9,
        log_stride_size: 6,
    };
    let cap = RawQpCap {
        log_sq_bbs: 8,
        log_rq_wqes: 2,
        strip_vlan: false,
        tunnel_offloads: false,
        striding: Some(st),
    };
    let (mut qb, _b_tx, mut b_rx) = raw_qp_of(&p.b, cap);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    steer
        .create_flow(&udp_to(1000), FlowAction::Queue(&qb))
        .unwrap();
    let bufs: Vec<_> = (0..4)
        .map(|k| p.b.mr.sge(k * BUF, BUF as u32).unwrap())
        .collect();
    assert_eq!(qb.post_rx(&bufs), 4);
    let lens: Vec<usize> = (0..120).map(|k| 18 + (k * 389) % 1440).collect();
    let mut all = Vec::new();
    let mut got = Vec::new();
    for chunk in lens.chunks(30) {
        let frames = frames_in_a(&p, all.len(), chunk);
        send_frames(&p, &mut qa, &mut a_tx, &frames);
        got.extend(rx_n(&mut qb, &mut b_rx, frames.len()));
        all.extend(frames);
    }
    let mut end = (0u16, 0u32);
    for (k, (r, f)) in got.iter().zip(&all).enumerate() {
        assert_eq!(r.error, None, "frame {k}");
        assert!(r.l3_ok && r.l4_ok, "frame {k}: {r:?}");
        assert_eq!(r.len as usize, f.len(), "frame {k}");
        // In order: after the last frame's strides, or at the start of
        // the next buffer.
        assert!(
            (r.slot, r.offset) == end || (r.slot == end.0 + 1 && r.offset == 0),
            "frame {k} at {:?}, the last ended at {end:?}",
            (r.slot, r.offset)
        );
        assert_eq!(r.offset % 64, 0, "frame {k} starts a stride");
        let at = u64::from(r.slot) * BUF + u64::from(r.offset);
        let b = read(&p.b.buf, at as usize, f.len());
        assert_eq!(b[..24], f[..24], "frame {k}");
        assert_eq!(b[26..40], f[26..40], "frame {k}");
        assert_eq!(b[HDRS..], f[HDRS..], "frame {k}");
        end = (r.slot, r.offset + (f.len() as u32).next_multiple_of(64));
    }
    assert!(end.0 >= 2, "the frames spread over three buffers: {end:?}");
    // The first two buffers are used up: two slots free again.
    assert_eq!(qb.post_rx(&bufs[..3]), 2);
    for bad in [
        StridingRq {
            log_num_strides: 9,
            log_stride_size: 5,
        },
        StridingRq {
            log_num_strides: 20,
            log_stride_size: 6,
        },
    ] {
        let cap = RawQpCap {
            striding: Some(bad),
            ..cap
        };
        let tx = p.b.ctx.create_cq(16, None, None).unwrap();
        let rx = p.b.ctx.create_cq(16, None, None).unwrap();
        assert!(
            p.b.ctx
                .create_raw_packet_qp(&p.b.pd, &tx, &rx, cap)
                .is_err(),
            "{bad:?}"
        );
    }
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
}

#[test]
fn vlan_tags_inserted_by_the_driver_and_stripped_into_the_completion_only_where_asked() {
    // An 802.1Q-tagged frame (TCI 0x2064: priority 1, VLAN 100), its 18
    // bytes of Ethernet and tag inline; to UDP port 1000 (a QP that
    // strips) and 2000 (one that keeps the tag, as mlx5_ib's default).
    const TCI: u16 = 0x2064;
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let strip = RawQpCap {
        log_sq_bbs: 8,
        log_rq_wqes: 6,
        strip_vlan: true,
        tunnel_offloads: false,
        striding: None,
    };
    let (mut qs, _s_tx, mut s_rx) = raw_qp_of(&p.b, strip);
    let (mut qk, _k_tx, mut k_rx) = raw_qp(&p.b);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    for (q, dport) in [(&qs, 1000), (&qk, 2000)] {
        let spec = udp_to(dport);
        steer.create_flow(&spec, FlowAction::Queue(q)).unwrap();
    }
    assert_eq!(qs.post_rx(&[p.b.mr.sge(0, RX_BUF as u32).unwrap()]), 1);
    assert_eq!(
        qk.post_rx(&[p.b.mr.sge(RX_BUF as u64, RX_BUF as u32).unwrap()]),
        1
    );
    let tagged = |dport: u16| {
        let untagged = headers(9, dport, 32);
        let mut f = untagged[..12].to_vec();
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&TCI.to_be_bytes());
        f.extend_from_slice(&untagged[12..]);
        f.extend((0..32u8).map(|i| i ^ 0x5a));
        (f, untagged)
    };
    let (f1, plain1) = tagged(1000);
    let (f2, _) = tagged(2000);
    p.a.buf.write(0, &f1).unwrap();
    p.a.buf.write(2048, &f2).unwrap();
    let sge = |f: &[u8], off: u64| Some(p.a.mr.sge(off + 18, (f.len() - 18) as u32).unwrap());
    let pkts = [
        TxPkt {
            headers: &f1[..18],
            payload: sge(&f1, 0),
            csum: true,
            mss: 0,
            vlan: None,
        },
        TxPkt {
            headers: &f2[..18],
            payload: sge(&f2, 2048),
            csum: true,
            mss: 0,
            vlan: None,
        },
    ];
    assert_eq!(qa.tx_burst(&pkts), 2);
    tx_done(&mut qa, &mut a_tx);
    let s = rx_n(&mut qs, &mut s_rx, 1)[0];
    assert_eq!(s.error, None);
    assert_eq!(s.vlan, Some(TCI), "stripped into the CQE");
    assert_eq!(s.len as usize, f1.len() - 4, "the tag left the frame");
    let got = read(&p.b.buf, 0, s.len as usize);
    assert_eq!(got[..24], plain1[..24]);
    assert_eq!(got[42..], f1[46..]);
    assert!(s.ipv4 && s.udp && s.l3_ok && s.l4_ok, "{s:?}");
    let k = rx_n(&mut qk, &mut k_rx, 1)[0];
    assert_eq!(k.error, None);
    assert_eq!(k.vlan, None, "nothing stripped, nothing said");
    assert_eq!(k.len as usize, f2.len());
    let got = read(&p.b.buf, RX_BUF, k.len as usize);
    assert_eq!(got[12..16], f2[12..16], "the tag is still in the frame");
    assert_eq!(got[46..], f2[46..]);
    // The same frames sent untagged with TxPkt::vlan: the driver inserts
    // the tag into the inline headers (14 bytes + tag: a one-block WQE;
    // 42 + tag: two blocks).
    assert_eq!(
        qs.post_rx(&[p.b.mr.sge(2 * RX_BUF as u64, RX_BUF as u32).unwrap()]),
        1
    );
    assert_eq!(
        qk.post_rx(&[p.b.mr.sge(3 * RX_BUF as u64, RX_BUF as u32).unwrap()]),
        1
    );
    let mut plain2 = tagged(2000).1;
    plain2.extend((0..32u8).map(|i| i ^ 0x5a));
    let mut plain1 = plain1;
    plain1.extend((0..32u8).map(|i| i ^ 0x5a));
    p.a.buf.write(4096, &plain1).unwrap();
    p.a.buf.write(6144, &plain2).unwrap();
    let rest = |f: &[u8], off: u64, h: usize| {
        Some(p.a.mr.sge(off + h as u64, (f.len() - h) as u32).unwrap())
    };
    let pkts = [
        TxPkt {
            headers: &plain1[..14],
            payload: rest(&plain1, 4096, 14),
            csum: true,
            mss: 0,
            vlan: Some(TCI),
        },
        TxPkt {
            headers: &plain2[..42],
            payload: rest(&plain2, 6144, 42),
            csum: true,
            mss: 0,
            vlan: Some(TCI),
        },
    ];
    assert_eq!(qa.tx_burst(&pkts), 2);
    tx_done(&mut qa, &mut a_tx);
    let s = rx_n(&mut qs, &mut s_rx, 1)[0];
    assert_eq!(
        (s.error, s.vlan),
        (None, Some(TCI)),
        "inserted, then stripped"
    );
    assert!(s.l3_ok && s.l4_ok, "{s:?}");
    // As sent but for the checksums the device filled in.
    let got = read(&p.b.buf, 2 * RX_BUF, s.len as usize);
    assert_eq!(got.len(), plain1.len());
    assert_eq!((&got[..24], &got[42..]), (&plain1[..24], &plain1[42..]));
    let k = rx_n(&mut qk, &mut k_rx, 1)[0];
    assert_eq!((k.error, k.vlan), (None, None));
    assert!(k.l3_ok && k.l4_ok, "{k:?}");
    let got = read(&p.b.buf, 3 * RX_BUF, k.len as usize);
    assert_eq!(got.len(), f2.len(), "tagged as f2");
    assert_eq!((&got[..28], &got[46..]), (&f2[..28], &f2[46..]));
    // Headers that leave no room for the tag end the burst there.
    let long = vec![0u8; MAX_INLINE_HEADERS];
    let too_long = TxPkt {
        headers: &long,
        payload: None,
        csum: false,
        mss: 0,
        vlan: Some(TCI),
    };
    assert_eq!(qa.tx_burst(&[too_long]), 0);
    steer.destroy().unwrap();
    for q in [qa, qs, qk] {
        q.destroy().unwrap();
    }
}

#[test]
fn a_large_tcp_segment_leaves_cut_at_the_mss() {
    // One TCP segment of 3000 payload bytes, MSS 1000: B takes three
    // frames of 1054 bytes with consecutive IP ids and sequence numbers,
    // PSH and FIN on the last only, checksums good; the port counts three.
    const H: usize = 54;
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let (mut qb, _b_tx, mut b_rx) = raw_qp(&p.b);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let spec = FlowSpec {
        ethertype: Some(0x0800),
        ip_protocol: Some(6),
        ..FlowSpec::default()
    };
    steer.create_flow(&spec, FlowAction::Queue(&qb)).unwrap();
    let bufs: Vec<_> = (0..3u64)
        .map(|k| p.b.mr.sge(k * RX_BUF as u64, RX_BUF as u32).unwrap())
        .collect();
    assert_eq!(qb.post_rx(&bufs), 3);
    let mut h = headers(5555, 80, 0)[..34].to_vec();
    h[16..18].copy_from_slice(&((20 + 20 + 3000) as u16).to_be_bytes());
    h[18..20].copy_from_slice(&0x1234u16.to_be_bytes());
    h[23] = 6;
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&5555u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
    tcp[4..8].copy_from_slice(&0x1000_0000u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x19; // FIN, PSH, ACK
    h.extend_from_slice(&tcp);
    assert_eq!(h.len(), H);
    let payload = fill(&p.a.buf, 0, 3000, 3);
    let pkt = TxPkt {
        headers: &h,
        payload: Some(p.a.mr.sge(0, 3000).unwrap()),
        csum: true,
        mss: 1000,
        vlan: None,
    };
    let sent = stats(&p.fabric, 0).packets_sent;
    assert_eq!(qa.tx_burst(&[pkt]), 1);
    tx_done(&mut qa, &mut a_tx);
    let got = rx_n(&mut qb, &mut b_rx, 3);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.error, None, "frame {i}");
        assert_eq!(r.len as usize, H + 1000, "frame {i}");
        assert!(r.ipv4 && r.l3_ok && r.l4_ok && !r.udp, "frame {i}: {r:?}");
        let f = read(&p.b.buf, i * RX_BUF, r.len as usize);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 1040, "total length");
        assert_eq!(u16::from_be_bytes([f[18], f[19]]), 0x1234 + i as u16, "id");
        let seq = u32::from_be_bytes(f[38..42].try_into().unwrap());
        assert_eq!(seq, 0x1000_0000 + 1000 * i as u32, "sequence");
        assert_eq!(f[47] & 0x09 != 0, i == 2, "PSH/FIN on the last only");
        assert_eq!(&f[H..], &payload[1000 * i..1000 * (i + 1)], "frame {i}");
    }
    assert_eq!(stats(&p.fabric, 0).packets_sent - sent, 3);
    // An LSO of something that is not TCP: a length error, the SQ in error.
    let udp = headers(1, 2, 10);
    let bad = TxPkt {
        headers: &udp,
        payload: Some(p.a.mr.sge(0, 10).unwrap()),
        csum: true,
        mss: 4,
        vlan: None,
    };
    assert_eq!(qa.tx_burst(&[bad]), 1);
    let mut err = None;
    tests::wait::until("the LSO's completion", || match qa.poll_tx(&mut a_tx) {
        Ok(0) => false,
        Ok(n) => panic!("{n} completions for a non-TCP LSO"),
        Err(e) => {
            err = Some(e);
            true
        }
    });
    assert_eq!(err, Some(verbs::cq::WcStatus::LocLenErr));
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
}

#[test]
fn completions_carry_the_device_clock_that_read_clock_reads() {
    // On a clock the test holds: two frames received 1 ms of model time
    // apart are stamped device_frequency_khz cycles apart, and the init
    // segment's internal timer reads what the later stamp says.
    let clock = vfio::clock::ManualClock::new();
    let p = verbs_common::pair_on(1 << 20, &clock);
    let khz = u64::from(p.b.ctx.hca().caps().gen().device_frequency_khz());
    assert!(khz > 0, "the profile reports its clock");
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let (mut qb, _b_tx, mut b_rx) = raw_qp(&p.b);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let spec = udp_to(1000);
    steer.create_flow(&spec, FlowAction::Queue(&qb)).unwrap();
    let bufs: Vec<_> = (0..2u64)
        .map(|k| p.b.mr.sge(k * RX_BUF as u64, RX_BUF as u32).unwrap())
        .collect();
    assert_eq!(qb.post_rx(&bufs), 2);
    let h = headers(1, 1000, 0);
    let pkt = TxPkt {
        headers: &h,
        payload: None,
        csum: true,
        mss: 0,
        vlan: None,
    };
    let mut stamps = Vec::new();
    for _ in 0..2 {
        assert_eq!(qa.tx_burst(&[pkt]), 1);
        tx_done(&mut qa, &mut a_tx);
        let r = rx_n(&mut qb, &mut b_rx, 1)[0];
        assert_eq!(r.error, None);
        stamps.push(r.timestamp);
        clock.advance(std::time::Duration::from_millis(1));
    }
    assert_eq!(stamps[1] - stamps[0], khz, "1 ms of device cycles");
    // The timer is written on the firmware's beat: wait for it to show
    // the time now (one more millisecond), then it reads exactly that.
    let now = stamps[1] + khz;
    tests::wait::until("the internal timer to catch up", || {
        p.b.ctx.read_clock().unwrap() == now
    });
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
}

/// Microsoft's RSS verification suite ("Verifying the RSS Hash
/// Calculation"): its key, and for each flow the source and destination
/// (address, port) with the published hashes over the IPv4 addresses alone
/// and with the ports too. An outside reference for the device's Toeplitz.
const MS_RSS_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];
#[allow(clippy::type_complexity)]
const MS_RSS_FLOWS: [(([u8; 4], u16), ([u8; 4], u16), u32, u32); 5] = [
    (
        ([66, 9, 149, 187], 2794),
        ([161, 142, 100, 80], 1766),
        0x323e_8fc2,
        0x51cc_c178,
    ),
    (
        ([199, 92, 111, 2], 14230),
        ([65, 69, 140, 83], 4739),
        0xd718_262a,
        0xc626_b0ea,
    ),
    (
        ([24, 19, 198, 95], 12898),
        ([12, 22, 207, 184], 38024),
        0xd2d0_a5de,
        0x5c2b_394a,
    ),
    (
        ([38, 27, 205, 30], 48228),
        ([209, 142, 163, 6], 2217),
        0x8298_9176,
        0xafc7_327f,
    ),
    (
        ([153, 39, 163, 191], 44251),
        ([202, 188, 127, 2], 1303),
        0x5d18_09c5,
        0x10e8_28a2,
    ),
];

/// RSS (issue 26): four receive work queues behind an indirection table,
/// an RSS QP hashing with Microsoft's verification key, every UDP frame
/// steered to it. Each of the suite's five flows lands on the queue its
/// published hash picks (hash mod 4) with that hash in its completion:
/// over the IPv4 addresses and UDP ports, then, with a new RSS QP, over
/// the addresses alone.
#[test]
fn rss_spreads_frames_over_work_queues_by_the_published_toeplitz_hashes() {
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let (mut cqs, mut wqs, table) = rss_queues(&p.b, 16);
    let slot = |q: usize, k: usize| ((q * 16 + k) * RX_BUF) as u64;
    let all_udp = FlowSpec {
        ethertype: Some(0x0800),
        ip_protocol: Some(17),
        ..FlowSpec::default()
    };
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let mut next = [0usize; 4];
    let ports = rh::SRC_IPV4 | rh::DST_IPV4 | rh::SRC_PORT_UDP | rh::DST_PORT_UDP;
    for (fields, with_ports) in [(ports, true), (rh::SRC_IPV4 | rh::DST_IPV4, false)] {
        let conf = RxHashConf {
            table: &table,
            key: MS_RSS_KEY,
            fields,
        };
        let rss = p.b.ctx.create_rss_qp(&conf).unwrap();
        let flow = steer.create_flow(&all_udp, FlowAction::Rss(&rss)).unwrap();
        for (i, (src, dst, h_ip, h_ports)) in MS_RSS_FLOWS.iter().enumerate() {
            let mut f = headers_between(*src, *dst, 16);
            f.extend([i as u8; 16]);
            p.a.buf.write(i * 256, &f).unwrap();
            let pkt = TxPkt {
                headers: &f,
                payload: None,
                csum: true,
                mss: 0,
                vlan: None,
            };
            assert_eq!(qa.tx_burst(&[pkt]), 1);
            tx_done(&mut qa, &mut a_tx);
            let want = if with_ports { *h_ports } else { *h_ip };
            let q = want as usize % 4;
            let mut got = [RxPkt::default()];
            tests::wait::until("the frame on the queue its hash picks", || {
                wqs[q].rx_burst(&mut cqs[q], &mut got) == 1
            });
            let r = got[0];
            assert_eq!(r.error, None, "flow {i}");
            assert_eq!(r.rss_hash, want, "flow {i}: the published hash");
            assert_eq!(usize::from(r.slot), next[q], "flow {i}");
            let data = read(&p.b.buf, slot(q, next[q]) as usize + HDRS, 16);
            assert_eq!(data, vec![i as u8; 16], "flow {i}: its payload");
            next[q] += 1;
        }
        steer.destroy_flow(flow).unwrap();
        rss.destroy().unwrap();
    }
    // Nothing went astray: every queue empty now.
    steer.destroy().unwrap();
    rss_queues_empty(&p, cqs, wqs, table);
    qa.destroy().unwrap();
}

/// On side `s`, four receive work queues, each on a CQ of its own with
/// `per` buffers of [`RX_BUF`] bytes posted (queue `q`'s buffer `k` at
/// `(q * per + k) * RX_BUF`), and an indirection table over them.
fn rss_queues(s: &Side, per: usize) -> (Vec<Cq>, Vec<Wq>, verbs::rss::RwqIndTable) {
    let cap = WqCap {
        log_wqes: 4,
        strip_vlan: false,
    };
    let cqs: Vec<Cq> = (0..4)
        .map(|_| s.ctx.create_cq(64, None, None).unwrap())
        .collect();
    let mut wqs: Vec<Wq> = cqs
        .iter()
        .map(|cq| s.ctx.create_wq(&s.pd, cq, cap).unwrap())
        .collect();
    let table = s
        .ctx
        .create_rwq_ind_table(&wqs.iter().collect::<Vec<_>>())
        .unwrap();
    for (q, w) in wqs.iter_mut().enumerate() {
        let bufs: Vec<_> = (0..per)
            .map(|k| {
                s.mr.sge(((q * per + k) * RX_BUF) as u64, RX_BUF as u32)
                    .unwrap()
            })
            .collect();
        assert_eq!(w.post_rx(&bufs), per);
    }
    (cqs, wqs, table)
}

/// Every queue of [`rss_queues`] empty once the models settled, then the
/// table and the queues destroyed.
fn rss_queues_empty(
    p: &verbs_common::Pair,
    mut cqs: Vec<Cq>,
    mut wqs: Vec<Wq>,
    table: verbs::rss::RwqIndTable,
) {
    settle(&p.fabric);
    for (w, cq) in wqs.iter_mut().zip(cqs.iter_mut()) {
        assert_eq!(w.rx_burst(cq, &mut [RxPkt::default()]), 0);
    }
    table.destroy().unwrap();
    for w in wqs {
        w.destroy().unwrap();
    }
}

/// [`vxlan_frame`] (VNI 42, the I flag) whose inner frame goes from `src`
/// to `dst` with its IPv4 header checksum filled in (spoilt if `bad`);
/// its UDP checksum is none (0), as a tunnel endpoint may send it.
fn vxlan_between(src: ([u8; 4], u16), dst: ([u8; 4], u16), bad: bool) -> Vec<u8> {
    let mut inner = headers_between(src, dst, 16);
    let sum = inner[14..34]
        .chunks(2)
        .fold(0u32, |a, w| a + u32::from(u16::from_be_bytes([w[0], w[1]])));
    let folded = (sum & 0xffff) + (sum >> 16);
    let c = !(((folded & 0xffff) + (folded >> 16)) as u16) ^ if bad { 0x0101 } else { 0 };
    inner[24..26].copy_from_slice(&c.to_be_bytes());
    inner.extend([0x22; 16]);
    let mut f = headers_between(
        ([10, 0, 0, 1], 40000),
        ([10, 0, 0, 2], 4789),
        8 + inner.len(),
    );
    f.extend([0x08, 0, 0, 0, 0, 0, 42, 0]);
    f.extend(inner);
    f
}

/// Tunnel offloads: on B, port 4789 parsed as VXLAN. A raw packet QP
/// made with `tunnel_offloads` gets VXLAN frames marked tunnelled, their
/// types and checksum verdicts the inner packet's (an inner IPv4 header
/// with a bad checksum is not `l3_ok`, though the outer is good); one made
/// without sees the outer headers. An RSS QP hashing the inner IPv4
/// addresses (`IBV_RX_HASH_INNER`) spreads VXLAN frames by their inner
/// flows with Microsoft's published Toeplitz values.
#[test]
fn tunnel_offloads_report_and_hash_the_inner_packet() {
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    p.b.ctx.add_vxlan_udp_dport(4789).unwrap();
    let cap = RawQpCap {
        log_sq_bbs: 4,
        log_rq_wqes: 4,
        strip_vlan: false,
        tunnel_offloads: true,
        striding: None,
    };
    let mut parsing = raw_qp_of(&p.b, cap);
    let mut plain = raw_qp(&p.b);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let by_inner = |dport: u16| FlowSpec {
        vxlan_vni: Some(42),
        inner: Some(Box::new(udp_to(dport))),
        ..FlowSpec::default()
    };
    let mut send = |f: &[u8]| {
        p.a.buf.write(0, f).unwrap();
        let pkt = TxPkt {
            headers: &f[..HDRS],
            payload: Some(p.a.mr.sge(HDRS as u64, (f.len() - HDRS) as u32).unwrap()),
            csum: true,
            mss: 0,
            vlan: None,
        };
        assert_eq!(qa.tx_burst(&[pkt]), 1);
        tx_done(&mut qa, &mut a_tx);
    };
    let flows = [
        steer
            .create_flow(&by_inner(1000), FlowAction::Queue(&parsing.0))
            .unwrap(),
        steer
            .create_flow(&by_inner(2000), FlowAction::Queue(&plain.0))
            .unwrap(),
    ];
    let src = ([192, 168, 1, 1], 5000);
    for (k, (dport, bad)) in [(1000, false), (1000, true), (2000, false)]
        .into_iter()
        .enumerate()
    {
        let f = vxlan_between(src, ([192, 168, 1, 2], dport), bad);
        let (q, _, rx) = if dport == 1000 {
            &mut parsing
        } else {
            &mut plain
        };
        assert_eq!(q.post_rx(&[p.b.mr.sge(0, RX_BUF as u32).unwrap()]), 1);
        send(&f);
        let r = rx_n(q, rx, 1)[0];
        assert_eq!(r.len as usize, f.len(), "frame {k}");
        // Intact but for the outer checksums the device filled in.
        assert_eq!(read(&p.b.buf, 0, f.len())[HDRS..], f[HDRS..], "frame {k}");
        assert_eq!(
            (r.tunneled, r.ipv4, r.udp, r.l3_ok, r.l4_ok),
            (dport == 1000, true, true, !bad, !bad),
            "frame {k}: {r:?}"
        );
    }
    for f in flows {
        steer.destroy_flow(f).unwrap();
    }

    // Inner RSS over four work queues.
    let (mut cqs, mut wqs, table) = rss_queues(&p.b, 8);
    let conf = RxHashConf {
        table: &table,
        key: MS_RSS_KEY,
        fields: rh::SRC_IPV4 | rh::DST_IPV4 | rh::INNER,
    };
    let rss = p.b.ctx.create_rss_qp(&conf).unwrap();
    let flow = steer
        .create_flow(&udp_to(4789), FlowAction::Rss(&rss))
        .unwrap();
    for (i, (src, dst, h_ip, _)) in MS_RSS_FLOWS.iter().enumerate() {
        send(&vxlan_between(*src, *dst, false));
        let q = *h_ip as usize % 4;
        let mut got = [RxPkt::default()];
        tests::wait::until("the frame on the queue its inner hash picks", || {
            wqs[q].rx_burst(&mut cqs[q], &mut got) == 1
        });
        let r = got[0];
        assert_eq!(r.rss_hash, *h_ip, "flow {i}: the published hash");
        assert!(r.tunneled && r.l3_ok, "flow {i}: {r:?}");
    }
    steer.destroy_flow(flow).unwrap();
    rss.destroy().unwrap();
    steer.destroy().unwrap();
    rss_queues_empty(&p, cqs, wqs, table);
    qa.destroy().unwrap();
    parsing.0.destroy().unwrap();
    plain.0.destroy().unwrap();
}

/// What an RSS QP and its table refuse, as mlx5_ib does: a table of other
/// than 2^n queues, IPv4 with IPv6 fields, TCP with UDP fields, no fields
/// over several queues (a one-queue table takes none), fields it does not
/// know.
#[test]
fn rss_refusals() {
    let p = pair_profile(1 << 16, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let cq = p.b.ctx.create_cq(64, None, None).unwrap();
    let cap = WqCap {
        log_wqes: 2,
        strip_vlan: false,
    };
    let wqs: Vec<Wq> = (0..3)
        .map(|_| p.b.ctx.create_wq(&p.b.pd, &cq, cap).unwrap())
        .collect();
    let three: Vec<&Wq> = wqs.iter().collect();
    assert!(p.b.ctx.create_rwq_ind_table(&three).is_err(), "3 queues");
    assert!(p.b.ctx.create_rwq_ind_table(&[]).is_err(), "none");
    let two = p.b.ctx.create_rwq_ind_table(&three[..2]).unwrap();
    let one = p.b.ctx.create_rwq_ind_table(&three[..1]).unwrap();
    // Repeats are allowed (rdma-core's tables are 2^n WQ pointers).
    let rep =
        p.b.ctx
            .create_rwq_ind_table(&[three[0], three[1], three[0], three[2]])
            .unwrap();
    let conf = |table, fields| RxHashConf {
        table,
        key: MS_RSS_KEY,
        fields,
    };
    for (fields, what) in [
        (rh::SRC_IPV4 | rh::DST_IPV6, "IPv4 with IPv6"),
        (rh::SRC_PORT_TCP | rh::DST_PORT_UDP, "TCP with UDP"),
        (0, "no fields over two queues"),
        (1 << 8, "IPsec SPI"),
        (1 << 31, "inner headers"),
    ] {
        let e = p.b.ctx.create_rss_qp(&conf(&two, fields));
        assert!(e.is_err(), "{what}: {e:?}");
    }
    let none = p.b.ctx.create_rss_qp(&conf(&one, 0)).unwrap();
    let v6 = rh::SRC_IPV6 | rh::DST_IPV6 | rh::SRC_PORT_TCP;
    let tcp6 = p.b.ctx.create_rss_qp(&conf(&rep, v6)).unwrap();
    for q in [none, tcp6] {
        q.destroy().unwrap();
    }
    for t in [two, one, rep] {
        t.destroy().unwrap();
    }
}

/// Raw Ethernet across the wire (issue 26): two fabrics in this process,
/// their ports linked by a socket of each kind. Frames A's raw packet QP
/// sends leave on the link (a function's SQ frames go to the cable's
/// other functions and to the link), B's NIC takes them in, its flow rule
/// steers them to its QP; and back. Each link counts the frames it handed
/// to the NICs as raw, none as malformed.
#[test]
fn raw_frames_cross_a_link_to_another_fabric_and_back() {
    use wire_common::{linked, Sock};
    for k in [Sock::DgramUnix, Sock::StreamTcp] {
        let d = mlx5_emu::wire::WireFaults::default();
        let l = linked(k, "raw", d, d);
        let (mut qa, mut a_tx, mut a_rx) = raw_qp(&l.a);
        let (mut qb, mut b_tx, mut b_rx) = raw_qp(&l.b);
        let mut sa = l.a.ctx.flow_steering().unwrap();
        let mut sb = l.b.ctx.flow_steering().unwrap();
        sa.create_flow(&udp_to(1000), FlowAction::Queue(&qa))
            .unwrap();
        sb.create_flow(&udp_to(2000), FlowAction::Queue(&qb))
            .unwrap();
        for (q, side) in [(&mut qa, &l.a), (&mut qb, &l.b)] {
            let bufs: Vec<_> = (0..N)
                .map(|i| {
                    side.mr
                        .sge((0x8_0000 + i * RX_BUF) as u64, RX_BUF as u32)
                        .unwrap()
                })
                .collect();
            assert_eq!(q.post_rx(&bufs), N);
        }
        send_across(&l.a, (&mut qa, &mut a_tx), &l.b, (&mut qb, &mut b_rx), 2000);
        send_across(&l.b, (&mut qb, &mut b_tx), &l.a, (&mut qa, &mut a_rx), 1000);
        let (la, lb) = l.stats();
        for s in [la, lb] {
            assert_eq!(
                (s.rx_raw, s.rx_malformed, s.rx_delivered),
                (N as u64, 0, 0),
                "{k:?}: {s:?}"
            );
            assert_eq!(
                (s.tx_raw, s.tx_frames),
                (N as u64, N as u64),
                "{k:?}: {s:?}"
            );
        }
        sa.destroy().unwrap();
        sb.destroy().unwrap();
        qa.destroy().unwrap();
        qb.destroy().unwrap();
    }
}

/// Frames of [`raw_frames_cross_a_link_to_another_fabric_and_back`]:
/// [`N`] UDP frames to `dport` sent in one burst by `from`'s QP, received
/// intact by `to`'s (whose buffers were posted at 0x8_0000).
const N: usize = 8;

fn send_across(
    from: &Side,
    (tx_qp, tx_cq): (&mut RawPacketQp, &mut Cq),
    to: &Side,
    (rx_qp, rx_cq): (&mut RawPacketQp, &mut Cq),
    dport: u16,
) {
    let frames: Vec<Vec<u8>> = (0..N)
        .map(|i| {
            let mut f = headers(3000 + i as u16, dport, 100 + i);
            f.extend((0..100 + i).map(|b| (b + i) as u8));
            f
        })
        .collect();
    for (i, f) in frames.iter().enumerate() {
        from.buf.write(i * 512, f).unwrap();
    }
    let pkts: Vec<TxPkt<'_>> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| TxPkt {
            headers: &f[..HDRS],
            payload: Some(
                from.mr
                    .sge((i * 512 + HDRS) as u64, (f.len() - HDRS) as u32)
                    .unwrap(),
            ),
            csum: true,
            mss: 0,
            vlan: None,
        })
        .collect();
    assert_eq!(tx_qp.tx_burst(&pkts), N);
    tx_done(tx_qp, tx_cq);
    let got = rx_n(rx_qp, rx_cq, N);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.error, None, "to {dport}: frame {i}");
        assert!(r.l3_ok && r.l4_ok, "to {dport}: frame {i}: {r:?}");
        let f = &frames[i];
        assert_eq!(r.len as usize, f.len(), "to {dport}: frame {i}");
        let b = read(&to.buf, 0x8_0000 + usize::from(r.slot) * RX_BUF, f.len());
        assert_eq!(b[HDRS..], f[HDRS..], "to {dport}: frame {i}: payload");
        assert_eq!(b[34..38], f[34..38], "to {dport}: frame {i}: ports");
    }
}

/// Flow specs beyond IPv4/UDP (issue 26): a TCP destination port, an IPv6
/// destination with a UDP port, a C-VLAN ID and a source MAC each steer to
/// a QP of their own; a frame no rule takes is dropped; a spec that asks
/// for two of a kind is refused, as mlx5_ib's `parse_flow_attr`.
#[test]
fn flow_specs_match_tcp_ports_ipv6_vlan_and_source_mac() {
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let mut qs: Vec<(RawPacketQp, Cq, Cq)> = (0..4).map(|_| raw_qp(&p.b)).collect();
    const V6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x26];
    const SMAC: [u8; 6] = [0x02, 0, 0, 0, 0x0e, 0x0f];
    let specs = [
        FlowSpec {
            tcp_dport: Some(80),
            ..FlowSpec::default()
        },
        FlowSpec {
            dst_ipv6: Some(V6),
            udp_dport: Some(53),
            ..FlowSpec::default()
        },
        FlowSpec {
            vlan_id: Some(100),
            ..FlowSpec::default()
        },
        FlowSpec {
            smac: Some(SMAC),
            ..FlowSpec::default()
        },
    ];
    let mut steer = p.b.ctx.flow_steering().unwrap();
    for (spec, (q, _, _)) in specs.iter().zip(&qs) {
        steer.create_flow(spec, FlowAction::Queue(q)).unwrap();
    }
    for (i, (q, _, _)) in qs.iter_mut().enumerate() {
        let b = p.b.mr.sge((i * RX_BUF) as u64, RX_BUF as u32).unwrap();
        assert_eq!(q.post_rx(&[b]), 1);
    }
    // Frame k goes to QP k (and a fifth, TCP to port 81, to none).
    let udp = headers(7, 9, 16);
    let (tcp, tcp81) = (tcp_headers(80, 16), tcp_headers(81, 16));
    let mut v6 = udp[..12].to_vec();
    v6.extend(0x86ddu16.to_be_bytes());
    v6.extend([0x60, 0, 0, 0, 0, 24, 17, 64]);
    v6.extend([0xfd; 16]);
    v6.extend(V6);
    v6.extend([0, 7, 0, 53, 0, 24, 0, 0]);
    let mut tagged = udp[..12].to_vec();
    tagged.extend([0x81, 0x00, 0x00, 100]);
    tagged.extend(&udp[12..]);
    let mut from_m = udp.clone();
    from_m[6..12].copy_from_slice(&SMAC);
    let frames: Vec<Vec<u8>> = [tcp, v6, tagged, from_m, tcp81]
        .into_iter()
        .enumerate()
        .map(|(k, mut f)| {
            f.extend([0x40 + k as u8; 16]);
            f
        })
        .collect();
    let pkts: Vec<TxPkt<'_>> = frames
        .iter()
        .map(|f| TxPkt {
            headers: f,
            payload: None,
            csum: true,
            mss: 0,
            vlan: None,
        })
        .collect();
    assert_eq!(qa.tx_burst(&pkts), frames.len());
    tx_done(&mut qa, &mut a_tx);
    for (k, (q, _, rx)) in qs.iter_mut().enumerate() {
        let r = rx_n(q, rx, 1)[0];
        assert_eq!(r.error, None, "frame {k}");
        let got = read(&p.b.buf, k * RX_BUF, r.len as usize);
        // A frame under 60 bytes arrives padded with zeros.
        let n = frames[k].len();
        assert_eq!(got.len(), n.max(60), "frame {k} on QP {k}");
        assert_eq!(got[n - 16..n], [0x40 + k as u8; 16], "frame {k}");
        assert!(got[n..].iter().all(|&b| b == 0), "frame {k}: padding");
    }
    settle(&p.fabric);
    for (k, (q, _, rx)) in qs.iter_mut().enumerate() {
        assert_eq!(
            q.rx_burst(rx, &mut [RxPkt::default()]),
            0,
            "QP {k}: nothing else"
        );
    }
    // Two of a kind, or an ethertype or protocol against the fields.
    for (bad, what) in [
        (
            FlowSpec {
                src_ipv4: Some([1, 2, 3, 4]),
                dst_ipv6: Some(V6),
                ..FlowSpec::default()
            },
            "IPv4 and IPv6",
        ),
        (
            FlowSpec {
                udp_sport: Some(1),
                tcp_dport: Some(2),
                ..FlowSpec::default()
            },
            "TCP and UDP",
        ),
        (
            FlowSpec {
                ethertype: Some(0x0800),
                src_ipv6: Some(V6),
                ..FlowSpec::default()
            },
            "ethertype",
        ),
        (
            FlowSpec {
                ip_protocol: Some(17),
                tcp_sport: Some(1),
                ..FlowSpec::default()
            },
            "protocol",
        ),
    ] {
        let e = steer.create_flow(&bad, FlowAction::Drop);
        assert!(e.is_err(), "{what}: {e:?}");
    }
    steer.destroy().unwrap();
    for (q, _, _) in qs {
        q.destroy().unwrap();
    }
    qa.destroy().unwrap();
}

/// Ethernet + IPv4 + TCP (a 20-byte header, ACK and PSH) from port 7 to
/// `dport` for `payload` bytes (the checksums are left to the device).
fn tcp_headers(dport: u16, payload: usize) -> Vec<u8> {
    let mut h = headers(7, dport, payload);
    h.truncate(34);
    h[23] = 6;
    h[16..18].copy_from_slice(&((20 + 20 + payload) as u16).to_be_bytes());
    h.extend(7u16.to_be_bytes());
    h.extend(dport.to_be_bytes());
    h.extend([0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

/// What B received of `rounds` bursts of 30 UDP frames (20-1400 payload
/// bytes) from A on ConnectX-5, B's receive CQ holding 64 CQEs (so its
/// ring wraps) made with CQE compression `format` or without: the
/// packets, the frames, and the model's compressed sessions. Each
/// round's frames are checked in B's buffers (a cyclic RQ, 30 posted a
/// round) or, on a striding RQ (`striding`), collected for the caller.
fn compressed_run(
    format: Option<verbs::cq::CqeCompression>,
    striding: bool,
    rounds: usize,
) -> (Vec<RxPkt>, Vec<Vec<u8>>, u64) {
    const BUF: u64 = 32 << 10;
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let cap = RawQpCap {
        log_sq_bbs: 8,
        log_rq_wqes: if striding { 2 } else { 6 },
        strip_vlan: false,
        tunnel_offloads: false,
        striding: striding.then_some(StridingRq {
            log_num_strides: 9,
            log_stride_size: 6,
        }),
    };
    let b_tx = p.b.ctx.create_cq(63, None, None).unwrap();
    let mut b_rx = match format {
        Some(f) => p.b.ctx.create_cq_compressed(63, None, None, f).unwrap(),
        None => p.b.ctx.create_cq(63, None, None).unwrap(),
    };
    let mut qb =
        p.b.ctx
            .create_raw_packet_qp(&p.b.pd, &b_tx, &b_rx, cap)
            .unwrap();
    let mut steer = p.b.ctx.flow_steering().unwrap();
    steer
        .create_flow(&udp_to(1000), FlowAction::Queue(&qb))
        .unwrap();
    if striding {
        let bufs: Vec<_> = (0..4)
            .map(|k| p.b.mr.sge(k * BUF, BUF as u32).unwrap())
            .collect();
        assert_eq!(qb.post_rx(&bufs), 4);
    }
    let (mut got, mut all) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if !striding {
            post_b(&p, &mut qb, 30);
        }
        let lens: Vec<usize> = (0..30)
            .map(|k| 20 + (k * 389 + round * 97) % 1380)
            .collect();
        let frames = frames_in_a(&p, round, &lens);
        send_frames(&p, &mut qa, &mut a_tx, &frames);
        let r = rx_n(&mut qb, &mut b_rx, frames.len());
        if !striding {
            check_rx(&p, &r, &frames, round);
        }
        got.extend(r);
        all.extend(frames);
    }
    let sessions = stats(&p.fabric, 1).compressed_sessions;
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
    (got, all, sessions)
}

/// CQE compression through the driver: B's receive CQ made with
/// compression (the hash and the checksum mini CQE formats, a cyclic and
/// a striding RQ); the model writes each burst's CQEs as sessions (one
/// burst of 30 fills two: 16 and 14, or fewer where the 64-entry ring's
/// end cuts one), and `rx_burst` expands them to the packets a CQ
/// without compression gives (in order, in their buffers, intact; only
/// the timestamp, shared in a session, and the hash the checksum format
/// drops may differ), the ring wrapping.
#[test]
fn compressed_receive_cqes_expand_to_the_same_packets() {
    use verbs::cq::CqeCompression;
    let same = |a: &RxPkt, b: &RxPkt, hash_kept: bool| {
        let strip = |p: &RxPkt| RxPkt {
            timestamp: 0,
            rss_hash: if hash_kept { p.rss_hash } else { 0 },
            ..*p
        };
        strip(a) == strip(b)
    };
    for striding in [false, true] {
        // A striding RQ's four buffers (128 KiB) hold four rounds.
        let rounds = if striding { 4 } else { 8 };
        let (want, frames, none) = compressed_run(None, striding, rounds);
        assert_eq!(none, 0);
        for format in [CqeCompression::Hash, CqeCompression::Csum] {
            if striding && format == CqeCompression::Csum {
                continue;
            }
            let (got, _, sessions) = compressed_run(Some(format), striding, rounds);
            assert!(
                sessions >= 2 * rounds as u64,
                "{format:?} striding {striding}: {sessions} sessions"
            );
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    same(g, w, format == CqeCompression::Hash),
                    "{format:?} striding {striding} frame {k}: {g:?} vs {w:?}"
                );
                assert_eq!(g.len as usize, frames[k].len(), "frame {k}");
            }
        }
    }
}

#[test]
fn a_raw_qp_polled_through_verbs_cqs_reports_each_work_request() {
    // As a verbs program drives one: A's raw QP posts SENDs one WR at a
    // time into one CQ for send and receive, B's receives under a flow
    // into its one CQ; `Cq::poll` gives each its wr_id, opcode, bytes and
    // the number its CQE carries (the SQ's, which is the QP's; a receive's
    // flow tag). An unsignaled SEND completes with the signaled one after
    // it; the rings wrap.
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let cap = RawQpCap {
        log_sq_bbs: 3,
        log_rq_wqes: 2,
        strip_vlan: false,
        tunnel_offloads: false,
        striding: None,
    };
    let sges = RawSges { send: 2, recv: 2 };
    let mut ca = p.a.ctx.create_cq(16, None, None).unwrap();
    let mut cb = p.b.ctx.create_cq(16, None, None).unwrap();
    let mut qa =
        p.a.ctx
            .create_raw_packet_qp_polled(&p.a.pd, &ca, &ca, cap, sges)
            .unwrap();
    let mut qb =
        p.b.ctx
            .create_raw_packet_qp_polled(&p.b.pd, &cb, &cb, cap, sges)
            .unwrap();
    let mut steer = p.b.ctx.flow_steering().unwrap();
    steer
        .create_flow(&udp_to(4792), FlowAction::Queue(&qb))
        .unwrap();
    // A flow tag could name another QP where the receive CQE names its QP.
    assert!(steer
        .create_flow_tagged(&udp_to(4793), FlowAction::Queue(&qb), 5)
        .is_err());
    // A plain (burst) raw QP refuses work requests.
    let (mut plain, _t, _r) = raw_qp(&p.a);
    let h = headers(7, 4792, 0);
    let one = RawSendWr {
        wr_id: 1,
        headers: &h,
        payload: &[],
        csum: true,
        signaled: true,
    };
    assert!(plain.post_send_wr(&one).is_err());
    // More pieces than the QP takes.
    let piece = p.a.mr.sge(0, 8).unwrap();
    let three = RawSendWr {
        payload: &[piece, piece, piece],
        ..one
    };
    assert!(matches!(
        qa.post_send_wr(&three),
        Err(verbs::Error::Invalid(_))
    ));
    let poll = |cq: &mut Cq, n: usize| verbs_common::poll_n(cq, n);
    for round in 0..6u64 {
        // Three frames of 64 + 8 * k bytes: the first 18 bytes inline, the
        // rest by pointer (the last frame's in two pieces); each received
        // into two buffers (40 bytes, then the rest).
        for k in 0..3u64 {
            let at = k * RX_BUF as u64;
            let bufs = [
                p.b.mr.sge(at, 40).unwrap(),
                p.b.mr.sge(at + 40, RX_BUF as u32 - 40).unwrap(),
            ];
            qb.post_recv_wr(&bufs, round * 10 + k).unwrap();
        }
        for k in 0..3usize {
            let len = 64 + 8 * k;
            let mut frame = headers(7, 4792, len - HDRS);
            frame.resize(len, round as u8 ^ k as u8);
            p.a.buf.write(k * 256, &frame).unwrap();
            let at = (k * 256 + 18) as u64;
            let rest = (len - 18) as u32;
            let whole = [p.a.mr.sge(at, rest).unwrap()];
            let split = [
                p.a.mr.sge(at, 10).unwrap(),
                p.a.mr.sge(at + 10, rest - 10).unwrap(),
            ];
            let wr = RawSendWr {
                wr_id: 100 + round * 10 + k as u64,
                headers: &frame[..18],
                payload: if k == 2 { &split } else { &whole },
                csum: true,
                // The middle one unsignaled.
                signaled: k != 1,
            };
            qa.post_send_wr(&wr).unwrap();
        }
        qa.ring_sends();
        let sent = poll(&mut ca, 2);
        assert_eq!(
            sent.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            vec![100 + round * 10, 100 + round * 10 + 2],
            "round {round}"
        );
        for w in &sent {
            assert_eq!(w.status, verbs::cq::WcStatus::Success);
            assert_eq!(w.opcode, verbs::cq::WcOpcode::Send);
            assert_eq!(w.qp_num, qa.sqn());
        }
        let got = poll(&mut cb, 3);
        for (k, w) in got.iter().enumerate() {
            assert_eq!(w.status, verbs::cq::WcStatus::Success, "{w:?}");
            assert_eq!(w.wr_id, round * 10 + k as u64);
            assert_eq!(w.opcode, verbs::cq::WcOpcode::Recv);
            assert_eq!(w.byte_len, 64 + 8 * k as u32);
            // What the CQE says, as libmlx5 reports it: the flow tag.
            assert_eq!(w.qp_num, 0);
            // The device checked the IPv4 and UDP checksums it filled in.
            let ok = verbs::cq::wc_flags::IP_CSUM_OK;
            assert_eq!(w.wc_flags & ok, ok, "{w:?}");
            // The frame as sent, but for the IPv4 and UDP checksums the
            // device filled in (asked for).
            let len = 64 + 8 * k;
            let mut want = headers(7, 4792, len - HDRS);
            want.resize(len, round as u8 ^ k as u8);
            let mut got = read(&p.b.buf, k * RX_BUF, len);
            assert_ne!(&got[24..26], &[0, 0], "IPv4 checksum filled in");
            got[24..26].fill(0);
            got[40..42].fill(0);
            assert_eq!(got, want, "round {round}");
        }
    }
    // Full rings say so.
    let buf = [p.b.mr.sge(0, 64).unwrap()];
    for k in 0..4u64 {
        qb.post_recv_wr(&buf, k).unwrap();
    }
    assert!(matches!(
        qb.post_recv_wr(&buf, 9),
        Err(verbs::Error::QueueFull(_))
    ));
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
    // The CQs are free to go once their QPs went.
    ca.destroy().unwrap();
    cb.destroy().unwrap();
    plain.destroy().unwrap();
}

#[test]
fn address_masks_steer_a_subnet_and_a_mac_prefix() {
    // Rules on the bits of an address (verbs' spec masks): one QP takes
    // 10.1.0.0/16, another frames whose source MAC begins 02:00:00; the
    // rest (10.2.0.9 from another prefix) match neither and are dropped.
    use verbs::flow::{AddrMasks, FlowSpec};
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let (mut q1, _t1, mut r1) = raw_qp(&p.b);
    let (mut q2, _t2, mut r2) = raw_qp(&p.b);
    for (q, base) in [(&mut q1, 0u64), (&mut q2, 0x10000)] {
        let bufs: Vec<_> = (0..4u64)
            .map(|k| p.b.mr.sge(base + k * RX_BUF as u64, RX_BUF as u32).unwrap())
            .collect();
        assert_eq!(q.post_rx(&bufs), 4);
    }
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let subnet = FlowSpec {
        dst_ipv4: Some([10, 1, 0, 0]),
        masks: AddrMasks {
            dst_ipv4: Some([255, 255, 0, 0]),
            ..AddrMasks::default()
        },
        ..FlowSpec::default()
    };
    steer.create_flow(&subnet, FlowAction::Queue(&q1)).unwrap();
    let prefix = FlowSpec {
        smac: Some([0x02, 0, 0, 0xff, 0xff, 0xff]),
        masks: AddrMasks {
            smac: Some([0xff, 0xff, 0xff, 0, 0, 0]),
            ..AddrMasks::default()
        },
        ..FlowSpec::default()
    };
    steer.create_flow(&prefix, FlowAction::Queue(&q2)).unwrap();
    // To 10.1.7.7 from 04:.. (the subnet), to 10.2.0.9 from 02:00:00:..
    // (the prefix), to 10.2.0.9 from 04:.. (neither).
    let frame = |dst: [u8; 4], smac0: u8| {
        let mut h = headers_between(([10, 0, 0, 1], 9), (dst, 9), 0);
        h[6] = smac0;
        h
    };
    let hs = [
        frame([10, 1, 7, 7], 0x04),
        frame([10, 2, 0, 9], 0x02),
        frame([10, 2, 0, 9], 0x04),
    ];
    let pkts: Vec<_> = hs
        .iter()
        .map(|h| TxPkt {
            headers: h,
            payload: None,
            csum: true,
            mss: 0,
            vlan: None,
        })
        .collect();
    assert_eq!(qa.tx_burst(&pkts), 3);
    tx_done(&mut qa, &mut a_tx);
    let a = rx_n(&mut q1, &mut r1, 1);
    assert_eq!(read(&p.b.buf, 0, 34)[30..34], [10, 1, 7, 7], "{a:?}");
    let b = rx_n(&mut q2, &mut r2, 1);
    assert_eq!(read(&p.b.buf, 0x10000, 14)[6], 0x02, "{b:?}");
    settle(&p.fabric);
    let sb = stats(&p.fabric, 1);
    assert_eq!((sb.packets_received, sb.dropped), (3, 1));
    steer.destroy().unwrap();
    for q in [qa, q1, q2] {
        q.destroy().unwrap();
    }
}

#[test]
fn polled_work_queues_share_verbs_cqs_and_report_each_receive() {
    // As a verbs program drives RSS (rdma-core's test_rss_traffic): four
    // WQs on two verbs CQs (WQ q on CQ q % 2), an RSS QP over them; each
    // Microsoft-suite flow lands on the WQ its published hash picks, and
    // `Cq::poll` on that WQ's CQ reports the wr_id posted there (the WQ's
    // number in its top bits), the frame's bytes and the flow tag (0).
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX5, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let cap = WqCap {
        log_wqes: 3,
        strip_vlan: false,
    };
    let mut cqs: Vec<Cq> = (0..2)
        .map(|_| p.b.ctx.create_cq(64, None, None).unwrap())
        .collect();
    let mut wqs: Vec<Wq> = (0..4)
        .map(|q| {
            p.b.ctx
                .create_wq_polled(&p.b.pd, &cqs[q % 2], cap, 2)
                .unwrap()
        })
        .collect();
    // A burst WQ refuses work requests; a polled one more buffers than it
    // takes.
    let mut plain = p.b.ctx.create_wq(&p.b.pd, &cqs[0], cap).unwrap();
    let one = [p.b.mr.sge(0, 64).unwrap()];
    assert!(plain.post_recv_wr(&one, 1).is_err());
    assert!(wqs[0].post_recv_wr(&[one[0]; 3], 1).is_err());
    let table =
        p.b.ctx
            .create_rwq_ind_table(&wqs.iter().collect::<Vec<_>>())
            .unwrap();
    for (q, w) in wqs.iter_mut().enumerate() {
        for k in 0..4 {
            let at = ((q * 4 + k) * RX_BUF) as u64;
            // Two buffers a WQE: the headers, then the rest.
            let bufs = [
                p.b.mr.sge(at, HDRS as u32).unwrap(),
                p.b.mr
                    .sge(at + HDRS as u64, (RX_BUF - HDRS) as u32)
                    .unwrap(),
            ];
            w.post_recv_wr(&bufs, (q as u64) << 32 | k as u64).unwrap();
        }
    }
    let conf = RxHashConf {
        table: &table,
        key: MS_RSS_KEY,
        fields: rh::SRC_IPV4 | rh::DST_IPV4 | rh::SRC_PORT_UDP | rh::DST_PORT_UDP,
    };
    let rss = p.b.ctx.create_rss_qp(&conf).unwrap();
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let all_udp = FlowSpec {
        ethertype: Some(0x0800),
        ip_protocol: Some(17),
        ..FlowSpec::default()
    };
    steer.create_flow(&all_udp, FlowAction::Rss(&rss)).unwrap();
    let mut next = [0u64; 4];
    for (i, (src, dst, _, h_ports)) in MS_RSS_FLOWS.iter().enumerate() {
        let mut f = headers_between(*src, *dst, 16);
        f.extend([i as u8; 16]);
        let pkt = TxPkt {
            headers: &f,
            payload: None,
            csum: true,
            mss: 0,
            vlan: None,
        };
        assert_eq!(qa.tx_burst(&[pkt]), 1);
        tx_done(&mut qa, &mut a_tx);
        let q = *h_ports as usize % 4;
        let w = verbs_common::poll_n(&mut cqs[q % 2], 1)[0];
        assert_eq!(w.status, verbs::cq::WcStatus::Success, "flow {i}: {w:?}");
        assert_eq!(w.wr_id, (q as u64) << 32 | next[q], "flow {i}: its WQ's WR");
        // 58 bytes sent, padded to Ethernet's least (60).
        assert_eq!(w.byte_len as usize, 60, "flow {i}");
        assert_eq!(w.qp_num, 0, "flow {i}: the flow tag");
        let at = (q * 4 + next[q] as usize) * RX_BUF;
        assert_eq!(read(&p.b.buf, at + HDRS, 16), vec![i as u8; 16], "flow {i}");
        next[q] += 1;
    }
    for cq in &mut cqs {
        assert!(verbs_common::nothing_more(&p.fabric, cq), "nothing astray");
    }
    steer.destroy().unwrap();
    rss.destroy().unwrap();
    table.destroy().unwrap();
    for w in wqs {
        w.destroy().unwrap();
    }
    plain.destroy().unwrap();
    for cq in cqs {
        cq.destroy().unwrap();
    }
    qa.destroy().unwrap();
}

#[test]
fn a_rule_in_the_device_format_steers_by_its_mask() {
    // mlx5dv's matcher and flow: the mask and value as fte_match_param
    // bytes (here the outer source MAC, its first six), the value masked.
    let p = pair_profile(1 << 20, mlx5_emu::Profile::ConnectX4Lx, access::LOCAL_WRITE);
    let (mut qa, mut a_tx, _a_rx) = raw_qp(&p.a);
    let (mut qb, _t, mut rb) = raw_qp(&p.b);
    let bufs = [p.b.mr.sge(0, RX_BUF as u32).unwrap()];
    assert_eq!(qb.post_rx(&bufs), 1);
    let mut steer = p.b.ctx.flow_steering().unwrap();
    let mask = [0xffu8; 6];
    let too_long = vec![0u8; 0x201];
    assert!(steer
        .create_flow_matched(&too_long, &[], 1, FlowAction::Queue(&qb))
        .is_err());
    assert!(steer
        .create_flow_matched(&mask, &mask, 1 << 4, FlowAction::Queue(&qb))
        .is_err());
    // Frames from 02:00:00:00:00:01 (headers()' source) go to B's QP;
    // the value's bits past the mask (none here) would not matter.
    let smac = [0x02, 0, 0, 0, 0, 0x01];
    steer
        .create_flow_matched(&mask, &smac, 1, FlowAction::Queue(&qb))
        .unwrap();
    let h = headers(1, 2, 0);
    let pkt = TxPkt {
        headers: &h,
        payload: None,
        csum: true,
        mss: 0,
        vlan: None,
    };
    assert_eq!(qa.tx_burst(&[pkt]), 1);
    tx_done(&mut qa, &mut a_tx);
    let got = rx_n(&mut qb, &mut rb, 1);
    assert_eq!(got[0].error, None);
    assert_eq!(read(&p.b.buf, 6, 6), smac);
    steer.destroy().unwrap();
    qa.destroy().unwrap();
    qb.destroy().unwrap();
}
