//! A hostile peer on the wire, written here: garbage, empty and giant
//! frames, frames cut short, bad ICRCs, unknown GIDs, lengths that lie,
//! floods. Each is counted as the drop it is, the model never panics, and
//! both the link and the in-process cable beside it keep working: the
//! model's own frames still come out in the socket's format (one per
//! datagram; 4-byte big-endian length, then the frame) and decode.

mod verbs_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;

use mlx5_emu::transport::packet::{self, op, svc, Bth, Deth, Headers, RoceAddr};
use mlx5_emu::wire::{LinkOptions, LinkSpec, LinkStats, MAX_FRAME};
use mlx5_emu::{Fabric, Profile};
use tests::wait::until;
use verbs::cq::WcStatus;
use verbs::qp::{send_flags as sf, AhAttr, Payload, QpType, SendOp, SendWr, UdDest};
use verbs_common::*;

fn tmp(tag: &str) -> String {
    std::env::temp_dir()
        .join(format!("wire-hostile-{}-{tag}", std::process::id()))
        .to_string_lossy()
        .into_owned()
}

/// A GID no function answers to, and one of the fabric's.
const STRANGER: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0xff, 0xfe, 0, 0, 9];

/// A well-formed RoCEv2 UD SEND frame to `dst_gid`.
fn ud_frame(dst_gid: [u8; 16]) -> Vec<u8> {
    let addr = RoceAddr {
        dst_mac: [2, 0, 0, 0, 0, 1],
        src_mac: [2, 0, 0, 0, 0, 9],
        src_gid: STRANGER,
        dst_gid,
        hop_limit: 64,
        udp_sport: 0xc000,
        ..RoceAddr::default()
    };
    let h = Headers {
        bth: Bth {
            opcode: svc::UD | op::SEND_ONLY,
            pkey: packet::DEFAULT_PKEY,
            dest_qp: 0x77,
            psn: 5,
            ..Bth::default()
        },
        deth: Some(Deth {
            qkey: QKEY,
            src_qp: 3,
        }),
        ..Headers::default()
    };
    let mut f = Vec::new();
    packet::encode_frame(&addr, &h, b"hello", &mut f);
    f
}

/// Two cabled functions whose fabric is also linked by `spec`.
fn fabric_with(spec: &LinkSpec) -> (Fabric, Arc<mlx5_emu::wire::Link>) {
    let f = Fabric::cabled(2, Profile::ConnectX4Lx);
    let l = f.connect(spec, &LinkOptions::default()).unwrap();
    (f, l)
}

/// An RC WRITE between the fabric's two functions (the cable beside the
/// link), and a UD SEND from function 0 to a GID across the link: the
/// frame comes out to `recv_frame`, which decodes.
fn still_works(fabric: &Fabric, recv_frame: &mut dyn FnMut() -> Vec<u8>) {
    let mut a = side(open(function(fabric, 0)), 1 << 16, ALL);
    let b = side(open(function(fabric, 1)), 1 << 16, ALL);
    let mut qa = create_qp(&a, QpType::Rc, cap(8));
    let mut qb = create_qp(&b, QpType::Rc, cap(8));
    let (na, nb) = (qa.qp_num(), qb.qp_num());
    connect(&mut qa, &a.ctx, &b.ctx, nb);
    connect(&mut qb, &b.ctx, &a.ctx, na);
    let d = fill(&a.buf, 0, 4000, 5);
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            raddr: b.mr.addr(),
            rkey: b.mr.rkey(),
        },
        payload: Payload::Sges(&[a.mr.sge(0, 4000).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    assert_eq!(poll_n(&mut a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(read(&b.buf, 0, 4000), d);

    let mut ua = create_qp(&a, QpType::Ud, cap(8));
    connect(&mut ua, &a.ctx, &b.ctx, 0);
    let ah =
        a.pd.create_ah(&AhAttr {
            dgid: STRANGER,
            sgid_index: 0,
            hop_limit: 64,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    ua.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::Send,
        payload: Payload::Sges(&[a.mr.sge(0, 300).unwrap()]),
        flags: sf::SIGNALED,
        ud: Some(UdDest {
            ah: &ah,
            remote_qpn: 0x123,
            remote_qkey: QKEY,
        }),
    }])
    .unwrap();
    assert_eq!(poll_n(&mut a.cq, 1)[0].status, WcStatus::Success);
    let f = recv_frame();
    let fr = packet::decode_frame(&f).expect("the model's frame decodes");
    assert_eq!(fr.hdrs.bth.opcode, svc::UD | op::SEND_ONLY);
    assert_eq!(fr.hdrs.bth.dest_qp, 0x123);
    assert_eq!(fr.addr.dst_gid, STRANGER);
    assert_eq!(&f[fr.payload], &d[..300]);
}

fn wait_rx(l: &mlx5_emu::wire::Link, n: u64) -> LinkStats {
    until("the link to take the frames", || l.stats().rx_frames >= n);
    l.stats()
}

#[test]
fn dgram_peer_sends_garbage_giants_bad_icrc_unknown_gids_and_floods() {
    let (mine, theirs) = (tmp("m"), tmp("t"));
    let peer = UnixDatagram::bind(&theirs).unwrap();
    let spec = LinkSpec::parse(&format!("dgram,local={mine},remote={theirs}")).unwrap();
    let (fabric, l) = fabric_with(&spec);
    let gid0 = {
        let c = open(function(&fabric, 0));
        c.query_gid(1, 0).unwrap()
    };
    let send = |b: &[u8]| peer.send_to(b, &mine).unwrap();
    send(b"garbage, not even Ethernet");
    send(&[]);
    let good = ud_frame(gid0);
    send(&good[..good.len() - 9]);
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 10] ^= 0x40;
    send(&bad);
    send(&ud_frame(STRANGER));
    send(&vec![0x5a; MAX_FRAME + 1000]);
    until("the giant to be counted", || l.stats().rx_giant == 1);
    let s = wait_rx(&l, 5);
    // The garbage is an Ethernet frame of an unknown ethertype: the NIC
    // takes it in (nothing steers it: dropped); the empty and the cut
    // frames are malformed.
    assert_eq!(
        (s.rx_malformed, s.rx_bad_icrc, s.rx_unknown_gid, s.rx_giant),
        (2, 1, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.rx_raw, 1, "{s:?}");
    // A flood of garbage shorter than an Ethernet header: each counted,
    // nothing kept.
    let flood = 20_000;
    for i in 0..flood {
        send(&[i as u8; 13]);
    }
    let s = wait_rx(&l, 5 + flood);
    assert_eq!(s.rx_malformed, 2 + flood, "{s:?}");
    assert_eq!((s.rx_delivered, s.rx_raw), (0, 1));
    // The driver sees the drops too: `mlx5 devinfo -v` reads them from
    // the port's PPCNT counters.
    {
        let hca = verbs::hca::Hca::open(function(&fabric, 0), Default::default()).unwrap();
        let text = tools::devinfo::render(&hca, true).unwrap();
        for (k, v) in [
            ("fcs_errors", 1),
            ("too_long", 1),
            ("length_errors", 0),
            ("unsupported_opcodes", 2 + flood),
        ] {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{k}:")))
                .unwrap_or_else(|| panic!("no {k} in\n{text}"));
            assert_eq!(
                line.split_whitespace().last(),
                Some(&*v.to_string()),
                "{line}"
            );
        }
    }
    peer.set_read_timeout(Some(tests::wait::HANG_GUARD))
        .unwrap();
    still_works(&fabric, &mut || {
        let mut b = vec![0u8; 65536];
        let n = peer.recv(&mut b).expect("the model's frame");
        b.truncate(n);
        b
    });
    drop(fabric);
    let _ = std::fs::remove_file(&theirs);
}

#[test]
fn stream_peer_lies_about_lengths_and_cuts_frames_short() {
    let spec = LinkSpec::parse("stream,server=on,addr=127.0.0.1:0").unwrap();
    let (fabric, l) = fabric_with(&spec);
    let addr = l.local_addr().unwrap();
    // A length far past the limit, then the end of the stream: skipped
    // without being stored, counted, the stream ended inside it.
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(&0xffff_fff0u32.to_be_bytes()).unwrap();
    c.write_all(&[7; 1000]).unwrap();
    drop(c);
    until("the giant and the cut", || {
        let s = l.stats();
        s.rx_giant == 1 && s.rx_truncated == 1
    });
    // Garbage in a well-formed length, then a frame cut short.
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(&8u32.to_be_bytes()).unwrap();
    c.write_all(b"garbage!").unwrap();
    c.write_all(&100u32.to_be_bytes()).unwrap();
    c.write_all(&[1; 50]).unwrap();
    drop(c);
    until("the garbage and the cut", || {
        let s = l.stats();
        s.rx_malformed == 1 && s.rx_truncated == 2
    });
    // A zero length, then a length cut short itself.
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(&0u32.to_be_bytes()).unwrap();
    c.write_all(&[0, 0]).unwrap();
    drop(c);
    until("the empty frame and the cut length", || {
        let s = l.stats();
        s.rx_malformed == 2 && s.rx_truncated == 3
    });
    // A peer that stays: the model's frames come length-first.
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(tests::wait::HANG_GUARD)).unwrap();
    // Connected once the link took the connection; frames sent before are
    // refused (counted), never queued without bound.
    until("the link to take the peer", || {
        c.write_all(&13u32.to_be_bytes()).unwrap();
        c.write_all(&[0; 13]).unwrap();
        l.stats().rx_malformed > 2
    });
    still_works(&fabric, &mut || {
        let mut len = [0u8; 4];
        c.read_exact(&mut len).unwrap();
        let n = u32::from_be_bytes(len) as usize;
        assert!(n < MAX_FRAME, "{n}");
        let mut f = vec![0u8; n];
        c.read_exact(&mut f).unwrap();
        f
    });
    let s = l.stats();
    assert_eq!(
        (s.rx_delivered, s.rx_giant, s.rx_truncated),
        (0, 1, 3),
        "{s:?}"
    );
    drop(fabric);
}
