//! `mlx5-perf write_bw -q 4096` at the default fd limit (issue 14): queue
//! memory comes from arenas, so 4096 QPs on each of two device-model
//! functions fit in `RLIMIT_NOFILE` 1024, set soft and hard for the child
//! so that nothing in it can raise the limit again.

use std::process::Command;

const PERF: &str = env!("CARGO_BIN_EXE_mlx5-perf");

#[test]
fn write_bw_with_4096_qps_runs_at_the_default_fd_limit() {
    let qps = 4096u64;
    let iters = 5u64;
    let out = Command::new("sh")
        .args([
            "-c",
            r#"ulimit -Sn 1024 && ulimit -Hn 1024 && echo "nofile $(ulimit -n)" && exec "$0" "$@""#,
            PERF,
            "write_bw",
            "-q",
            &qps.to_string(),
            "-n",
            &iters.to_string(),
            "-s",
            "64",
        ])
        .output()
        .expect("run mlx5-perf");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "mlx5-perf failed ({}):\n{text}\n{err}",
        out.status
    );
    assert!(
        text.contains("nofile 1024"),
        "the limit was not set:\n{text}"
    );
    assert!(
        text.contains(&format!("Number of qps   : {qps}")),
        "not {qps} QPs:\n{text}"
    );
    // The report row: size, messages (every QP's), peak, average, rate.
    let row: Vec<f64> = text
        .lines()
        .filter_map(|l| {
            let v: Vec<f64> = l
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (v.len() == 5 && v[0] == 64.0).then_some(v)
        })
        .next()
        .unwrap_or_else(|| panic!("no report row:\n{text}"));
    assert_eq!(row[1], (qps * iters) as f64, "every QP's messages counted");
    assert!(row[4] > 0.0, "a message rate: {row:?}");
}
