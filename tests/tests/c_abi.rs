//! The C library (`ibverbs-c`: libibverbs.so.1, also answering as
//! libmlx5.so.1 and libefa.so.1) under unmodified Debian binaries, run with
//! `LD_LIBRARY_PATH` at it:
//!
//! - `ibv_devices` and `ibv_devinfo -v` on two built-in model functions;
//! - `ibv_rc_pingpong` (polling, and with completion events) and
//!   `ibv_ud_pingpong` with their buffer checks (`-c`), server and client
//!   as two processes on the two cabled functions of one
//!   `mlx5-emu serve --functions 2` over vfio-user;
//! - perftest `ib_write_bw`, `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`,
//!   `ib_write_lat`, `ib_send_lat` with `-a` the same way, through the
//!   `ibv_wr_*` API (perftest's default) and, for `ib_write_bw` and
//!   `ib_send_bw`, through `ibv_post_send` (`--use_old_post_send`);
//! - perftest's Dynamically Connected runs (`-c DC`: mlx5dv DCIs and
//!   DCTs) of the bandwidth and latency tests on two ConnectX-6 functions;
//! - perftest `ib_write_bw`, `ib_read_bw`, `ib_send_bw` with `--odp`
//!   (on-demand paging over vfio-user) on two ConnectX-6 functions;
//! - the repo's C programs built against Debian's headers and linked
//!   with the library: `examples/embed.c` (SPDK-style embedding),
//!   `examples/bad_use.c` (errno, never a crash), `examples/dc.c` (DC
//!   QPs through mlx5dv), `examples/mkey.c` (mlx5dv indirect mkeys),
//!   bytes checked, and `examples/timestamp.c` (the device clock and
//!   completion timestamps).
//!
//! The binaries come from `ibverbs-utils`, `perftest` and
//! `libibverbs-dev` (scripts/test-all.sh installs them); without them a
//! test fails saying NOT RUN.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::OnceLock;

use tests::wait::{until, HANG_GUARD};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// target/debug, where this test binary's crates are built.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

fn cargo_build(args: &[&str]) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args(["build", "-q"])
        .args(args)
        .output()
        .expect("running cargo build");
    assert!(
        out.status.success(),
        "cargo build {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The library built now, in a directory of its own under the names the
/// loader looks for: libibverbs.so.1, libmlx5.so.1, libefa.so.1 (and
/// libibverbs.so, to link the C programs against).
fn lib_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        cargo_build(&["-p", "ibverbs-c"]);
        cargo_build(&["-p", "tools", "--bin", "mlx5-emu"]);
        let t = target_dir();
        let dir = t.join("ibverbs");
        std::fs::create_dir_all(&dir).unwrap();
        for n in [
            "libibverbs.so.1",
            "libibverbs.so",
            "libmlx5.so.1",
            "libefa.so.1",
        ] {
            let link = dir.join(n);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("../libibverbs.so", &link).unwrap();
        }
        dir
    })
}

fn need(bin: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(bin);
    assert!(
        p.exists(),
        "NOT RUN: {} is missing (apt-get install ibverbs-utils perftest libibverbs-dev; \
         scripts/test-all.sh installs them)",
        p.display()
    );
    p
}

fn cmd(bin: &str, devices: &str) -> Command {
    let mut c = Command::new(need(bin));
    c.env("LD_LIBRARY_PATH", lib_dir())
        .env("MLX5_DEVICES", devices)
        .env_remove("MLX5_LOG");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn ibv_devices_and_devinfo_on_the_builtin_model() {
    let o = cmd("ibv_devices", "emu,emu:cx5").output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for name in ["mlx5_0", "mlx5_1"] {
        assert!(t.contains(name), "{t}");
    }
    // The GUIDs are the functions' EUI-64 ones (MAC ..:01, ..:02).
    assert!(
        t.contains("268a07fffea00001") && t.contains("268a07fffea00002"),
        "{t}"
    );

    let o = cmd("ibv_devinfo", "emu,emu:cx5")
        .arg("-v")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "hca_id:\tmlx5_0",
        "hca_id:\tmlx5_1",
        "vendor_id:\t\t\t0x02c9",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\tfe80::268a:7ff:fea0:1, RoCE v2",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
    ] {
        assert!(t.contains(want), "ibv_devinfo -v lacks {want:?}:\n{t}");
    }
    // ConnectX-4 Lx (4117) and ConnectX-5 (4119).
    assert!(
        t.contains("vendor_part_id:\t\t\t4117") && t.contains("vendor_part_id:\t\t\t4119"),
        "{t}"
    );
}

/// `mlx5-emu serve --functions 2` in its own process.
struct Served {
    child: Child,
    sock: PathBuf,
    _log: Receiver<String>,
}

impl Served {
    fn start(tag: &str) -> Self {
        Self::start_profile(tag, "cx4lx")
    }

    /// Two functions of card `profile` (`mlx5-emu serve --profile`).
    fn start_profile(tag: &str, profile: &str) -> Self {
        lib_dir();
        let sock =
            std::env::temp_dir().join(format!("mlx5-cabi-{tag}-{}.sock", std::process::id()));
        let mut child = Command::new(target_dir().join("mlx5-emu"))
            .args([
                "serve",
                "--profile",
                profile,
                "--functions",
                "2",
                "--socket",
            ])
            .arg(&sock)
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting mlx5-emu serve");
        let err = child.stderr.take().expect("piped stderr");
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
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
        Self {
            child,
            sock,
            _log: log,
        }
    }

    fn dev(&self, i: u32) -> String {
        match i {
            0 => format!("vfio-user:{}", self.sock.display()),
            _ => format!("vfio-user:{}.{i}", self.sock.display()),
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether some socket listens on TCP `port` (IPv4 or IPv6).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|s| {
            s.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// A TCP port for one server/client pair of this test process.
fn port(n: u16) -> u16 {
    20000 + (std::process::id() % 2000) as u16 * 8 + n
}

/// Runs `bin args` as the server on function 0, waits until it listens
/// on `port`, then as the client on function 1; both outputs.
fn pair(s: &Served, bin: &str, args: &[&str], port: u16, port_flag: &str) -> (Output, Output) {
    let p = port.to_string();
    let mut server = cmd(bin, &s.dev(0))
        .args(args)
        .args([port_flag, &p])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Listening, or gone (its output then says why).
    until(&format!("{bin} server listening on {port}"), || {
        listening(port) || server.try_wait().ok().flatten().is_some()
    });
    let client = cmd(bin, &s.dev(1))
        .args(args)
        .args([port_flag, &p, "localhost"])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    (server, client)
}

fn check_pair(what: &str, (server, client): &(Output, Output), want: &str) {
    let (ts, tc) = (text(server), text(client));
    assert!(
        server.status.success() && client.status.success(),
        "{what}: server {:?}:\n{ts}\nclient {:?}:\n{tc}",
        server.status,
        client.status
    );
    assert!(
        ts.contains(want) && tc.contains(want),
        "{what}:\n{ts}\n{tc}"
    );
}

#[test]
fn rc_and_ud_pingpong_between_two_processes_over_vfio_user() {
    let s = Served::start("pingpong");
    let rc = pair(
        &s,
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "200", "-c"],
        port(0),
        "-p",
    );
    check_pair("ibv_rc_pingpong -c", &rc, "200 iters in");
    let ev = pair(
        &s,
        "ibv_rc_pingpong",
        &["-g", "0", "-n", "200", "-c", "-e"],
        port(1),
        "-p",
    );
    check_pair("ibv_rc_pingpong -c -e", &ev, "200 iters in");
    let ud = pair(
        &s,
        "ibv_ud_pingpong",
        &["-g", "0", "-n", "200", "-c"],
        port(2),
        "-p",
    );
    check_pair("ibv_ud_pingpong -c", &ud, "200 iters in");
}

/// The result rows of a perftest report (`#bytes #iterations ...`).
fn rows(t: &str) -> usize {
    t.lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 4 && f[0].parse::<u64>().is_ok() && f[1].parse::<u64>().is_ok()
        })
        .count()
}

/// perftest calibrates its clock before it reports (`get_cpu_mhz`: CPU
/// cycles against `gettimeofday` over a few samples, refused below r^2 0.9
/// with "Can't produce a report"): on saturated CPUs (the stressed CI run)
/// the samples scatter and the client gives up, and the server, left
/// alone, fails its exchange. That is perftest measuring the machine, not
/// the library; only such a run is tried again.
fn calibration_failed((server, client): &(Output, Output)) -> bool {
    let t = text(client);
    !client.status.success()
        && t.contains("Correlation coefficient r^2")
        && t.contains("Can't produce a report")
        && (server.status.success() || text(server).contains("Couldn't read remote address"))
}

#[test]
fn perftest_all_sizes_between_two_processes_over_vfio_user() {
    let s = Served::start("perftest");
    // -a: every size 2 B .. 8 MiB (23 rows); atomics are 8 bytes, and
    // perftest refuses -a for them (1 row).
    for (i, (bin, all, old_post, want_rows)) in [
        ("ib_write_bw", true, false, 23),
        ("ib_read_bw", true, false, 23),
        ("ib_send_bw", true, false, 23),
        ("ib_atomic_bw", false, false, 1),
        ("ib_write_lat", true, false, 23),
        ("ib_send_lat", true, false, 23),
        ("ib_write_bw", true, true, 23),
        ("ib_send_bw", true, true, 23),
    ]
    .into_iter()
    .enumerate()
    {
        let mut args = vec!["-x", "0", "-n", "5"];
        if all {
            args.push("-a");
        }
        if old_post {
            args.push("--use_old_post_send");
        }
        let api = if old_post {
            "ibv_post_send"
        } else {
            "ibv_wr_*"
        };
        let mut r = pair(&s, bin, &args, port(3 + i as u16), "-p");
        for again in 1..=3u16 {
            if !calibration_failed(&r) {
                break;
            }
            eprintln!("{bin}: perftest's CPU clock calibration failed (a loaded machine); again ({again})");
            r = pair(&s, bin, &args, port(3 + i as u16 + 8 * again), "-p");
        }
        let (ts, tc) = (text(&r.0), text(&r.1));
        assert!(
            r.0.status.success() && r.1.status.success(),
            "{bin}: server {:?}:\n{ts}\nclient {:?}:\n{tc}",
            r.0.status,
            r.1.status
        );
        assert_eq!(rows(&tc), want_rows, "{bin} client rows:\n{tc}");
        let wr_api = if old_post {
            "ibv_wr* API     : OFF"
        } else {
            "ibv_wr* API     : ON"
        };
        assert!(tc.contains(wr_api), "{bin} ({api}):\n{tc}");
        eprintln!("{bin} ({api}): {want_rows} sizes, server and client exit 0");
    }
}

/// perftest's Dynamically Connected runs (`-c DC`: `mlx5dv_create_qp` of
/// a DCI on the client and a DCT with its SRQ on the server, the DCT's
/// number exchanged after RTR, `ibv_wr_*` with `mlx5dv_wr_set_dc_addr`)
/// between two processes on two cabled ConnectX-6 functions over
/// vfio-user: every test and size, both sides exit 0. The latency tests
/// make a DCI and a DCT on each side; two runs give the DCI streams
/// (`--log_dci_streams=2`).
#[test]
fn perftest_dc_between_two_processes_over_vfio_user() {
    let s = Served::start_profile("perftest-dc", "cx6");
    // The last two: the DCI with 4 streams (perftest's DCS,
    // `mlx5dv_wr_set_dc_addr_stream` over them in turn).
    for (i, (bin, all, streams, want_rows)) in [
        ("ib_write_bw", true, false, 23),
        ("ib_read_bw", true, false, 23),
        ("ib_send_bw", true, false, 23),
        ("ib_atomic_bw", false, false, 1),
        ("ib_write_lat", true, false, 23),
        ("ib_read_lat", true, false, 23),
        ("ib_send_lat", true, false, 23),
        ("ib_write_bw", true, true, 23),
        ("ib_send_bw", true, true, 23),
    ]
    .into_iter()
    .enumerate()
    {
        let mut args = vec!["-c", "DC", "-x", "0", "-n", "5"];
        if all {
            args.push("-a");
        }
        if streams {
            args.push("--log_dci_streams=2");
        }
        let (ts, tc) = pair_exit_0(&s, bin, &args, 40 + 4 * i as u16, "-c DC");
        assert!(
            tc.contains("Connection type : DC") && ts.contains("Connection type : DC"),
            "{bin}:\n{tc}"
        );
        assert_eq!(rows(&tc), want_rows, "{bin} -c DC client rows:\n{tc}");
        if streams {
            assert!(tc.contains("DCS num streams : 2"), "{bin}:\n{tc}");
        }
        eprintln!("{bin} -c DC (streams {streams}): {want_rows} sizes, server and client exit 0");
    }
}

/// [`pair`] on port `p` (three more tries on the next ports when
/// perftest's CPU clock calibration failed, which a loaded VM makes it
/// do); asserts both sides exit 0 and gives their outputs (server,
/// client). `what` names the run in messages.
fn pair_exit_0(s: &Served, bin: &str, args: &[&str], p: u16, what: &str) -> (String, String) {
    let mut r = pair(s, bin, args, port(p), "-p");
    for again in 1..=3u16 {
        if !calibration_failed(&r) {
            break;
        }
        eprintln!("{bin} {what}: perftest's CPU clock calibration failed; again ({again})");
        r = pair(s, bin, args, port(p + again), "-p");
    }
    let (ts, tc) = (text(&r.0), text(&r.1));
    assert!(
        r.0.status.success() && r.1.status.success(),
        "{bin} {what}: server {:?}:\n{ts}\nclient {:?}:\n{tc}",
        r.0.status,
        r.1.status
    );
    (ts, tc)
}

/// perftest with `--odp` (its buffers registered with
/// `IBV_ACCESS_ON_DEMAND`, after it checked `ibv_query_device_ex`'s ODP
/// caps), server and client as two processes on two cabled ConnectX-6
/// functions over vfio-user: the heap buffers are made shared at
/// registration (the server reaches memory through files), and every
/// page the device touches comes by a page fault. WRITE, READ and SEND,
/// every size; both sides exit 0.
#[test]
fn perftest_odp_between_two_processes_over_vfio_user() {
    let s = Served::start_profile("perftest-odp", "cx6");
    for (i, bin) in ["ib_write_bw", "ib_read_bw", "ib_send_bw"]
        .into_iter()
        .enumerate()
    {
        let args = ["--odp", "-x", "0", "-n", "5", "-a"];
        let (_, tc) = pair_exit_0(&s, bin, &args, 80 + 4 * i as u16, "--odp");
        assert_eq!(rows(&tc), 23, "{bin} --odp client rows:\n{tc}");
        eprintln!("{bin} --odp: 23 sizes, server and client exit 0");
    }
}

/// DC QPs through `mlx5dv_create_qp` in a C program built against
/// Debian's mlx5dv.h (`examples/dc.c`): `mlx5dv_query_device`'s DCI
/// stream limits, a DCT moved RESET -> INIT -> RTR gets its number, a
/// DCI's WRITE, SEND, READ and fetch-and-add (through `ibv_wr_*` and
/// `mlx5dv_wr_set_dc_addr`) land and are checked in memory, a wrong DC
/// key errs one of the DCI's two streams, the other still writes and
/// `mlx5dv_dci_stream_id_reset` brings the first back, and bad use gets
/// errnos (posting to DC QPs through
/// `ibv_post_send`/`ibv_post_recv`, wrong transitions, a DCT without an
/// SRQ, a WR without its DC address, a wrong DC key).
#[test]
fn dc_qps_through_mlx5dv_move_bytes_and_refuse_bad_use() {
    checked_example("dc", None, 44);
}

/// mlx5dv indirect mkeys in a C program built against Debian's mlx5dv.h
/// (`examples/mkey.c`): an RC QP made by `mlx5dv_create_qp` with the mkey
/// send operations configures a key by `mlx5dv_wr_mr_list` and by
/// `mlx5dv_wr_mkey_configure` with its access and interleaved-layout
/// setters (each a UMR completing as `MLX5DV_WC_UMR`); the peer's WRITE
/// and READ through the key land where the layouts put them; bad use
/// gets errnos (a setter alone, no `IBV_SEND_INLINE`, another WR before
/// the setters, no INDIRECT, a double destroy); the PD goes after the key.
#[test]
fn mkeys_through_mlx5dv_move_bytes_where_their_layouts_say() {
    checked_example("mkey", None, 23);
}

/// The device clock in a C program built against Debian's verbs.h and
/// mlx5dv.h (`examples/timestamp.c`): `ibv_query_device_ex`'s clock
/// fields, `ibv_query_rt_values_ex`'s raw clock, `mlx5dv_query_device`'s
/// clock-info period and mapped internal timer, `mlx5dv_get_clock_info`;
/// a WRITE's completion stamp (an extended CQ with
/// `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`) lies between raw clock readings
/// around it and its wall time (`..._WALLCLOCK`) between `CLOCK_REALTIME`
/// readings (a second's slack), and the header's inline `mlx5dv_ts_to_ns`
/// over the library's clock info gives that wall time; bad use gets
/// errnos.
#[test]
fn completion_timestamps_through_c_read_the_device_clock() {
    checked_example("timestamp", None, 14);
}

/// Runs `examples/NAME.c` (built by [`build_c`]) with `MLX5_DEVICES` =
/// `devices` (`None`: the program names its own): it exits 0, prints
/// "NAME: 0 failed" and no "FAIL", and passed at least `min_ok` checks.
fn checked_example(name: &str, devices: Option<&str>, min_ok: usize) {
    let exe = build_c(name);
    let mut c = Command::new(&exe);
    c.env("LD_LIBRARY_PATH", lib_dir());
    match devices {
        Some(d) => c.env("MLX5_DEVICES", d),
        None => c.env_remove("MLX5_DEVICES"),
    };
    let o = c.output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains(&format!("{name}: 0 failed")) && !t.contains("FAIL"),
        "{t}"
    );
    let ok = t.lines().filter(|l| l.starts_with("ok: ")).count();
    assert!(ok >= min_ok, "{ok} checks passed, {min_ok} expected:\n{t}");
}

/// Builds one of the repo's C programs against Debian's verbs.h and this
/// library.
fn build_c(name: &str) -> PathBuf {
    let src = root().join("ibverbs-c/examples").join(format!("{name}.c"));
    let exe = lib_dir().join(name);
    let o = Command::new("cc")
        .args(["-Wall", "-Werror", "-I"])
        .arg(root().join("ibverbs-c/include"))
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-L")
        .arg(lib_dir())
        .arg("-libverbs")
        .output()
        .expect("running cc");
    assert!(o.status.success(), "cc {name}.c: {}", text(&o));
    exe
}

#[test]
fn the_embedding_example_moves_bytes_through_the_c_abi() {
    let exe = build_c("embed");
    let o = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("embed: ok"), "{t}");
}

#[test]
fn bad_use_gets_errno_never_a_crash() {
    // A ConnectX-4 Lx (the default model) and a ConnectX-7 (DevX, ODP).
    checked_example("bad_use", Some("emu,emu:cx7"), 121);
}

/// Two contexts on one device: an async event reaches the context whose
/// object it names, and only that one (one dispatcher per device); the
/// SRQ limit (`ibv_modify_srq` `IBV_SRQ_LIMIT`) is armed, fires once,
/// reads 0 after, and is armed again after a third context came and went.
#[test]
fn async_events_reach_the_context_of_their_object() {
    let exe = build_c("async_events");
    let o = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("MLX5_DEVICES", "emu")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("async_events: ok"), "{t}");
    assert_eq!(
        t.matches("SRQ limit event on context B only").count(),
        2,
        "{t}"
    );
}
