//! `ibv_post_send` and `ibv_poll_cq` through the C library (`ibverbs-c`,
//! the header's inline functions calling through `ibv_context.ops`) vs the
//! driver's Rust API on the same work, in one run: two built-in model
//! functions with an RC QP between them, in each case.
//!
//! Cases (ns per operation, medians of `C_ABI_BENCH_RUNS` runs, default 3):
//! - `poll_empty`: `ibv_poll_cq(cq, 1, &wc)` / `Cq::poll` of an empty CQ;
//! - `post_write`: one 64-byte RDMA WRITE posted (1023 a round, the last
//!   signaled; the posts alone are timed);
//! - `write_roundtrip`: one signaled WRITE posted and its completion
//!   polled, back to back (the model's time dominates).
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
    let mut wc = [Wc::default(); 1];
    let mut out = Vec::new();
    let t0 = Instant::now();
    for _ in 0..polls {
        assert_eq!(cq[0].poll(&mut wc).unwrap(), 0);
    }
    out.push((
        "poll_empty".into(),
        t0.elapsed().as_nanos() as f64 / polls as f64,
    ));
    let sge = [mr[0].sge(0, 64).unwrap()];
    let op = SendOp::RdmaWrite {
        raddr: mr[1].addr(),
        rkey: mr[1].rkey(),
    };
    let mut wait = |cq: &mut verbs::cq::Cq| loop {
        if cq.poll(&mut wc).unwrap() == 1 {
            assert_eq!(wc[0].status, WcStatus::Success);
            break;
        }
    };
    let mut posting = 0f64;
    for _ in 0..rounds {
        let t0 = Instant::now();
        for i in 0..SQ as u64 - 1 {
            let wr = SendWr {
                wr_id: i,
                op,
                payload: Payload::Sges(&sge),
                flags: if i == SQ as u64 - 2 {
                    send_flags::SIGNALED
                } else {
                    0
                },
                ud: None,
            };
            qp[0].post_send(std::slice::from_ref(&wr)).unwrap();
        }
        posting += t0.elapsed().as_nanos() as f64;
        wait(&mut cq[0]);
    }
    out.push((
        "post_write".into(),
        posting / (rounds as f64 * (SQ - 1) as f64),
    ));
    let t0 = Instant::now();
    for i in 0..rounds * 10 {
        let wr = SendWr {
            wr_id: i,
            op,
            payload: Payload::Sges(&sge),
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("c_abi: bench");
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
    let (exe, lib) = build_c(bench);
    let mut c: Vec<Vec<(String, f64)>> = Vec::new();
    let mut r: Vec<Vec<(String, f64)>> = Vec::new();
    let mut s: Vec<Vec<(String, f64)>> = Vec::new();
    for _ in 0..runs {
        // Interleaved, so load on the machine falls on both alike.
        c.push(run_c(&exe, &lib, polls, rounds, false));
        r.push(run_rust(polls, rounds));
        s.push(run_c(&exe, &lib, polls, rounds, true));
    }
    println!(
        "{:<16} {:>12} {:>14} {:>12} {:>8} {:>8}",
        "case", "C ABI ns", "C ABI 1-thr ns", "Rust ns", "ratio", "1-thr"
    );
    for (i, (name, _)) in c[0].iter().enumerate() {
        let cm = median(c.iter().map(|v| v[i].1).collect());
        let sm = median(s.iter().map(|v| v[i].1).collect());
        let rm = median(r.iter().map(|v| v[i].1).collect());
        println!(
            "{name:<16} {cm:>12.2} {sm:>14.2} {rm:>12.2} {:>8.2} {:>8.2}",
            cm / rm,
            sm / rm
        );
    }
}
