//! Issue 14: `mlx5-perf write_bw` with many QPs at the default fd limit
//! (`ulimit -n 1024`). With a memfd per ring and doorbell record, `-q 300`
//! failed with `memfd_create: Too many open files`; queue memory now comes
//! from a few large chunks.

use std::process::Command;

const PERF: &str = env!("CARGO_BIN_EXE_mlx5-perf");

#[test]
fn write_bw_with_300_qps_runs_at_ulimit_n_1024() {
    // Both sides in this one process on the model: 600 QPs, 4 CQs.
    let out = Command::new("sh")
        .args(["-c", "ulimit -n 1024 && exec \"$0\" \"$@\""])
        .arg(PERF)
        .args(["write_bw", "-q", "300", "-n", "600", "-s", "64"])
        .env("RUST_LOG", "error")
        .output()
        .expect("running mlx5-perf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mlx5-perf failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    // perftest's report line: size, iterations, peak, average, msg rate.
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("64 "))
        .unwrap_or_else(|| panic!("no 64-byte result line:\n{stdout}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    // Iterations are counted over all QPs: 600 each.
    assert_eq!(cols.get(1), Some(&"180000"), "{row}");
}
