//! Outside judges of the model's frames: a capture of RC traffic of every
//! opcode (SEND, SEND with immediate, WRITE, WRITE with immediate, READ
//! request and responses first/middle/last/only, CmpSwap, FetchAdd, their
//! acknowledgements, ACKs and an RNR NAK) and a UD SEND, read by
//! Wireshark's `tshark` (Debian's package; scripts/test-all.sh installs
//! it): every frame dissected as InfiniBand over UDP 4791 with the right
//! BTH opcode, the request PSNs one contiguous sequence, nothing malformed;
//! and every frame's ICRC recomputed by Python's `zlib.crc32` over the
//! IBTA's masked pseudo-header (annex A17), equal to the one carried.
//!
//! The one expert note Wireshark raises is the UDP checksum of 0 on IPv6:
//! RoCEv2 NICs send 0 (the ICRC covers the packet; RFC 6935 allows a zero
//! checksum for such tunnels), as ConnectX does; the test allows that note
//! only.

mod verbs_common;
mod wire_common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use mlx5_emu::wire::{LinkOptions, WireFaults};
use verbs::cq::WcStatus;
use verbs::qp::{send_flags as sf, AhAttr, Payload, QpType, RecvWr, SendOp, SendWr, UdDest};
use verbs_common::*;
use wire_common::*;

/// Recomputes every frame's ICRC in Python (zlib.crc32 over 8 bytes of
/// ones standing for the LRH, then the IP header with its variant fields
/// set to ones, the UDP header with its checksum set to ones, the BTH with
/// its reserved byte set to ones, and the rest up to the ICRC); prints
/// `frames N bad M`.
const ICRC_PY: &str = r#"
import struct, sys, zlib
d = open(sys.argv[1], 'rb').read()
off, n, bad = 24, 0, 0
while off < len(d):
    incl = struct.unpack('<I', d[off+8:off+12])[0]
    f = bytearray(d[off+16:off+16+incl]); off += 16 + incl
    n += 1
    et = struct.unpack('>H', f[12:14])[0]
    if et == 0x86dd:
        ip = bytearray(f[14:54]); ip[0] |= 0x0f; ip[1:4] = b'\xff\xff\xff'; ip[7] = 0xff
        l4 = 54
    else:
        ip = bytearray(f[14:34]); ip[1] = 0xff; ip[8] = 0xff; ip[10:12] = b'\xff\xff'
        l4 = 34
    udp = bytearray(f[l4:l4+8]); udp[6:8] = b'\xff\xff'
    bth = bytearray(f[l4+8:l4+20]); bth[4] = 0xff
    rest = f[l4+20:len(f)-4]
    crc = zlib.crc32(b'\xff' * 8 + bytes(ip) + bytes(udp) + bytes(bth) + bytes(rest)) & 0xffffffff
    carried = struct.unpack('<I', f[-4:])[0]
    if crc != carried:
        bad += 1
        print('frame', n, 'computed %08x carried %08x' % (crc, carried))
print('frames', n, 'bad', bad)
"#;

/// Protocols Wireshark guesses inside InfiniBand payloads (its heuristics
/// take the test's data for RPC-over-RDMA and call it malformed): off, so
/// what is judged is the RoCEv2 framing.
const NO_PAYLOAD_GUESSES: [&str; 8] = [
    "rpcordma",
    "smc",
    "smb_direct",
    "nvme-rdma",
    "lnet",
    "iser",
    "infiniband_sdp",
    "fcoib",
];

fn need(tool: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "NOT RUN: {tool} is not installed (scripts/test-all.sh installs it: apt-get install tshark python3)"
    );
}

/// One run of every opcode over a linked pair, captured at `a`'s end.
fn capture(pcap: &str) {
    let opts = |p: Option<&str>| LinkOptions {
        pcap: p.map(Into::into),
        faults: WireFaults::default(),
        ..LinkOptions::default()
    };
    let mut l = linked_with(
        Sock::StreamUnix,
        "tshark",
        opts(Some(pcap)),
        opts(None),
        None,
    );
    let (mut qa, mut qb) = l.qps(QpType::Rc);
    // Lengths 1 to 4986 bytes: only, first, middle and last packets.
    rc_rounds(&mut l, &mut qa, &mut qb, 6);
    // A SEND before its receive is posted: RNR NAK, then the retry lands.
    fill(&l.a.buf, 0, 100, 1);
    qa.post_send(&[SendWr {
        wr_id: 50,
        op: SendOp::Send,
        payload: Payload::Sges(&[l.a.mr.sge(0, 100).unwrap()]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    until_rnr(&l);
    qb.post_recv(&[RecvWr {
        wr_id: 51,
        sg_list: &[l.b.mr.sge(0, 4096).unwrap()],
    }])
    .unwrap();
    assert_eq!(poll_n(&mut l.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&mut l.b.cq, 1)[0].wr_id, 51);
    // UD SEND.
    let (mut ua, mut ub) = l.qps(QpType::Ud);
    ub.post_recv(&[RecvWr {
        wr_id: 60,
        sg_list: &[l.b.mr.sge(0, 2048).unwrap()],
    }])
    .unwrap();
    let ah =
        l.a.pd
            .create_ah(&AhAttr {
                dgid: l.b.ctx.query_gid(1, 0).unwrap(),
                sgid_index: 0,
                hop_limit: 64,
                port_num: 1,
                ..Default::default()
            })
            .unwrap();
    ua.post_send(&[SendWr {
        wr_id: 61,
        op: SendOp::SendImm(9),
        payload: Payload::Sges(&[l.a.mr.sge(0, 500).unwrap()]),
        flags: sf::SIGNALED,
        ud: Some(UdDest {
            ah: &ah,
            remote_qpn: ub.qp_num(),
            remote_qkey: QKEY,
        }),
    }])
    .unwrap();
    assert_eq!(poll_n(&mut l.a.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&mut l.b.cq, 1)[0].wr_id, 60);
    counters_add_up(&l);
    let la = l.fa.link().unwrap();
    la.close();
}

fn until_rnr(l: &Linked) {
    let f = l.fa.function(0).unwrap();
    tests::wait::until("an RNR NAK", || f.model().stats().rnr_naks > 0);
}

#[test]
fn tshark_dissects_every_opcode_and_python_agrees_on_every_icrc() {
    need("tshark");
    need("python3");
    let pcap = std::env::temp_dir()
        .join(format!("wire-tshark-{}.pcap", std::process::id()))
        .to_string_lossy()
        .into_owned();
    capture(&pcap);

    let out = Command::new("tshark")
        .args([
            "-n",
            "-r",
            &pcap,
            "-d",
            "udp.port==4791,infiniband",
            "-T",
            "fields",
        ])
        .args(
            NO_PAYLOAD_GUESSES
                .iter()
                .flat_map(|p| ["--disable-protocol", p]),
        )
        .args([
            "-E",
            "separator=|",
            "-e",
            "frame.number",
            "-e",
            "udp.dstport",
        ])
        .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.bth.psn"])
        .args([
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.aeth.syndrome.opcode",
        ])
        .args(["-e", "_ws.malformed", "-e", "_ws.expert.message"])
        .output()
        .expect("running tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut opcodes = BTreeSet::new();
    // Request PSNs (and read response PSNs) by destination QP.
    let mut psns: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    let mut naks = 0;
    let mut frames = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split('|').collect();
        assert_eq!(f.len(), 8, "{line}");
        frames += 1;
        assert_eq!(f[1], "4791", "{line}");
        assert!(!f[2].is_empty(), "not dissected as InfiniBand: {line}");
        assert!(f[6].is_empty(), "malformed: {line}");
        for m in f[7].split(',').filter(|m| !m.is_empty()) {
            assert!(
                m.contains("Illegal checksum value (0)"),
                "expert note {m:?}: {line}"
            );
        }
        let op: u8 = f[2].parse().unwrap();
        let psn: u32 = f[3].parse().unwrap();
        let qp = u32::from_str_radix(f[4].trim_start_matches("0x"), 16).unwrap();
        opcodes.insert(op);
        // RC requests, and read responses (in the READ's PSN space).
        if op < 0x11 || op == 0x13 || op == 0x14 {
            psns.entry(qp).or_default().insert(psn);
        }
        if op == 0x11 {
            // AETH syndrome class: 0 ACK, 1 RNR NAK, 3 NAK.
            naks += u32::from(f[5] != "0");
        }
    }
    // Every RC opcode the model speaks but the invalidating SENDs, and the
    // UD SEND with immediate.
    let want: BTreeSet<u8> = (0x00..=0x14).chain([0x65]).collect();
    for o in &want {
        assert!(opcodes.contains(o), "no opcode {o:#04x} in {opcodes:x?}");
    }
    assert!(naks >= 1, "an RNR NAK dissected");
    // The RC requests to the QP, every PSN from the first to the last
    // (retries repeat one; none is skipped).
    let reqs: BTreeSet<u32> = psns.values().flatten().copied().collect();
    let (lo, hi) = (*reqs.first().unwrap(), *reqs.last().unwrap());
    assert_eq!(
        reqs.len() as u32,
        hi - lo + 1,
        "PSNs {lo:#x}..={hi:#x} with gaps"
    );
    assert!(frames > 100, "{frames} frames");

    let py = Command::new("python3")
        .args(["-c", ICRC_PY, &pcap])
        .output()
        .expect("running python3");
    let res = String::from_utf8_lossy(&py.stdout);
    assert!(
        py.status.success(),
        "python: {}",
        String::from_utf8_lossy(&py.stderr)
    );
    assert_eq!(
        res.lines().last().unwrap_or_default(),
        format!("frames {frames} bad 0"),
        "{res}"
    );
    let _ = std::fs::remove_file(&pcap);
}
