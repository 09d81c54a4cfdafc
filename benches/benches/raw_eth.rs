//! Raw Ethernet send bursts, the driver alone (issue 26): `tx_burst` of
//! 64-byte frames (18 bytes of headers inline, one-block WQEs, or 42
//! bytes, two-block ones; the rest of the frame by one data segment,
//! checksum offload asked) in bursts of 1, 8 and 32, one doorbell
//! per burst; `tx_burst_empw` of whole 64-byte frames (a ConnectX-5 model,
//! which offers enhanced multi-packet WQEs): each frame one 16-byte data
//! segment, or copied inline; beside the project's RDMA `post_send` of 1 and 32 WRs
//! (`benches::ApiRig`), in one run. The models are stopped after set-up:
//! no device reads the WQEs; every 512 packets the send ring is counted as
//! completed (`RawPacketQp::tx_rewind`, as rdma-core's harness sets
//! `sq.tail = sq.head`). The UAR is the model's BAR, ordinary memory.
//!
//! Then, side by side in the same run (interleaved `RAW_ETH_RUNS` times,
//! default 3): rdma-core's libmlx5 44.0 raw packet `ibv_post_send` and
//! `ibv_wr_*` bursts of 1, 8 and 32 64-byte frames and its RC WRITE lists
//! (`benches/c/rdma-core-raw.sh`, compiled against the reference
//! rdma-core-bench build; without it the rows say NOT RUN), beside the
//! driver's `tx_burst` (18 B inline, the same one-block WQE libmlx5 makes)
//! and `post_send` of RDMA WRITEs at the same bursts, timed the same way
//! here: rounds of a fixed packet count, their median and fastest, the last
//! WR of a burst signaled; completions emulated (libmlx5 `sq.tail =
//! sq.head` and `tx_rewind` after each burst; `post_send` rewound every 512
//! WRs). `RAW_ETH_SIDE_BY_SIDE`: `0` skips it, `only` runs it without the
//! criterion cases.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use benches::{ApiRig, RING};
use criterion::{Criterion, Throughput};
use mlx5_emu::{Fabric, Profile};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::access;
use verbs::qp::send_flags;
use verbs::raw_eth::{RawPacketQp, RawQpCap, TxFrame, TxPkt};
use verbs::wr::{Payload, SendOp, SendWr};
use vfio::emulated::DeviceModel;
use vfio::{DmaBuffer, PciFunction};

/// Everything the bench keeps alive (leaked: the models are gone).
struct RawRig {
    _fabric: Fabric,
    qp: RawPacketQp,
    mr: verbs::mr::Mr,
    _keep: Box<dyn std::any::Any>,
}

impl RawRig {
    /// The payload: `len` bytes at the MR's start.
    fn qp_sge(&self, len: usize) -> Option<verbs::mr::Sge> {
        Some(self.mr.sge(0, len as u32).expect("sge"))
    }
}

fn raw_rig(profile: Profile) -> &'static mut RawRig {
    let fabric = Fabric::cabled(2, profile);
    let f = fabric.function(0).expect("function");
    let opts = HcaOptions {
        health_interval: None,
        ..HcaOptions::default()
    };
    let ctx = Context::open(f.clone() as Arc<dyn PciFunction>, opts).expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let tx = ctx.create_cq(1023, None, None).expect("cq");
    let rx = ctx.create_cq(15, None, None).expect("cq");
    let cap = RawQpCap {
        log_sq_bbs: 11,
        log_rq_wqes: 4,
        strip_vlan: false,
        tunnel_offloads: false,
        striding: None,
    };
    let qp = ctx
        .create_raw_packet_qp(&pd, &tx, &rx, cap)
        .expect("raw qp");
    let buf = DmaBuffer::new(1 << 16).expect("buffer");
    let mr = pd
        .reg_mr_buffer(&buf, 0, 1 << 16, access::LOCAL_WRITE)
        .expect("mr");
    f.model().shutdown();
    if let Some(g) = fabric.function(1) {
        g.model().shutdown();
    }
    Box::leak(Box::new(RawRig {
        _fabric: fabric,
        qp,
        mr,
        _keep: Box::new((ctx, pd, tx, rx, buf)),
    }))
}

fn bench(c: &mut Criterion) {
    let raw = raw_rig(Profile::ConnectX4Lx);
    let hdr = [0x5au8; 42];
    let mut g = c.benchmark_group("raw_eth");
    g.measurement_time(Duration::from_secs(4));
    // 18 bytes inline (Ethernet and a VLAN tag, mlx5e's usual minimum):
    // one-block WQEs built in registers; 42 (Ethernet, IPv4, UDP): two
    // blocks through the staging buffer.
    for (inline, blocks) in [(18usize, "1 block"), (42, "2 blocks")] {
        let pkt = TxPkt {
            headers: &hdr[..inline],
            payload: raw.qp_sge(64 - inline),
            csum: true,
            mss: 0,
            vlan: None,
        };
        let pkts = [pkt; 32];
        for per in [1usize, 8, 32] {
            g.throughput(Throughput::Elements(per as u64));
            let mut i = 0usize;
            let qp = &mut raw.qp;
            let name = format!("tx_burst {per} x 64 B, {inline} B inline ({blocks})");
            g.bench_function(name, |b| {
                b.iter(|| {
                    let n = qp.tx_burst(black_box(&pkts[..per]));
                    i += per;
                    if i >= 512 {
                        qp.tx_rewind();
                        i = 0;
                    }
                    assert_eq!(n, per);
                })
            });
        }
    }
    // Whole 64-byte frames by enhanced multi-packet WQEs: by pointer (one
    // data segment each) and copied inline (five segments each).
    let empw = raw_rig(Profile::ConnectX5);
    let frame = [0x5au8; 64];
    let by_ref = [TxFrame::Ref(empw.mr.sge(0, 64).expect("sge")); 32];
    let inline = [TxFrame::Inline(&frame); 32];
    for (frames, how) in [(&by_ref, "by pointer"), (&inline, "inline")] {
        for per in [1usize, 8, 32] {
            if how == "inline" && per != 32 {
                continue;
            }
            g.throughput(Throughput::Elements(per as u64));
            let mut i = 0usize;
            let qp = &mut empw.qp;
            g.bench_function(format!("tx_burst_empw {per} x 64 B, {how}"), |b| {
                b.iter(|| {
                    let n = qp.tx_burst_empw(black_box(&frames[..per]), true);
                    i += per;
                    if i >= 512 {
                        qp.tx_rewind();
                        i = 0;
                    }
                    assert_eq!(n.ok(), Some(per));
                })
            });
        }
    }
    let rig = ApiRig::new();
    let sge = rig.sge();
    let (raddr, rkey) = rig.remote();
    let list: Vec<SendWr<'_>> = (0..32)
        .map(|k| ApiRig::write_wr(k, raddr, rkey, &sge))
        .collect();
    let base = rig.qp.send_ring().pc();
    for per in [1usize, 32] {
        g.throughput(Throughput::Elements(per as u64));
        let mut i = 0u32;
        let qp = &mut rig.qp;
        g.bench_function(format!("post_send {per} RDMA WRITE (beside)"), |b| {
            b.iter(|| {
                let r = qp.post_send(black_box(&list[..per]));
                i += per as u32;
                if i >= RING as u32 / 2 {
                    qp.send_ring().rewind(base);
                    i = 0;
                }
                r
            })
        });
    }
    g.finish();
}

/// The bursts of the side-by-side table.
const BURSTS: [usize; 3] = [1, 8, 32];

/// One row of rdma-core's program: its case, burst, locks, median and
/// fastest round (ns per packet).
#[derive(Debug, Clone)]
struct CRow {
    case: String,
    burst: usize,
    locks: String,
    median: f64,
    min: f64,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repository root")
        .to_path_buf()
}

/// `benches/c/rdma-core-raw.sh`: compiles `rdma_core_raw.c` against the
/// reference rdma-core-bench build (if needed) and runs it. Its rows, or
/// why it did not run (the script's last line on stderr).
fn run_rdma_core(ops: u64, rounds: u32) -> Result<Vec<CRow>, String> {
    let script = root().join("benches/c/rdma-core-raw.sh");
    let o = Command::new("bash")
        .arg(&script)
        .args(["--ops", &ops.to_string(), "--rounds", &rounds.to_string()])
        .args(["--locks", "both"])
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let why = err.lines().rev().find(|l| !l.trim().is_empty());
        return Err(format!(
            "{} exited {}: {}",
            script.display(),
            o.status,
            why.unwrap_or("no message")
        ));
    }
    let rows: Vec<CRow> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            // One JSON object a line, flat: "key": value.
            let field = |k: &str| {
                let at = l.find(&format!("\"{k}\": "))? + k.len() + 4;
                let v = &l[at..];
                let end = v.find([',', '}'])?;
                Some(v[..end].trim().trim_matches('"').to_string())
            };
            Some(CRow {
                case: field("case")?,
                burst: field("burst")?.parse().ok()?,
                locks: field("locks")?,
                median: field("ns_per_op")?.parse().ok()?,
                min: field("min")?.parse().ok()?,
            })
        })
        .collect();
    if rows.is_empty() {
        return Err(format!("{} printed no rows", script.display()));
    }
    Ok(rows)
}

/// `rounds` rounds of `ops` packets in bursts of `per` (after a warm-up of
/// a tenth), as the C program times: (median, fastest) ns per packet.
fn time_rounds(ops: u64, rounds: u32, per: usize, mut f: impl FnMut(u64)) -> (f64, f64) {
    let iters = ops / per as u64;
    f(iters / 10 + 1);
    let mut r: Vec<f64> = (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            f(iters);
            t0.elapsed().as_nanos() as f64 / (iters * per as u64) as f64
        })
        .collect();
    r.sort_by(f64::total_cmp);
    (r[r.len() / 2], r[0])
}

/// The driver's side, timed as the C program times libmlx5's:
/// `tx_burst` of 64-byte frames (18 B inline, checksums asked, one
/// 46-byte data segment: one block each, the last signaled) with the
/// ring counted as completed after each burst; `post_send` of RDMA
/// WRITE lists (64 B, the last signaled), the producer rewound every
/// half ring. Rows: (name, burst, median, fastest).
fn run_ours(
    raw: &mut RawRig,
    rig: &mut ApiRig,
    ops: u64,
    rounds: u32,
) -> Vec<(&'static str, usize, f64, f64)> {
    let hdr = [0x5au8; 18];
    let pkt = TxPkt {
        headers: &hdr,
        payload: raw.qp_sge(64 - hdr.len()),
        csum: true,
        mss: 0,
        vlan: None,
    };
    let pkts = [pkt; 32];
    let mut out = Vec::new();
    for per in BURSTS {
        let qp = &mut raw.qp;
        let (med, min) = time_rounds(ops, rounds, per, |n| {
            let mut sent = 0;
            for _ in 0..n {
                sent += qp.tx_burst(black_box(&pkts[..per]));
                qp.tx_rewind(); // emulated completion
            }
            assert_eq!(sent, n as usize * per);
        });
        out.push(("tx_burst", per, med, min));
    }
    let sge = rig.sge();
    let (raddr, rkey) = rig.remote();
    let base = rig.qp.send_ring().pc();
    for per in BURSTS {
        let list: Vec<SendWr<'_>> = (0..per)
            .map(|k| SendWr {
                wr_id: k as u64,
                op: SendOp::RdmaWrite {
                    raddr: raddr + 64 * k as u64,
                    rkey,
                },
                payload: Payload::Sges(std::slice::from_ref(&sge)),
                flags: if k == per - 1 {
                    send_flags::SIGNALED
                } else {
                    0
                },
                ud: None,
            })
            .collect();
        let qp = &mut rig.qp;
        let mut i = 0usize;
        let (med, min) = time_rounds(ops, rounds, per, |n| {
            for _ in 0..n {
                qp.post_send(black_box(&list)).expect("post_send");
                i += per;
                if i >= RING / 2 {
                    qp.send_ring().rewind(base);
                    i = 0;
                }
            }
        });
        // Back where the runs start, so that the next one has the same room.
        qp.send_ring().rewind(base);
        out.push(("post_send RDMA WRITE", per, med, min));
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The side-by-side table: rdma-core's program and the driver, `runs`
/// times interleaved (so load falls on both alike); medians over the runs.
fn side_by_side(raw: &mut RawRig, rig: &mut ApiRig, bench: bool) {
    let (ops, rounds, runs) = if bench {
        let runs = std::env::var("RAW_ETH_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3usize)
            .max(1);
        (20_000u64, 63u32, runs)
    } else {
        (3_200, 3, 1)
    };
    let mut c: Vec<Vec<CRow>> = Vec::new();
    let mut r = Vec::new();
    // The rdma-core build lives outside the clone (the reference tool's
    // cache): a bench run uses it, the test suite's smoke run reads
    // nothing outside the clone.
    let mut why = (!bench).then(|| {
        "a smoke run under cargo test (the suite reads nothing outside the clone; \
         `cargo bench -p benches --bench raw_eth` runs it)"
            .to_string()
    });
    for _ in 0..runs {
        if why.is_none() {
            match run_rdma_core(ops, rounds) {
                Ok(rows) => c.push(rows),
                Err(e) => why = Some(e),
            }
        }
        r.push(run_ours(raw, rig, ops, rounds));
    }
    println!(
        "\nraw_eth side by side: ns per packet (WR), {runs} interleaved run(s) of \
         {rounds} rounds x {ops} packets: median of the runs' medians (fastest round); \
         driver / libmlx5 of the medians (of the fastest rounds)"
    );
    let ours = |name: &str, per: usize| {
        let rows = r.iter().map(|v| {
            v.iter()
                .find(|(n, b, ..)| *n == name && *b == per)
                .copied()
                .expect("row")
        });
        let (m, f): (Vec<f64>, Vec<f64>) = rows.map(|(_, _, m, f)| (m, f)).unzip();
        (median(m), f.into_iter().fold(f64::INFINITY, f64::min))
    };
    let theirs = |case: &str, per: usize, locks: &str| {
        let rows = c.iter().filter_map(|v| {
            v.iter()
                .find(|x| x.case == case && x.burst == per && x.locks == locks)
        });
        let (m, f): (Vec<f64>, Vec<f64>) = rows.map(|x| (x.median, x.min)).unzip();
        (!m.is_empty()).then(|| (median(m), f.into_iter().fold(f64::INFINITY, f64::min)))
    };
    let cell = |v: Option<(f64, f64)>| {
        v.map_or("NOT RUN".to_string(), |(m, f)| format!("{m:.2} ({f:.2})"))
    };
    // driver / libmlx5: of the medians, and of the fastest rounds
    let ratio = |a: (f64, f64), b: Option<(f64, f64)>| {
        b.map_or("-".to_string(), |b| {
            format!("{:.2} ({:.2})", a.0 / b.0, a.1 / b.1)
        })
    };
    if !bench {
        println!("(no --bench: one short smoke run, the driver possibly a debug build; no figure here means anything)");
    }
    if let Some(e) = &why {
        println!("rdma-core libmlx5: NOT RUN ({e})");
    }
    println!(
        "{:<24} {:>14} | {:<24} {:>14} {:>14} | {:>12} {:>12}",
        "driver", "ns", "libmlx5 44.0", "locks", "1-thread", "/locks", "/1-thread"
    );
    for (ours_name, c_case, c_label) in [
        ("tx_burst", "raw_post_send", "ibv_post_send raw"),
        ("tx_burst", "raw_wr_send", "ibv_wr_* raw"),
        (
            "post_send RDMA WRITE",
            "rc_post_send_write",
            "ibv_post_send RC WRITE",
        ),
    ] {
        for per in BURSTS {
            let o = ours(ours_name, per);
            let case = format!("{c_case}_{per}");
            let (d, s) = (theirs(&case, per, "default"), theirs(&case, per, "off"));
            println!(
                "{:<24} {:>14} | {:<24} {:>14} {:>14} | {:>12} {:>12}",
                format!("{ours_name} {per}"),
                format!("{:.2} ({:.2})", o.0, o.1),
                format!("{c_label} {per}"),
                cell(d),
                cell(s),
                ratio(o, d),
                ratio(o, s)
            );
        }
    }
}

fn main() {
    let mode = std::env::var("RAW_ETH_SIDE_BY_SIDE").unwrap_or_default();
    let list = std::env::args().any(|a| a == "--list");
    if mode != "only" {
        let mut c = Criterion::default().configure_from_args();
        bench(&mut c);
        c.final_summary();
    }
    if list || mode == "0" {
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` does not:
    // then one short run, to show the comparison still runs.
    let bench = std::env::args().any(|a| a == "--bench");
    side_by_side(raw_rig(Profile::ConnectX4Lx), ApiRig::new(), bench);
}
