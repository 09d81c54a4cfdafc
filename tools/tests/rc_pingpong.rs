//! `rc_pingpong` with no device: both sides on two cabled model functions.

use std::process::Command;

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rc_pingpong"))
        .args(args)
        .output()
        .expect("run rc_pingpong");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check(args: &[&str], iters: u64, size: u64) {
    let (ok, out, err) = run(args);
    assert!(ok, "rc_pingpong {args:?} failed: {out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    assert_eq!(count("  local address:  LID 0x0000, QPN 0x"), 2, "{out}");
    assert_eq!(count("  remote address:  LID 0x0000, QPN 0x"), 2, "{out}");
    assert!(lines
        .iter()
        .all(|l| !l.contains("address") || l.contains(", GID fe80::")));
    let bytes = format!("{} bytes in ", 2 * iters * size);
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with(&bytes) && l.ends_with(" Mbit/sec"))
            .count(),
        2,
        "{out}"
    );
    let it = format!("{iters} iters in ");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with(&it) && l.ends_with(" usec/iter"))
            .count(),
        2,
        "{out}"
    );
    // Each side's remote QPN is the other's local QPN.
    let qpn = |l: &&str| l.split("QPN ").nth(1).map(|s| s[..8].to_string());
    let psn = |l: &&str| l.split("PSN ").nth(1).map(|s| s[..8].to_string());
    let locals: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("local"))
        .map(|l| (qpn(l), psn(l)))
        .collect();
    let remotes: Vec<_> = lines
        .iter()
        .filter(|l| l.contains("remote"))
        .map(|l| (qpn(l), psn(l)))
        .collect();
    for r in &remotes {
        assert!(locals.contains(r), "remote {r:?} is a local address: {out}");
    }
}

#[test]
fn polled_with_validation() {
    check(&["-n", "50", "-s", "1000", "-c", "-r", "8"], 50, 1000);
}

#[test]
fn events_and_large_mtu() {
    check(&["-e", "-n", "20", "-s", "9000", "-m", "4096"], 20, 9000);
}

#[test]
fn bad_arguments_are_refused() {
    let (ok, _, err) = run(&["-m", "1500", "-n", "1"]);
    assert!(!ok);
    assert!(err.contains("invalid MTU 1500"), "{err}");
    let (ok, _, err) = run(&["-i", "2", "-n", "1"]);
    assert!(!ok);
    assert!(err.contains("port 2"), "{err}");
    let (ok, _, err) = run(&["somehost"]);
    assert!(!ok);
    assert!(err.contains("without a server name"), "{err}");
}
