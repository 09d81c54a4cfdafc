//! Linux's Soft-RoCE judges the model's wire (issue 25, part 4).
//!
//! rxe (`rdma_rxe`) is an independent RoCEv2 implementation. Here it runs
//! in the QEMU guest of `scripts/qemu-guest/build.sh` on a virtio-net NIC
//! whose netdev is a stream socket the device model serves
//! (`mlx5-emu serve --functions 1 --wire stream,server=on,addr=...`): every
//! frame rxe sends reaches the model's port and every frame the model's
//! port sends reaches rxe. The guest (`scripts/qemu-guest/guest/rxe.sh`)
//! runs the servers of Debian's `ibv_rc_pingpong`, `ibv_ud_pingpong` and
//! perftest's `ib_write_bw`, `ib_read_bw`, `ib_send_lat` and `ib_atomic_bw`
//! on rxe0, one after the other; their clients run here, unmodified, on
//! the model function through the repo's libibverbs (`ibverbs-c`, over
//! vfio-user), and reach the servers' TCP exchange through QEMU's user
//! network (a second NIC, port forwarded). Data is checked where the
//! programs check it (`-c`); both sides must exit 0. GID index 0 on both
//! ends: the link-local GIDs of the two MACs (no neighbour discovery: the
//! model answers none, and link-local GIDs carry their MAC).
//!
//! The guest is cached outside the repo; without it (or without the host
//! programs) every check is reported skipped with the reason, unless
//! `MLX5_QEMU_MLX5_REQUIRED=1`, which makes that a failure.
//!
//! Its own `main` (no libtest): every check is printed by name.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use tests::qemu_guest::{cached_or_built, repo, tagged};
use tests::tally::Tally;

/// The guest's NICs (as `scripts/qemu-guest/guest/rxe.sh` expects them).
const WIRE_MAC: &str = "52:54:00:00:25:01";
const USER_MAC: &str = "52:54:00:00:25:02";

/// One server in the guest and its client here: the guest's name for it,
/// the check, the program, the arguments both sides share.
struct Pair {
    name: &'static str,
    check: &'static str,
    program: &'static str,
    args: &'static [&'static str],
}

const PAIRS: &[Pair] = &[
    Pair {
        name: "rc_pingpong",
        check: "ibv_rc_pingpong_model_to_rxe",
        program: "ibv_rc_pingpong",
        args: &["-g", "0", "-c", "-n", "100", "-s", "4096"],
    },
    Pair {
        name: "ud_pingpong",
        check: "ibv_ud_pingpong_model_to_rxe",
        program: "ibv_ud_pingpong",
        args: &["-g", "0", "-c", "-n", "100", "-s", "1024"],
    },
    Pair {
        name: "write_bw",
        check: "ib_write_bw_model_to_rxe",
        program: "ib_write_bw",
        args: &["-x", "0", "-F", "-n", "200", "-s", "65536"],
    },
    Pair {
        name: "read_bw",
        check: "ib_read_bw_model_to_rxe",
        program: "ib_read_bw",
        args: &["-x", "0", "-F", "-n", "200", "-s", "65536"],
    },
    Pair {
        name: "send_lat",
        check: "ib_send_lat_model_to_rxe",
        program: "ib_send_lat",
        args: &["-x", "0", "-F", "-n", "100", "-s", "1024"],
    },
    Pair {
        name: "atomic_bw",
        check: "ib_atomic_bw_model_to_rxe",
        program: "ib_atomic_bw",
        args: &["-x", "0", "-F", "-n", "200"],
    },
];

/// The checks besides the pairs'.
const BOOT_CHECKS: &[&str] = &["guest_brings_up_rxe0_on_the_model_wire"];
const WIRE_CHECKS: &[&str] = &[
    "model_wire_sees_no_bad_frame_from_rxe",
    "rxe_accepts_every_frame_the_model_sent",
    "linux_udp_echoes_our_raw_packet_qp",
];

/// Datagrams `mlx5-pkt udp-echo` sends (our driver's raw packet QP on the
/// model) for the guest's Linux UDP stack to echo (issue 26).
const ECHO_COUNT: u64 = 48;

/// How long the whole guest may run (host time) before it is killed.
const GUEST_DEADLINE: Duration = Duration::from_secs(1500);
/// How long one client keeps trying to reach its server (the guest under
/// TCG can take minutes to get there) before the pair fails.
const CLIENT_DEADLINE: Duration = Duration::from_secs(600);

fn all_checks() -> Vec<&'static str> {
    BOOT_CHECKS
        .iter()
        .copied()
        .chain(PAIRS.iter().map(|p| p.check))
        .chain(WIRE_CHECKS.iter().copied())
        .collect()
}

/// target/debug, where this test binary's crates are built.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from("target/debug"), Path::to_path_buf)
}

/// Builds the repo's libibverbs and `mlx5-emu`; the directory the loader
/// finds the library in under rdma-core's names.
fn build_host_side() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(repo())
        .args([
            "build",
            "-q",
            "-p",
            "ibverbs-c",
            "-p",
            "tools",
            "--bin",
            "mlx5-emu",
            "--bin",
            "mlx5-pkt",
        ])
        .output()
        .map_err(|e| format!("cargo build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let dir = target_dir().join("ibverbs-rxe");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    for n in ["libibverbs.so.1", "libmlx5.so.1", "libefa.so.1"] {
        let link = dir.join(n);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("../libibverbs.so", &link).map_err(|e| e.to_string())?;
    }
    Ok(dir)
}

/// The host programs, or which one is missing.
fn host_programs() -> Result<(), String> {
    for p in PAIRS {
        let path = Path::new("/usr/bin").join(p.program);
        if !path.exists() {
            return Err(format!(
                "{} is missing (apt-get install ibverbs-utils perftest; scripts/test-all.sh \
                 installs them)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// `mlx5-emu serve` with one function whose port is the wire's server end.
struct Served {
    child: Child,
    log: Receiver<String>,
}

impl Served {
    fn start(dir: &Path) -> Result<Self, String> {
        let mut child = Command::new(target_dir().join("mlx5-emu"))
            .args(["serve", "--functions", "1", "--socket"])
            .arg(dir.join("cx.sock"))
            .arg("--wire")
            .arg(format!(
                "stream,server=on,addr={}",
                dir.join("wire.sock").display()
            ))
            .arg("--pcap")
            .arg(dir.join("wire.pcap"))
            // rxe answers from a TCG guest: give it 2 s (real time) before a
            // response counts as lost and the message goes again.
            .args(["--response-wait-ms", "2000"])
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting mlx5-emu serve: {e}"))?;
        let err = child.stderr.take().ok_or("no stderr")?;
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let served = Self { child, log };
        loop {
            match served.log.recv_timeout(tests::wait::HANG_GUARD) {
                Ok(l) if l.contains("mlx5-emu: serving") => return Ok(served),
                Ok(_) => {}
                Err(e) => return Err(format!("mlx5-emu serve never said it serves ({e})")),
            }
        }
    }

    /// Stops the server (SIGTERM) and returns its wire summary line.
    fn stop(mut self) -> String {
        // SAFETY: kill has no memory effects; the pid is our live child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let mut summary = String::new();
        while let Ok(l) = self.log.recv_timeout(Duration::from_secs(5)) {
            if l.starts_with("mlx5-emu: wire tx_frames") {
                summary = l;
            }
        }
        summary
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on the loopback for QEMU's forward.
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// The model function's MAC (`mlx5-emu serve` without `--mac`) and its
/// link-local address, for the guest's neighbour table: the model, like
/// the card, answers no neighbour solicitation (on a host that is the
/// kernel's netdev's work, and this function has none), and the kernel
/// resolves even a link-local RoCE destination through the table.
fn model_env() -> String {
    let m = mlx5_emu::DEFAULT_MAC.to_be_bytes();
    let mac = m[2..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let eui = [m[2] ^ 2, m[3], m[4], 0xff, 0xfe, m[5], m[6], m[7]];
    let mut a = [0u8; 16];
    a[0] = 0xfe;
    a[1] = 0x80;
    a[8..].copy_from_slice(&eui);
    format!(
        "MODEL_MAC={mac}\nMODEL_LL={}\nECHO_COUNT={ECHO_COUNT}\n",
        std::net::Ipv6Addr::from(a)
    )
}

/// Boots the guest in the background; its console goes to
/// `dir/console.log`.
fn boot(dir: &Path, port: u16) -> Result<Child, String> {
    std::fs::write(dir.join("model.env"), model_env()).map_err(|e| e.to_string())?;
    let net = format!(
        "-netdev stream,id=w,server=off,addr.type=unix,addr.path=/guest/wire.sock \
         -device virtio-net-pci,netdev=w,mac={WIRE_MAC} \
         -netdev user,id=u,hostfwd=tcp:127.0.0.1:{port}-10.0.2.15:18515 \
         -device virtio-net-pci,netdev=u,mac={USER_MAC}"
    );
    Command::new("bash")
        .arg(repo().join("scripts/qemu-guest/run.sh"))
        .arg(repo().join("scripts/qemu-guest/guest/rxe.sh"))
        .arg(dir)
        .env("MLX5_QEMU_FUNCTIONS", "0")
        .env("MLX5_QEMU_NET", net)
        .env("MLX5_QEMU_TIMEOUT", GUEST_DEADLINE.as_secs().to_string())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("running run.sh: {e}"))
}

fn console(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("console.log")).unwrap_or_default()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `pair`'s client until it has talked to its server in the guest:
/// tries while the guest's server for it has not finished (a client that
/// came too early finds nothing listening and exits at once).
fn run_client(pair: &Pair, lib: &Path, dir: &Path, port: u16, guest: &mut Child) -> Output {
    let give_up = Instant::now() + CLIENT_DEADLINE;
    let mut tries = 0u32;
    loop {
        tests::wait::until_state(
            &format!("the guest serves {}", pair.name),
            || {
                console(dir).contains(&format!("=== serve {}", pair.name))
                    || guest.try_wait().ok().flatten().is_some()
            },
            || console(dir),
        );
        let out = Command::new(Path::new("/usr/bin").join(pair.program))
            .args(pair.args)
            .args(["-p", &port.to_string(), "127.0.0.1"])
            .env("LD_LIBRARY_PATH", lib)
            .env(
                "MLX5_DEVICES",
                format!("vfio-user:{}", dir.join("cx.sock").display()),
            )
            .output()
            .expect("running the client");
        tries += 1;
        let served = console(dir).contains(&format!("=== done {}", pair.name));
        if out.status.success()
            || served
            || Instant::now() > give_up
            || guest.try_wait().ok().flatten().is_some()
        {
            println!("{}: {tries} tries", pair.name);
            return out;
        }
        // Nothing listened yet: QEMU's forward accepted and closed. The
        // next try comes after the guest has had a moment (a retry pause,
        // not a wait for an outcome).
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `mlx5-pkt udp-echo` on the model function, once the RDMA clients are
/// done: datagrams from our driver's raw packet QP across the model's wire
/// to the guest's UDP echo (`eth_traffic.py echo`), which waits for them.
fn run_echo(dir: &Path) -> Output {
    let n = ECHO_COUNT.to_string();
    Command::new(target_dir().join("mlx5-pkt"))
        .args(["udp-echo", "-n", &n, "-s", "1200", "--peer-mac", WIRE_MAC])
        .args(["--peer-ip", "10.25.0.2", "--ip", "10.25.0.1", "-d"])
        .arg(format!("vfio-user:{}", dir.join("cx.sock").display()))
        .output()
        .expect("running mlx5-pkt")
}

/// Every datagram came back intact (Linux's UDP stack took each, its
/// checksums good, and sent it back), as both ends count.
fn judge_echo(out: &Output, console: &str) -> Result<(), String> {
    let text = text(out);
    for l in text.lines() {
        println!("udp-echo: {l}");
    }
    let want = format!("udp-echo: sent {ECHO_COUNT} echoed intact {ECHO_COUNT}");
    let served = format!("=== eth echo served {ECHO_COUNT}");
    if out.status.success() && text.contains(&want) && console.contains(&served) {
        Ok(())
    } else {
        Err(format!("mlx5-pkt udp-echo ({}): {text}", out.status))
    }
}

/// A line that reports what moved: the pingpongs' "N iters in" and
/// "bytes in", perftest's result rows (they start with the size).
fn is_result(l: &str) -> bool {
    let l = l.trim_start();
    l.contains(" iters in ")
        || l.contains(" bytes in ")
        || l.split_whitespace()
            .next()
            .is_some_and(|w| w.parse::<u64>().is_ok())
}

/// The verdict of one pair from the client's output and the guest's lines.
fn judge_pair(pair: &Pair, client: &Output, console: &str) -> Result<(), String> {
    let server: Vec<&str> = tagged(console, &format!("{}| ", pair.name));
    let done = format!("=== done {} rc=0", pair.name);
    let ct = text(client);
    if !client.status.success() || !console.contains(&done) {
        return Err(format!(
            "client {:?}:\n{ct}\nserver in the guest:\n{}",
            client.status,
            server.join("\n")
        ));
    }
    let bad = |l: &str| {
        let l = l.to_ascii_lowercase();
        l.contains("error") || l.contains("fail") || l.contains("couldn't")
    };
    if let Some(l) = ct.lines().chain(server.iter().copied()).find(|l| bad(l)) {
        return Err(format!("error line {l:?}"));
    }
    // Both sides report what moved.
    if !ct.lines().any(is_result) || !server.iter().any(|l| is_result(l)) {
        return Err(format!(
            "no result line:\nclient:\n{ct}\nserver:\n{}",
            server.join("\n")
        ));
    }
    Ok(())
}

fn main() {
    let start = Instant::now();
    let mut t = Tally::default();
    let required = std::env::var("MLX5_QEMU_MLX5_REQUIRED").is_ok_and(|v| v == "1");
    let ready = cached_or_built()
        .and_then(|_| host_programs())
        .and_then(|()| build_host_side());
    match ready {
        Err(why) => t.skip_all(&all_checks(), &why, required),
        Ok(lib) => {
            let dir = std::env::temp_dir().join(format!("qemu_rxe-{}", std::process::id()));
            let _ = std::fs::create_dir_all(&dir);
            if let Err(e) = run(&mut t, &lib, &dir) {
                for c in all_checks() {
                    t.check(c, Err(e.clone()));
                }
            }
        }
    }
    t.finish(start.elapsed().as_secs_f64());
}

/// Serves the model, boots the guest, runs each client, judges.
fn run(t: &mut Tally, lib: &Path, dir: &Path) -> Result<(), String> {
    let served = Served::start(dir)?;
    let port = free_port()?;
    let mut guest = boot(dir, port)?;
    let mut clients = Vec::new();
    for p in PAIRS {
        clients.push(run_client(p, lib, dir, port, &mut guest));
    }
    let echo = run_echo(dir);
    tests::wait::until_state(
        "the guest powers off",
        || guest.try_wait().ok().flatten().is_some(),
        || console(dir),
    );
    let wire = served.stop();
    let c = console(dir);
    let log = format!("see {}", dir.join("console.log").display());
    println!("model wire: {wire}");
    for l in tagged(&c, "=== ") {
        println!("guest: {l}");
    }
    t.check(
        BOOT_CHECKS[0],
        if c.contains("=== rdma link add rc=0") && c.contains("ACTIVE") {
            Ok(())
        } else {
            Err(format!("rxe0 not up; {log}"))
        },
    );
    for (p, client) in PAIRS.iter().zip(&clients) {
        for l in text(client).lines().filter(|l| is_result(l)) {
            println!("{} client: {}", p.name, l.trim());
        }
        t.check(
            p.check,
            judge_pair(p, client, &c).map_err(|e| format!("{e}; {log}")),
        );
    }
    t.check(WIRE_CHECKS[0], judge_wire(&wire));
    t.check(WIRE_CHECKS[1], judge_counts(&wire, &c));
    t.check(
        WIRE_CHECKS[2],
        judge_echo(&echo, &c).map_err(|e| format!("{e}; {log}")),
    );
    Ok(())
}

/// The value after `key` in a line of words (`key value`).
fn count(words: &str, key: &str) -> Option<u64> {
    let mut it = words.split_whitespace();
    it.position(|w| w == key)?;
    it.next()?.parse().ok()
}

/// rxe's counters (`rdma statistic show link rxe0/1`) against the model's:
/// every RoCE frame rxe sent, the model accepted; every frame the model
/// sent, rxe accepted (a frame rxe dropped for its ICRC, its headers or its
/// PSN window would show as a difference), except when a response wait ran
/// out: the model then sent messages again, and a repeat that arrives once
/// rxe's QP is gone (its program done) is dropped uncounted, so rxe may
/// count fewer, never more; and rxe never gave up on the model (retries
/// exhausted, send errors).
fn judge_counts(wire: &str, console: &str) -> Result<(), String> {
    let rxe = tagged(console, "rxe_counters| ").join(" ");
    let (sent, delivered) = (count(&rxe, "sent_pkts"), count(wire, "rx_delivered"));
    if sent.is_none() || sent != delivered {
        return Err(format!(
            "rxe sent_pkts {sent:?} != model rx_delivered {delivered:?}; rxe: {rxe}; model: {wire}"
        ));
    }
    // rxe counts RoCE packets; the raw frames the model sent (the UDP echo
    // after rxe's counters were read) are not among them.
    let tx = count(wire, "tx_frames")
        .zip(count(wire, "tx_raw"))
        .map(|(t, r)| t - r);
    let rcvd = count(&rxe, "rcvd_pkts");
    let timeouts = count(wire, "response_timeouts").unwrap_or(0);
    let ok = match (tx, rcvd) {
        (Some(t), Some(r)) if timeouts == 0 => t == r,
        (Some(t), Some(r)) => r <= t,
        _ => false,
    };
    if !ok {
        return Err(format!(
            "model tx_frames {tx:?} vs rxe rcvd_pkts {rcvd:?} ({timeouts} response waits ran \
             out); rxe: {rxe}; model: {wire}"
        ));
    }
    for k in [
        "retry_exceeded_err",
        "retry_rnr_exceeded_err",
        "send_err",
        "rcvd_seq_err",
    ] {
        if count(&rxe, k) != Some(0) {
            return Err(format!("rxe {k} is {:?}: {rxe}", count(&rxe, k)));
        }
    }
    Ok(())
}

/// The model's wire counts at exit: frames both ways, none with a bad
/// ICRC, none cut short.
fn judge_wire(summary: &str) -> Result<(), String> {
    let (tx, rx, icrc, trunc) = (
        count(summary, "tx_frames"),
        count(summary, "rx_delivered"),
        count(summary, "rx_bad_icrc"),
        count(summary, "rx_truncated"),
    );
    match (tx, rx, icrc, trunc) {
        (Some(tx), Some(rx), Some(0), Some(0)) if tx > 0 && rx > 0 => Ok(()),
        _ => Err(format!("wire counts: {summary:?}")),
    }
}
