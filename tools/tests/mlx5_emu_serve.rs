//! `mlx5-emu serve` as its own process, opened by `mlx5` from other
//! processes over vfio-user: devinfo and trace work, a client killed
//! mid-run leaves the server ready for the next, a second function is
//! served on `PATH.1`, and SIGTERM stops the server and removes its sockets.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

const EMU: &str = env!("CARGO_BIN_EXE_mlx5-emu");
const MLX5: &str = env!("CARGO_BIN_EXE_mlx5");

struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
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

fn wait_for(path: &Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_devinfo_trace_kill_and_second_function() {
    let sock = std::env::temp_dir().join(format!("mlx5-emu-test-{}.sock", std::process::id()));
    let sock1 = PathBuf::from(format!("{}.1", sock.display()));
    let mut served = Served(
        Command::new(EMU)
            .args(["serve", "--socket"])
            .arg(&sock)
            .args(["--profile", "cx5", "--functions", "2"])
            .spawn()
            .expect("starting mlx5-emu"),
    );
    wait_for(&sock);
    wait_for(&sock1);
    let dev = format!("vfio-user:{}", sock.display());
    let dev1 = format!("vfio-user:{}", sock1.display());

    let info = ok(&mlx5(&["devinfo", "-d", &dev]), "devinfo");
    assert!(
        info.contains("fw_ver:") && info.contains("16."),
        "ConnectX-5 firmware: {info}"
    );
    let trace = ok(&mlx5(&["trace", "-d", &dev]), "trace");
    assert!(trace.contains("INIT_HCA") && trace.contains("TEARDOWN_HCA"));

    // Killed mid-run, at several points of its bring-up; the next run works.
    for ms in [5, 20, 60] {
        let mut c = Command::new(MLX5)
            .args(["trace", "-d", &dev])
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(ms));
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
        .args(["-TERM", &served.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = served.0.wait().unwrap();
    assert!(status.success(), "mlx5-emu exited {status}");
    assert!(!sock.exists() && !sock1.exists(), "sockets removed");
}
