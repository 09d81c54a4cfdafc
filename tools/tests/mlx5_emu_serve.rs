//! `mlx5-emu serve` as its own process, opened by `mlx5` from other
//! processes over vfio-user: devinfo and trace work, a client killed
//! mid-run leaves the server ready for the next, a second function is
//! served on `PATH.1`, and SIGTERM stops the server and removes its sockets.
//!
//! The test follows the server's log (its stderr) to know when it serves
//! and how far a client got: nothing here sleeps or measures; waits on the
//! log have a hang guard only.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

const EMU: &str = env!("CARGO_BIN_EXE_mlx5-emu");
const MLX5: &str = env!("CARGO_BIN_EXE_mlx5");
/// How long to wait for a line of the server's log before calling it a hang.
const HANG_GUARD: Duration = Duration::from_secs(180);

/// The server, and the lines of its log as they come.
struct Served {
    child: Child,
    log: Receiver<String>,
}

impl Served {
    fn start(args: &[&str], sock: &std::path::Path) -> Self {
        let mut child = Command::new(EMU)
            .arg("serve")
            .arg("--socket")
            .arg(sock)
            .args(args)
            // Connections (info) and the command queue address (debug).
            .env("RUST_LOG", "info,mlx5_emu=debug")
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting mlx5-emu");
        let err = child.stderr.take().expect("piped stderr");
        let (tx, log) = mpsc::channel();
        // Read to the end, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Self { child, log }
    }

    /// Lines logged so far are forgotten.
    fn forget(&self) {
        while self.log.try_recv().is_ok() {}
    }

    /// Waits for a log line containing `what`.
    fn wait_line(&self, what: &str) {
        loop {
            match self.log.recv_timeout(HANG_GUARD) {
                Ok(l) if l.contains(what) => return,
                Ok(_) => {}
                Err(e) => panic!("the server never logged {what:?} ({e})"),
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mlx5(args: &[&str]) -> Output {
    Command::new(MLX5)
        .args(args)
        .output()
        .expect("running mlx5")
}

fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn serve_devinfo_trace_kill_and_second_function() {
    let sock = std::env::temp_dir().join(format!("mlx5-emu-test-{}.sock", std::process::id()));
    let sock1 = PathBuf::from(format!("{}.1", sock.display()));
    let mut served = Served::start(&["--profile", "cx5", "--functions", "2"], &sock);
    // Logged once every function's socket is bound.
    served.wait_line("mlx5-emu: serving");
    assert!(sock.exists() && sock1.exists());
    let dev = format!("vfio-user:{}", sock.display());
    let dev1 = format!("vfio-user:{}", sock1.display());

    let info = ok(&mlx5(&["devinfo", "-d", &dev]), "devinfo");
    assert!(
        info.contains("fw_ver:") && info.contains("16."),
        "ConnectX-5 firmware: {info}"
    );
    let trace = ok(&mlx5(&["trace", "-d", &dev]), "trace");
    assert!(trace.contains("INIT_HCA") && trace.contains("TEARDOWN_HCA"));

    // Killed mid-run, at several points of its bring-up (at once; once it
    // connected; once it gave firmware its command queue); the next run
    // works.
    for point in [
        None,
        Some("client connected"),
        Some("command queue address"),
    ] {
        served.forget();
        let mut c = Command::new(MLX5)
            .args(["trace", "-d", &dev])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        if let Some(line) = point {
            served.wait_line(line);
        }
        let _ = c.kill();
        let _ = c.wait();
        let again = ok(&mlx5(&["trace", "-d", &dev]), "trace after a killed client");
        assert!(again.contains("INIT_HCA"));
    }

    // The second function, and both at once from two processes.
    let a = Command::new(MLX5).args(["devinfo", "-d", &dev]).output();
    let b = ok(&mlx5(&["devinfo", "-d", &dev1]), "devinfo of function 1");
    assert!(b.contains("fw_ver:"));
    ok(&a.unwrap(), "devinfo of function 0 meanwhile");

    // SIGTERM: a clean stop, sockets removed.
    let st = Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    served.wait_line("mlx5-emu: stopped");
    let status = served.child.wait().unwrap();
    assert!(status.success(), "mlx5-emu exited {status}");
    assert!(!sock.exists() && !sock1.exists(), "sockets removed");
}
