//! Issue 15: `mlx5-emu serve` killed under running tools. `mlx5-perf -D`
//! (both sides, each its own process) and `rc_pingpong` (server with
//! completion events, client polling) must stop with a non-zero exit and
//! the cause on stderr, not print progress forever.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

const EMU: &str = env!("CARGO_BIN_EXE_mlx5-emu");
const PERF: &str = env!("CARGO_BIN_EXE_mlx5-perf");
const PINGPONG: &str = env!("CARGO_BIN_EXE_rc_pingpong");

/// Only a guard against a hang: every wait below ends on an outcome.
const HANG_GUARD: Duration = Duration::from_secs(90);

/// A child killed on drop (a failing test leaves no process behind).
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(tag: &str) -> (Proc, PathBuf, PathBuf) {
    let sock = std::env::temp_dir().join(format!("mlx5-gone-{tag}-{}.sock", std::process::id()));
    let sock1 = PathBuf::from(format!("{}.1", sock.display()));
    let p = Proc(
        Command::new(EMU)
            .args(["serve", "--socket"])
            .arg(&sock)
            .args(["--functions", "2"])
            .stdin(Stdio::null())
            .spawn()
            .expect("starting mlx5-emu serve"),
    );
    for s in [&sock, &sock1] {
        let start = Instant::now();
        while !s.exists() {
            assert!(
                start.elapsed() < HANG_GUARD,
                "{} never appeared",
                s.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (p, sock, sock1)
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// Spawns `prog args` with stdout and stderr read line by line on threads:
/// lines come through the receiver as they are printed, the whole text
/// (stderr, then stdout) when the process ends.
fn spawn(prog: &str, args: &[&str]) -> (Proc, Receiver<String>, std::thread::JoinHandle<String>) {
    let mut c = Command::new(prog)
        .args(args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    let (tx, rx) = mpsc::channel();
    let reader = |r: Box<dyn Read + Send>, tx: mpsc::Sender<String>| {
        std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                all += &line;
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        })
    };
    let err = reader(Box::new(c.stderr.take().unwrap()), tx.clone());
    let out = reader(Box::new(c.stdout.take().unwrap()), tx);
    let t = std::thread::spawn(move || {
        let e = err.join().unwrap();
        e + "--- stdout ---\n" + &out.join().unwrap()
    });
    (Proc(c), rx, t)
}

/// Waits for an output line containing `what`.
fn wait_line(rx: &Receiver<String>, what: &str, who: &str) {
    let start = Instant::now();
    loop {
        let left = HANG_GUARD.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(what) => return,
            Ok(_) => {}
            Err(e) => panic!("{who}: no line with {what:?} ({e})"),
        }
    }
}

/// Waits for the child to exit.
fn exit_of(p: &mut Proc, who: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = p.0.try_wait().unwrap() {
            return s;
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "{who} still runs after its device died"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_failed_naming_the_cause(mut p: Proc, text: std::thread::JoinHandle<String>, who: &str) {
    let st = exit_of(&mut p, who);
    let text = text.join().unwrap();
    assert!(!st.success(), "{who} exited {st}:\n{text}");
    assert!(
        text.contains("device health failure: the function vanished"),
        "{who}: the cause is printed:\n{text}"
    );
}

fn dev(p: &Path) -> String {
    format!("vfio-user:{}", p.display())
}

#[test]
fn perf_both_sides_exit_nonzero_when_the_server_dies() {
    let (mut emu, s0, s1) = serve("perf");
    let port = free_port();
    let (d0, d1) = (dev(&s0), dev(&s1));
    let (srv, _srv_lines, srv_text) =
        spawn(PERF, &["write_bw", "-D", "600", "-d", &d0, "-p", &port]);
    let (cli, cli_lines, cli_text) = spawn(
        PERF,
        &["write_bw", "-D", "600", "-d", &d1, "-p", &port, "127.0.0.1"],
    );
    // Traffic runs: the client reports its first second.
    wait_line(&cli_lines, "1 s of 600 s", "the perf client");
    emu.0.kill().unwrap();
    emu.0.wait().unwrap();
    assert_failed_naming_the_cause(cli, cli_text, "the perf client");
    assert_failed_naming_the_cause(srv, srv_text, "the perf server");
}

#[test]
fn pingpong_both_sides_exit_nonzero_when_the_server_dies() {
    let (mut emu, s0, s1) = serve("pingpong");
    let port = free_port();
    let (d0, d1) = (dev(&s0), dev(&s1));
    let n = "1000000000";
    // The server waits on completion events, the client polls.
    let (srv, srv_lines, srv_text) = spawn(
        PINGPONG,
        &["-d", &d0, "-p", &port, "-n", n, "-e", "-s", "64"],
    );
    // The server listens once it has printed its address.
    wait_line(&srv_lines, "local address", "the pingpong server");
    let (cli, cli_lines, cli_text) = spawn(
        PINGPONG,
        &["-d", &d1, "-p", &port, "-n", n, "-s", "64", "127.0.0.1"],
    );
    // Both sides are connected and ping-ponging.
    wait_line(&cli_lines, "remote address", "the pingpong client");
    wait_line(&srv_lines, "remote address", "the pingpong server");
    emu.0.kill().unwrap();
    emu.0.wait().unwrap();
    assert_failed_naming_the_cause(cli, cli_text, "the pingpong client");
    assert_failed_naming_the_cause(srv, srv_text, "the pingpong server");
}
