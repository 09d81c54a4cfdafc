//! Two processes, two drivers: two `mlx5-emu serve` processes whose ports
//! are wired by a socket (`--wire`), each with its own driver.
//!
//! - Every `mlx5-perf` program runs with its server on one model and its
//!   client on the other, each `mlx5-perf` a process of its own
//!   (`-d vfio-user:...`), over the stream wire.
//! - The soak: RC traffic of every opcode (SEND, SEND with immediate,
//!   WRITE, WRITE with immediate, READ, FetchAdd, CmpSwap; 1 to 6000
//!   bytes) for a fixed count of messages over the datagram wire with 1%
//!   loss, 1% reordering and 0.1% corruption on both models' egress: every
//!   message completes once, successfully, with its data intact; each
//!   atomic executed once; and the two models' wire counts, printed at
//!   exit, add up (what one received is what the other sent, its bad
//!   ICRCs the frames the other corrupted).

mod verbs_common;
mod wire_common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;

use tests::wait::HANG_GUARD;
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::qp::QpType;
use verbs_common::*;
use vfio::user::VfioUserFunction;
use wire_common::*;

/// The workspace's binaries, built now so they carry this tree's code.
fn bin(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["build", "-q", "-p", "tools", "--bin", name])
        .output()
        .expect("running cargo build");
    assert!(
        out.status.success(),
        "cargo build {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // target/debug/deps/<this test> -> target/debug/<name>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join(name)
}

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("wire-2p-{}-{tag}", std::process::id()))
}

/// One `mlx5-emu serve` with its port on the wire.
struct Served {
    child: Child,
    sock: PathBuf,
    log: Receiver<String>,
}

impl Served {
    fn start(tag: &str, mac: &str, wire: &str, faults: Option<&str>) -> Self {
        let sock = tmp(&format!("{tag}.sock"));
        let mut cmd = Command::new(bin("mlx5-emu"));
        cmd.args([
            "serve",
            "--mac",
            mac,
            "--wire",
            wire,
            "--response-wait-ms",
            "500",
        ])
        .arg("--socket")
        .arg(&sock)
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped());
        if let Some(f) = faults {
            cmd.args(["--wire-faults", f]);
        }
        let mut child = cmd.spawn().expect("starting mlx5-emu serve");
        let err = child.stderr.take().expect("piped stderr");
        let (tx, log) = mpsc::channel();
        let t = tag.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[mlx5-emu {t}] {line}");
                let _ = tx.send(line);
            }
        });
        loop {
            match log.recv_timeout(HANG_GUARD) {
                Ok(l) if l.contains("mlx5-emu: serving") => break,
                Ok(_) => {}
                Err(e) => panic!("mlx5-emu serve never said it serves ({e})"),
            }
        }
        Self { child, sock, log }
    }

    fn dev(&self) -> String {
        format!("vfio-user:{}", self.sock.display())
    }

    fn open(&self) -> Context {
        let f = VfioUserFunction::connect(&self.sock).unwrap_or_else(|e| panic!("connect: {e}"));
        Context::open(Arc::new(f), HcaOptions::default()).unwrap_or_else(|e| panic!("open: {e}"))
    }

    /// Stops it (SIGTERM) and returns its wire counts, the exit line's
    /// `name value` pairs.
    fn stop(mut self) -> Vec<(String, u64)> {
        // SAFETY: kill(2) on our own child's pid; no memory involved.
        let r = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "mlx5-emu serve: {status}");
        // Every line the process wrote (the reader ends at its exit).
        let line = self
            .log
            .iter()
            .find_map(|l| {
                l.strip_prefix("mlx5-emu: wire tx_frames ")
                    .map(str::to_owned)
            })
            .expect("the wire's counts at exit");
        let mut v: Vec<String> = vec!["tx_frames".into()];
        v.extend(line.split(' ').map(str::to_owned));
        v.chunks(2)
            .map(|c| (c[0].clone(), c[1].parse().unwrap()))
            .collect()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn count(c: &[(String, u64)], name: &str) -> u64 {
    c.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name} in {c:?}"))
        .1
}

/// What one model received is what the other sent; its bad ICRCs are the
/// frames the other corrupted; nothing else was dropped.
fn add_up(a: &[(String, u64)], b: &[(String, u64)]) {
    for (from, to) in [(a, b), (b, a)] {
        assert_eq!(
            count(to, "rx_frames"),
            count(from, "tx_frames"),
            "{from:?} -> {to:?}"
        );
        assert_eq!(count(to, "rx_bad_icrc"), count(from, "corrupted"), "{to:?}");
        for k in ["loss_notices", "loss_probes"] {
            assert_eq!(
                count(to, &format!("rx_{k}")),
                count(from, &format!("tx_{k}")),
                "{from:?} -> {to:?}"
            );
        }
        for k in ["rx_malformed", "rx_unknown_gid", "rx_giant", "rx_truncated"] {
            assert_eq!(count(to, k), 0, "{k}: {to:?}");
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `mlx5-perf PROG` as two processes, server on `srv`, client on
/// `cli`; returns the client's output.
fn perf(prog: &str, extra: &[&str], srv: &Served, cli: &Served) -> String {
    let exe = bin("mlx5-perf");
    let port = free_port().to_string();
    let mut args = vec![prog, "-n", "40", "-p", &port];
    args.extend_from_slice(extra);
    let mut server = Command::new(&exe)
        .args(&args)
        .args(["-d", &srv.dev()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client once the server listens (it says so on stderr).
    let err = server.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if line.contains("Waiting for client") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(HANG_GUARD).is_err() {
        let _ = server.kill();
        panic!(
            "{prog}: the server never listened: {}",
            reader.join().unwrap()
        );
    }
    let client = Command::new(&exe)
        .args(&args)
        .args(["-d", &cli.dev(), "127.0.0.1"])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    let server_err = reader.join().unwrap();
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    assert!(client.status.success(), "client {prog}: {}", text(&client));
    assert!(
        server.status.success(),
        "server {prog}: {}{server_err}",
        text(&server)
    );
    text(&client)
}

#[test]
fn every_mlx5_perf_program_between_two_processes() {
    let w = tmp("perf.wire");
    let a = Served::start(
        "perf-a",
        "24:8a:07:a0:00:01",
        &format!("stream,server=on,addr={}", w.display()),
        None,
    );
    let b = Served::start(
        "perf-b",
        "24:8a:07:b0:00:01",
        &format!("stream,addr={}", w.display()),
        None,
    );
    for (prog, extra) in [
        ("write_bw", &[][..]),
        ("write_lat", &[]),
        ("read_bw", &[]),
        ("read_lat", &[]),
        ("send_bw", &[]),
        ("send_lat", &[]),
        ("atomic_bw", &[]),
        ("atomic_lat", &[]),
        ("write_bw", &["-s", "65536"]),
        ("send_bw", &["-c", "UD", "-s", "1024"]),
    ] {
        let out = perf(prog, extra, &a, &b);
        let row = out
            .lines()
            .find(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 3 && f[0].parse::<u64>().is_ok() && f[1] == "40"
            })
            .unwrap_or_else(|| panic!("{prog}: no result row of 40 iterations in\n{out}"));
        eprintln!("{prog} {extra:?}: {row}");
    }
    let (ca, cb) = (a.stop(), b.stop());
    add_up(&ca, &cb);
    assert!(count(&ca, "rx_delivered") > 400, "{ca:?}");
}

#[test]
fn soak_rc_every_opcode_under_loss_reorder_and_corruption() {
    let (x, y) = (tmp("soak.a"), tmp("soak.b"));
    let spec = |l: &Path, r: &Path| format!("dgram,local={},remote={}", l.display(), r.display());
    let faults = |seed| format!("seed={seed},loss=0.01,reorder=0.01,window=4,corrupt=0.001");
    let a = Served::start(
        "soak-a",
        "24:8a:07:a0:00:01",
        &spec(&x, &y),
        Some(&faults(21)),
    );
    let b = Served::start(
        "soak-b",
        "24:8a:07:b0:00:01",
        &spec(&y, &x),
        Some(&faults(22)),
    );
    let rounds = 150;
    {
        let mut sa = side(a.open(), 1 << 20, ALL);
        let mut sb = side(b.open(), 1 << 20, ALL);
        let mut qa = create_qp(&sa, QpType::Rc, cap(64));
        let mut qb = create_qp(&sb, QpType::Rc, cap(64));
        let (na, nb) = (qa.qp_num(), qb.qp_num());
        connect(&mut qa, &sa.ctx, &sb.ctx, nb);
        connect(&mut qb, &sb.ctx, &sa.ctx, na);
        // 7 messages a round, each checked.
        rc_rounds_on(&mut sa, &mut sb, &mut qa, &mut qb, rounds);
    }
    let (ca, cb) = (a.stop(), b.stop());
    eprintln!("a: {ca:?}\nb: {cb:?}");
    add_up(&ca, &cb);
    let sum = |k| count(&ca, k) + count(&cb, k);
    assert!(
        sum("lost") > 0 && sum("reordered") > 0,
        "the faults happened"
    );
    // Losses were known at once across the processes (loss notices).
    assert!(
        sum("tx_loss_notices") > 0 && sum("loss_wakeups") > 0,
        "{ca:?} {cb:?}"
    );
}
