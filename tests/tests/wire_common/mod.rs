//! Shared set-up of the wire tests: two functions on two fabrics linked
//! by a socket of each kind, and RC rounds of every opcode with their data
//! and atomics checked.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::verbs_common::*;
use mlx5_emu::wire::{LinkOptions, LinkSpec, LinkStats, WireFaults};
use mlx5_emu::{DeviceConfig, Fabric, Profile};
use tests::wait::until;
use verbs::cq::{WcOpcode, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::qp::{send_flags as sf, Payload, Qp, QpType, RecvWr, SendOp, SendWr};
use vfio::clock::ManualClock;
use vfio::PciFunction;

/// Two fabrics of one function each, their ports linked by a socket.
pub struct Linked {
    pub fa: Fabric,
    pub fb: Fabric,
    pub a: Side,
    pub b: Side,
}

#[derive(Debug, Clone, Copy)]
pub enum Sock {
    StreamUnix,
    StreamTcp,
    DgramUdp,
    DgramUnix,
}

pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn tmp(tag: &str) -> String {
    std::env::temp_dir()
        .join(format!("wire-link-{}-{tag}", std::process::id()))
        .to_string_lossy()
        .into_owned()
}

/// The two specs of a link of kind `k` (the server's first).
pub fn specs(k: Sock, tag: &str) -> (LinkSpec, Option<LinkSpec>) {
    let p = |s: &str| LinkSpec::parse(s).unwrap();
    match k {
        Sock::StreamUnix => {
            let path = tmp(&format!("{tag}.sock"));
            (
                p(&format!("stream,server=on,addr={path}")),
                Some(p(&format!("stream,addr={path}"))),
            )
        }
        // The client's address is the server's, known once it listens.
        Sock::StreamTcp => (p("stream,server=on,addr=127.0.0.1:0"), None),
        Sock::DgramUdp => {
            let (x, y) = (free_udp_port(), free_udp_port());
            (
                p(&format!("dgram,local=127.0.0.1:{x},remote=127.0.0.1:{y}")),
                Some(p(&format!(
                    "dgram,local=127.0.0.1:{y},remote=127.0.0.1:{x}"
                ))),
            )
        }
        Sock::DgramUnix => {
            let (x, y) = (tmp(&format!("{tag}.a")), tmp(&format!("{tag}.b")));
            (
                p(&format!("dgram,local={x},remote={y}")),
                Some(p(&format!("dgram,local={y},remote={x}"))),
            )
        }
    }
}

pub fn one_function(mac: u64, cfg: &DeviceConfig) -> (Fabric, Arc<dyn PciFunction>) {
    let f = Fabric::new();
    let mut cfg = cfg.clone();
    cfg.mac = mac;
    let func = f.add(cfg) as Arc<dyn PciFunction>;
    (f, func)
}

pub fn opts(faults: WireFaults) -> LinkOptions {
    LinkOptions {
        faults,
        // A lost or corrupted frame is known lost at once (the link's loss
        // notices); the real-time wait catches the rest (a reordered
        // burst whose last ACK the responder holds: the ACK timeout asks
        // again), long enough that a loaded machine does not reach it.
        response_wait: Duration::from_secs(2),
        ..LinkOptions::default()
    }
}

/// Two functions on two fabrics linked by a `k` socket, the faults of
/// each end's egress as given.
pub fn linked(k: Sock, tag: &str, fa: WireFaults, fb: WireFaults) -> Linked {
    linked_with(k, tag, opts(fa), opts(fb), None)
}

pub fn linked_with(
    k: Sock,
    tag: &str,
    oa: LinkOptions,
    ob: LinkOptions,
    clock: Option<&Arc<ManualClock>>,
) -> Linked {
    let mut cfg = DeviceConfig::for_profile(Profile::ConnectX4Lx);
    let mut hca = HcaOptions::default();
    if let Some(c) = clock {
        cfg.clock = c.shared();
        cfg.fw_start = Duration::ZERO;
        hca.clock = c.shared();
    }
    let (fa, func_a) = one_function(mlx5_emu::DEFAULT_MAC, &cfg);
    let (fb, func_b) = one_function(mlx5_emu::DEFAULT_MAC + 0x100, &cfg);
    let (sa, sb) = specs(k, tag);
    let la = fa.connect(&sa, &oa).unwrap_or_else(|e| panic!("{sa}: {e}"));
    let sb = sb.unwrap_or_else(|| {
        let a = la.local_addr().expect("TCP server address");
        LinkSpec::parse(&format!("stream,addr={a}")).unwrap()
    });
    fb.connect(&sb, &ob).unwrap_or_else(|e| panic!("{sb}: {e}"));
    let a = side(Context::open(func_a, hca.clone()).unwrap(), 1 << 20, ALL);
    let b = side(Context::open(func_b, hca).unwrap(), 1 << 20, ALL);
    Linked { fa, fb, a, b }
}

impl Linked {
    pub fn qps(&self, t: QpType) -> (Qp, Qp) {
        let mut qa = create_qp(&self.a, t, cap(64));
        let mut qb = create_qp(&self.b, t, cap(64));
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        connect(&mut qa, &self.a.ctx, &self.b.ctx, nb);
        connect(&mut qb, &self.b.ctx, &self.a.ctx, na);
        (qa, qb)
    }

    pub fn stats(&self) -> (LinkStats, LinkStats) {
        (
            self.fa.link().unwrap().stats(),
            self.fb.link().unwrap().stats(),
        )
    }
}

// Layout of the two buffers (a: requester, b: responder).
pub const SEND_SRC: usize = 0;
pub const WRITE_SRC: usize = 0x1_0000;
pub const READ_DST: usize = 0x2_0000;
pub const OLD_FAA: usize = 0x3_0000;
pub const OLD_CAS: usize = 0x3_0008;
pub const RECV0: usize = 0;
pub const RECV1: usize = 0x1_0000;
pub const RECV2: usize = 0x2_0000;
pub const WRITE_DST: usize = 0x4_0000;
pub const WRITE_IMM_DST: usize = 0x5_0000;
pub const READ_SRC: usize = 0x6_0000;
pub const FAA: usize = 0x7_0000;
pub const CAS: usize = 0x7_0008;

/// `rounds` rounds of SEND, SEND_IMM, WRITE, WRITE_IMM, READ, FetchAdd and
/// CmpSwap, each round's lengths different (1 to 6000 bytes: one to six
/// packets of 1024): every completion once, in order, successful; every
/// byte where it belongs; the FetchAdd counter and the CmpSwap word equal
/// to the rounds (each executed exactly once).
pub fn rc_rounds(l: &mut Linked, qa: &mut Qp, qb: &mut Qp, rounds: u64) {
    rc_rounds_on(&mut l.a, &mut l.b, qa, qb, rounds);
}

/// [`rc_rounds`] between any two sides (`a` requests, `b` responds).
pub fn rc_rounds_on(a: &mut Side, b: &mut Side, qa: &mut Qp, qb: &mut Qp, rounds: u64) {
    let rk = b.mr.rkey();
    let rb = b.mr.addr();
    b.buf.write_u64_be(FAA, 0).unwrap();
    b.buf.write_u64_be(CAS, 0).unwrap();
    for i in 0..rounds {
        let len = 1 + (i as usize * 997) % 6000;
        let seed = i as u8;
        let send = fill(&a.buf, SEND_SRC, len, seed);
        let write = fill(&a.buf, WRITE_SRC, len, seed ^ 0x55);
        let remote = fill(&b.buf, READ_SRC, len, seed ^ 0xaa);
        let r = |at| b.mr.sge(at as u64, 8192).unwrap();
        qb.post_recv(&[
            RecvWr {
                wr_id: 100 + i * 3,
                sg_list: &[r(RECV0)],
            },
            RecvWr {
                wr_id: 101 + i * 3,
                sg_list: &[r(RECV1)],
            },
            RecvWr {
                wr_id: 102 + i * 3,
                sg_list: &[r(RECV2)],
            },
        ])
        .unwrap();
        let s = |at: usize, n: usize| [a.mr.sge(at as u64, n as u32).unwrap()];
        let (ss, ws, rd, of, oc) = (
            s(SEND_SRC, len),
            s(WRITE_SRC, len),
            s(READ_DST, len),
            s(OLD_FAA, 8),
            s(OLD_CAS, 8),
        );
        let ops = [
            (SendOp::Send, &ss),
            (SendOp::SendImm(0x1000 + i as u32), &ss),
            (
                SendOp::RdmaWrite {
                    raddr: rb + WRITE_DST as u64,
                    rkey: rk,
                },
                &ws,
            ),
            (
                SendOp::RdmaWriteImm {
                    raddr: rb + WRITE_IMM_DST as u64,
                    rkey: rk,
                    imm: 0x2000 + i as u32,
                },
                &ws,
            ),
            (
                SendOp::RdmaRead {
                    raddr: rb + READ_SRC as u64,
                    rkey: rk,
                },
                &rd,
            ),
            (
                SendOp::AtomicFetchAdd {
                    raddr: rb + FAA as u64,
                    rkey: rk,
                    add: 1,
                },
                &of,
            ),
            (
                SendOp::AtomicCmpSwp {
                    raddr: rb + CAS as u64,
                    rkey: rk,
                    compare: i,
                    swap: i + 1,
                },
                &oc,
            ),
        ];
        let wrs: Vec<SendWr<'_>> = ops
            .iter()
            .zip(1..)
            .map(|((op, sge), id)| SendWr {
                wr_id: id,
                op: *op,
                payload: Payload::Sges(&sge[..]),
                flags: sf::SIGNALED,
                ud: None,
            })
            .collect();
        qa.post_send(&wrs).unwrap();
        let w = poll_n(&mut a.cq, 7);
        let got: Vec<_> = w.iter().map(|w| (w.wr_id, w.status)).collect();
        let want: Vec<_> = (1..=7).map(|id| (id, WcStatus::Success)).collect();
        assert_eq!(got, want, "round {i}: {w:?}");
        let rw = poll_n(&mut b.cq, 3);
        let got: Vec<_> = rw
            .iter()
            .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
            .collect();
        assert_eq!(
            got,
            vec![
                (100 + i * 3, WcStatus::Success, WcOpcode::Recv, len as u32),
                (101 + i * 3, WcStatus::Success, WcOpcode::Recv, len as u32),
                (
                    102 + i * 3,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    len as u32
                ),
            ],
            "round {i}"
        );
        assert_eq!(
            (rw[1].imm(), rw[2].imm()),
            (Some(0x1000 + i as u32), Some(0x2000 + i as u32))
        );
        assert_eq!(read(&b.buf, RECV0, len), send, "round {i}: SEND");
        assert_eq!(read(&b.buf, RECV1, len), send, "round {i}: SEND_IMM");
        assert_eq!(read(&b.buf, WRITE_DST, len), write, "round {i}: WRITE");
        assert_eq!(
            read(&b.buf, WRITE_IMM_DST, len),
            write,
            "round {i}: WRITE_IMM"
        );
        assert_eq!(read(&a.buf, READ_DST, len), remote, "round {i}: READ");
        assert_eq!(
            a.buf.read_u64_be(OLD_FAA).unwrap(),
            i,
            "round {i}: FetchAdd"
        );
        assert_eq!(a.buf.read_u64_be(OLD_CAS).unwrap(), i, "round {i}: CmpSwap");
    }
    assert_eq!(
        b.buf.read_u64_be(FAA).unwrap(),
        rounds,
        "FetchAdd once each"
    );
    assert_eq!(b.buf.read_u64_be(CAS).unwrap(), rounds, "CmpSwap once each");
}

/// Once nothing is held or in flight, each end received what the other
/// sent, and the bad frames it counted are the ones the other corrupted.
pub fn counters_add_up(l: &Linked) {
    // Quiet: every frame sent was taken, and each taken one is counted
    // where it went (the receive thread counts a frame first, then its
    // fate: a snapshot between the two would see one frame nowhere).
    let placed = |s: &LinkStats| s.rx_delivered + s.rx_raw + s.rx_dropped();
    until("the links to go quiet", || {
        let (a, b) = l.stats();
        a.rx_frames == b.tx_frames
            && b.rx_frames == a.tx_frames
            && placed(&a) == a.rx_frames
            && placed(&b) == b.rx_frames
            && a.rx_loss_probes == b.tx_loss_probes
            && b.rx_loss_probes == a.tx_loss_probes
    });
    let (a, b) = l.stats();
    for (from, to) in [(a, b), (b, a)] {
        assert_eq!(to.rx_bad_icrc, from.faults.corrupted, "{from:?} -> {to:?}");
        assert_eq!(
            to.rx_malformed + to.rx_unknown_gid + to.rx_giant,
            0,
            "{to:?}"
        );
        assert_eq!(
            to.rx_delivered + to.rx_raw + to.rx_bad_icrc,
            to.rx_frames,
            "{to:?}"
        );
    }
}
