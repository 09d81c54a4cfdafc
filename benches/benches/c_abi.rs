//! `ibv_post_send` and `ibv_poll_cq` through the C library (`ibverbs-c`,
//! the header's inline functions calling through `ibv_context.ops`) vs the
//! driver's Rust API on the same work, in one run: two built-in model
//! functions with an RC QP between them, in each case.
//!
//! Cases (ns per operation: in each run the median of its rounds' times,
//! then the median of `C_ABI_BENCH_RUNS` runs, default 3):
//! - `poll_empty`: `ibv_poll_cq(cq, 1, &wc)` / `Cq::poll` of an empty CQ;
//! - `post_write`: one 64-byte RDMA WRITE posted (1023 a round, the last
//!   signaled; the posts alone are timed);
//! - `poll_1cqe`: `ibv_poll_cq(cq, 1, &wc)` / `Cq::poll` finding one
//!   completion: 1023 signaled WRITEs posted, and once the last one's
//!   bytes landed at B and 200 us more passed (the CQEs trail the bytes),
//!   their completions polled one per call (timed);
//!   `poll_1cqe_empty_calls` counts the timed calls that found none all
//!   the same, whose time, at `poll_empty`'s cost each, is taken off;
//! - `poll_16`: the same completions polled up to 16 a call
//!   (`ibv_poll_cq(cq, 16, wc)`), ns per completion, `poll_16_empty_calls`
//!   alike;
//! - `write_roundtrip`: one signaled WRITE posted and its completion
//!   polled, back to back (the model's time dominates).
//!
//! Instruction counts: the timed loops are functions of their own, in C
//! (`loop_poll_empty`, `loop_post`, `loop_poll_full`, `loop_poll16`) and here
//! (`c_abi::loop_*`), so callgrind collects them alone:
//! `valgrind --tool=callgrind --toggle-collect='loop_post*' EXE 100000 4`
//! on the C program, and on this bench's binary with
//! `C_ABI_PROFILE=POLLS,ROUNDS` (the Rust side once, no C build) and
//! `--toggle-collect='c_abi::loop_post*'`.
//!
//! The C side runs twice per round: as is, and with
//! `MLX5_SINGLE_THREADED=1` (the QP and CQ locks not taken, libmlx5's
//! knob). The C side is `benches/c/abi_post_poll.c`, built here with `cc -O2`
//! against Debian's verbs.h and the release library; it runs as its own
//! process. `cargo bench -p benches --bench c_abi`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use mlx5_emu::{Fabric, Profile};
use verbs::cq::{Wc, WcStatus};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::access;
use verbs::qp::{send_flags, Payload, QpCap, QpInitAttr, QpType, SendOp, SendWr};
use vfio::DmaBuffer;

const SQ: u32 = 1024;
/// The empty CQ's polls are timed in this many rounds (as the C side's).
const ROUNDS_EMPTY: u64 = 100;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Builds the release library and the C program; its path and the lib dir.
fn build_c(release: bool) -> (PathBuf, PathBuf) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec!["build", "-q", "-p", "ibverbs-c"];
    if release {
        // The bench profile (LTO, one codegen unit), as the Rust side here.
        args.extend(["--profile", "bench"]);
    }
    let o = Command::new(cargo)
        .current_dir(root())
        .args(&args)
        .output()
        .expect("cargo build");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let target = std::env::var("CARGO_TARGET_DIR").map_or(root().join("target"), PathBuf::from);
    let lib = target
        .join(if release { "release" } else { "debug" })
        .join("ibverbs-bench");
    std::fs::create_dir_all(&lib).unwrap();
    for n in ["libibverbs.so.1", "libibverbs.so"] {
        let l = lib.join(n);
        let _ = std::fs::remove_file(&l);
        std::os::unix::fs::symlink("../libibverbs.so", &l).unwrap();
    }
    let exe = lib.join("abi_post_poll");
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-I"])
        .arg(root().join("ibverbs-c/include"))
        .arg("-o")
        .arg(&exe)
        .arg(root().join("benches/c/abi_post_poll.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-libverbs")
        .output()
        .expect("cc");
    assert!(
        o.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (exe, lib)
}

fn run_c(exe: &Path, lib: &Path, polls: u64, rounds: u64, single: bool) -> Vec<(String, f64)> {
    let o = Command::new(exe)
        .args([polls.to_string(), rounds.to_string()])
        .env("LD_LIBRARY_PATH", lib)
        .env("MLX5_SINGLE_THREADED", if single { "1" } else { "0" })
        .output()
        .expect("running abi_post_poll");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Whether the C library's QP and CQ locks were biased in a short run of
/// the program with the default locks: its `ibverbs::spin` log says
/// whether membarrier registration succeeded (a kernel or sandbox that
/// refuses it leaves them spinlocks: one atomic per post and poll).
fn c_lock_mode(exe: &Path, lib: &Path) -> String {
    let o = Command::new(exe)
        .args(["1000", "1"])
        .env("LD_LIBRARY_PATH", lib)
        .env("MLX5_SINGLE_THREADED", "0")
        .env("MLX5_LOG", "ibverbs::spin=debug")
        .env("NO_COLOR", "1")
        .output()
        .expect("running abi_post_poll");
    let log = String::from_utf8_lossy(&o.stderr);
    if log.contains("membarrier registered") {
        "biased (membarrier registered)".into()
    } else if let Some(l) = log.lines().find(|l| l.contains("membarrier")) {
        format!("spinlocks: {}", l.trim())
    } else {
        "unknown (no membarrier line in the library's log)".into()
    }
}

/// rdma-core's harness (the reference rdma-core-bench harness, built
/// outside the repo): `RDMA_CORE_BENCH_HARNESS`, else its default cache path.
fn rdma_core_harness() -> Option<PathBuf> {
    let p = std::env::var_os("RDMA_CORE_BENCH_HARNESS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|h| Path::new(&h).join(".cache/rdma-core-bench/44.0-2/bin/harness"))
        })?;
    p.is_file().then_some(p)
}

/// libmlx5's `ibv_post_send` of one WRITE (doorbell only, as our posts on
/// the model's UAR) and `ibv_poll_cq(cq, 1)` finding a CQE, default locks
/// and `MLX5_SINGLE_THREADED`: (our case name, ns) pairs, C-side columns.
fn run_rdma_core(h: &Path, ops: u64) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (case, ours) in [
        ("post_send_write_1_db", "post_write"),
        ("poll_cq_1", "poll_1cqe"),
    ] {
        let o = Command::new(h)
            .args([
                "--ops",
                &ops.to_string(),
                "--rounds",
                "3",
                "--locks",
                "both",
            ])
            .args(["--case", case])
            .output()
            .expect("running rdma-core's harness");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            // One JSON object a line: pick the exact case ("poll_cq_1"
            // also matches "poll_cq_16") and its ns_per_op.
            let field = |k: &str| {
                let at = l.find(&format!("\"{k}\": "))? + k.len() + 4;
                let v = &l[at..];
                let end = v.find([',', '}'])?;
                Some(v[..end].trim().trim_matches('"').to_string())
            };
            if field("case").as_deref() != Some(case) {
                continue;
            }
            let locks = field("locks").unwrap_or_default();
            let ns: f64 = field("ns_per_op")
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN);
            out.push((format!("{ours}/{locks}"), ns));
        }
    }
    out
}

fn run_rust(polls: u64, rounds: u64) -> Vec<(String, f64)> {
    let fabric = Fabric::cabled(2, Profile::ConnectX4Lx);
    let ctx: Vec<Context> = (0..2)
        .map(|i| Context::open(fabric.function(i).unwrap(), HcaOptions::default()).unwrap())
        .collect();
    let pd: Vec<_> = ctx.iter().map(|c| c.alloc_pd().unwrap()).collect();
    let mut cq: Vec<_> = ctx
        .iter()
        .map(|c| c.create_cq(SQ, None, None).unwrap())
        .collect();
    let buf: Vec<_> = (0..2)
        .map(|_| std::sync::Arc::new(DmaBuffer::new(1 << 20).unwrap()))
        .collect();
    let acc = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    let mr: Vec<_> = (0..2)
        .map(|i| pd[i].reg_mr_buffer(&buf[i], 0, 1 << 20, acc).unwrap())
        .collect();
    let mut qp: Vec<_> = (0..2)
        .map(|i| {
            pd[i]
                .create_qp(&QpInitAttr {
                    send_cq: &cq[i],
                    recv_cq: &cq[i],
                    srq: None,
                    cap: QpCap {
                        max_send_wr: SQ,
                        max_recv_wr: 16,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    qp_type: QpType::Rc,
                    sq_sig_all: false,
                })
                .unwrap()
        })
        .collect();
    let (q0, q1) = (qp[0].qp_num(), qp[1].qp_num());
    benches::connect(&mut qp[0], &ctx[1], q1);
    benches::connect(&mut qp[1], &ctx[0], q0);
    let mut out = Vec::new();
    let per_round = polls / ROUNDS_EMPTY;
    let times = (0..ROUNDS_EMPTY)
        .map(|_| {
            let t0 = Instant::now();
            loop_poll_empty(&mut cq[0], per_round);
            t0.elapsed().as_nanos() as f64
        })
        .collect();
    out.push(("poll_empty".into(), median(times) / per_round as f64));
    let sge = mr[0].sge(0, 64).unwrap();
    let (raddr, rkey) = (mr[1].addr(), mr[1].rkey());
    let wrs = f64::from(SQ - 1);
    let times = (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            loop_post(&mut qp[0], &sge, raddr, rkey, u64::from(SQ) - 1);
            let t = t0.elapsed().as_nanos() as f64;
            wait(&mut cq[0]);
            t
        })
        .collect();
    out.push(("post_write".into(), median(times) / wrs));
    // SQ-1 signaled WRITEs; once the last one's bytes landed at B, their
    // completions polled one per call (timed), then up to 16 a call.
    for (case, per_call) in [("poll_1cqe", 1), ("poll_16", 16)] {
        let mut empty = 0u64;
        let times = (0..rounds)
            .map(|r| {
                let stamp = (r + 1 + if per_call == 1 { 0 } else { rounds }) << 16;
                post_round(&mut qp[0], &mr[0], [&buf[0], &buf[1]], raddr, rkey, stamp);
                let t0 = Instant::now();
                empty += if per_call == 1 {
                    loop_poll_full(&mut cq[0], u64::from(SQ) - 1)
                } else {
                    loop_poll16(&mut cq[0], u64::from(SQ) - 1)
                };
                t0.elapsed().as_nanos() as f64
            })
            .collect();
        out.push((case.into(), median(times) / wrs));
        out.push((format!("{case}_empty_calls"), empty as f64));
    }
    let t0 = Instant::now();
    for i in 0..rounds * 10 {
        let wr = SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite { raddr, rkey },
            payload: Payload::Sges(std::slice::from_ref(&sge)),
            flags: send_flags::SIGNALED,
            ud: None,
        };
        qp[0].post_send(std::slice::from_ref(&wr)).unwrap();
        wait(&mut cq[0]);
    }
    out.push((
        "write_roundtrip".into(),
        t0.elapsed().as_nanos() as f64 / (rounds * 10) as f64,
    ));
    out
}

/// The wait after a round's last bytes landed, for its CQEs (`post_round`).
const SETTLE: std::time::Duration = std::time::Duration::from_micros(200);

/// SQ-1 signaled WRITEs, WR i from and to slot i (`stamp + i` in its
/// first 8 bytes), the wait until the last one's bytes are at B, and then
/// `SETTLE` more: the CQEs trail the bytes, and a timed poll racing the
/// model's CQE writes measures the race, not the poll (the empty calls,
/// counted, show whether the settle was long enough).
fn post_round(
    qp: &mut verbs::qp::Qp,
    mr: &verbs::mr::Mr,
    buf: [&DmaBuffer; 2],
    raddr: u64,
    rkey: u32,
    stamp: u64,
) {
    for i in 0..u64::from(SQ) - 1 {
        buf[0].write_u64_be(64 * i as usize, stamp + i).unwrap();
        let s = mr.sge(64 * i, 64).unwrap();
        let wr = SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite {
                raddr: raddr + 64 * i,
                rkey,
            },
            payload: Payload::Sges(std::slice::from_ref(&s)),
            flags: send_flags::SIGNALED,
            ud: None,
        };
        qp.post_send(std::slice::from_ref(&wr)).unwrap();
    }
    let last = u64::from(SQ) - 2;
    while buf[1].read_u64_be(64 * last as usize).unwrap() != stamp + last {
        std::thread::yield_now();
    }
    let t0 = Instant::now();
    while t0.elapsed() < SETTLE {
        std::thread::yield_now();
    }
}

fn wait(cq: &mut verbs::cq::Cq) {
    let mut wc = [Wc::default(); 1];
    loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success);
            break;
        }
    }
}

// The timed loops, each its own function so that callgrind can collect
// them alone (`--toggle-collect='c_abi::loop_*'`), as the C side's.

#[inline(never)]
fn loop_poll_empty(cq: &mut verbs::cq::Cq, n: u64) {
    let mut wc = [Wc::default(); 1];
    for _ in 0..n {
        assert_eq!(cq.poll(&mut wc).unwrap(), 0);
    }
}

/// `n` WRITEs, one `post_send` each, the last signaled.
#[inline(never)]
fn loop_post(qp: &mut verbs::qp::Qp, sge: &verbs::mr::Sge, raddr: u64, rkey: u32, n: u64) {
    for i in 0..n {
        let wr = SendWr {
            wr_id: i,
            op: SendOp::RdmaWrite { raddr, rkey },
            payload: Payload::Sges(std::slice::from_ref(sge)),
            flags: if i == n - 1 { send_flags::SIGNALED } else { 0 },
            ud: None,
        };
        qp.post_send(std::slice::from_ref(&wr)).unwrap();
    }
}

/// Polls `n` completions up to 16 per call; the calls that found none.
#[inline(never)]
fn loop_poll16(cq: &mut verbs::cq::Cq, n: u64) -> u64 {
    let mut wc = [Wc::default(); 16];
    let (mut got, mut empty) = (0u64, 0u64);
    while got < n {
        let k = cq.poll(&mut wc).unwrap();
        assert!(wc[..k].iter().all(|w| w.status == WcStatus::Success));
        got += k as u64;
        empty += u64::from(k == 0);
    }
    empty
}

/// Polls `n` completions one per call; the calls that found none.
#[inline(never)]
fn loop_poll_full(cq: &mut verbs::cq::Cq, n: u64) -> u64 {
    let mut wc = [Wc::default(); 1];
    let (mut got, mut empty) = (0u64, 0u64);
    while got < n {
        let k = cq.poll(&mut wc).unwrap() as u64;
        assert!(k == 0 || wc[0].status == WcStatus::Success);
        got += k;
        empty += u64::from(k == 0);
    }
    empty
}

/// `poll_1cqe` and `poll_16` less the time of the polls in them that
/// found nothing (at `poll_empty`'s cost each): the CQEs can trail the
/// last WRITE's bytes.
fn net_of_empty(mut v: Vec<(String, f64)>, rounds: u64) -> Vec<(String, f64)> {
    let get =
        |v: &[(String, f64)], k: &str| v.iter().find(|(n, _)| n == k).map_or(0.0, |(_, x)| *x);
    let empty = get(&v, "poll_empty");
    let cqes = rounds as f64 * f64::from(SQ - 1);
    for case in ["poll_1cqe", "poll_16"] {
        let calls = get(&v, &format!("{case}_empty_calls"));
        if let Some((_, t)) = v.iter_mut().find(|(n, _)| n == case) {
            *t -= calls * empty / cqes;
        }
    }
    v
}

/// rdma-core's rows: medians over the interleaved runs.
fn print_rdma_core(m: &[Vec<(String, f64)>], h: Option<&Path>) {
    let Some(first) = m.first() else {
        println!(
            "rdma-core libmlx5: NOT RUN (a smoke run under cargo test reads nothing outside \
             the clone; under cargo bench: no harness, build rdma-core-bench and set \
             RDMA_CORE_BENCH_HARNESS)"
        );
        return;
    };
    println!(
        "rdma-core libmlx5 ({}):",
        h.map_or(String::new(), |p| p.display().to_string())
    );
    for (i, (name, _)) in first.iter().enumerate() {
        let v = median(m.iter().map(|r| r[i].1).collect());
        println!("  {name:<24} {v:>10.2} ns");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("c_abi: bench");
        return;
    }
    // C_ABI_PROFILE=POLLS,ROUNDS: the Rust side once, no criterion and no
    // C build (under callgrind: --toggle-collect='c_abi::loop_*').
    if let Ok(p) = std::env::var("C_ABI_PROFILE") {
        let mut it = p
            .split(',')
            .map(|v| v.parse::<u64>().expect("C_ABI_PROFILE=POLLS,ROUNDS"));
        let (polls, rounds) = (it.next().unwrap_or(100_000), it.next().unwrap_or(4));
        for (k, v) in run_rust(polls, rounds) {
            println!("{k} {v:.2}");
        }
        return;
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` does not:
    // then one short round on debug builds, to show the bench still runs.
    let bench = std::env::args().any(|a| a == "--bench");
    let runs: usize = match bench {
        true => std::env::var("C_ABI_BENCH_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(3),
        false => 1,
    };
    let (polls, rounds) = if bench {
        (2_000_000u64, 200u64)
    } else {
        (10_000, 2)
    };
    // C_ABI_PREBUILT=DIR: DIR holds abi_post_poll and the library (a
    // machine without cargo or cc).
    let (exe, lib) = match std::env::var_os("C_ABI_PREBUILT") {
        Some(d) => (Path::new(&d).join("abi_post_poll"), PathBuf::from(d)),
        None => build_c(bench),
    };
    // The reference harness lives outside the clone: a bench run uses
    // it, the test suite's smoke run reads nothing outside the clone.
    let harness = if bench { rdma_core_harness() } else { None };
    let mut c: Vec<Vec<(String, f64)>> = Vec::new();
    let mut r: Vec<Vec<(String, f64)>> = Vec::new();
    let mut s: Vec<Vec<(String, f64)>> = Vec::new();
    let mut m: Vec<Vec<(String, f64)>> = Vec::new();
    for _ in 0..runs {
        // Interleaved, so load on the machine falls on all alike.
        c.push(net_of_empty(
            run_c(&exe, &lib, polls, rounds, false),
            rounds,
        ));
        r.push(net_of_empty(run_rust(polls, rounds), rounds));
        s.push(net_of_empty(run_c(&exe, &lib, polls, rounds, true), rounds));
        if let Some(h) = &harness {
            m.push(run_rdma_core(h, polls));
        }
    }
    print_rdma_core(&m, harness.as_deref());
    println!("C ABI default locks: {}", c_lock_mode(&exe, &lib));
    println!(
        "{:<16} {:>12} {:>14} {:>12} {:>8} {:>8}",
        "case", "C ABI ns", "C ABI 1-thr ns", "Rust ns", "ratio", "1-thr"
    );
    for (i, (name, _)) in c[0].iter().enumerate() {
        let cm = median(c.iter().map(|v| v[i].1).collect());
        let sm = median(s.iter().map(|v| v[i].1).collect());
        let rm = median(r.iter().map(|v| v[i].1).collect());
        if name.ends_with("_calls") {
            // A count (polls that found nothing), not a time.
            println!("{name:<16} {cm:>12} {sm:>14} {rm:>12}");
            continue;
        }
        println!(
            "{name:<16} {cm:>12.2} {sm:>14.2} {rm:>12.2} {:>8.2} {:>8.2}",
            cm / rm,
            sm / rm
        );
    }
}
