//! `dc_pingpong` (issue 20): N clients ping-pong with one server DCT on
//! cabled model functions; every client finishes its exchanges and the
//! server received them all; a profile without DCT is refused.

use std::process::Command;

fn dc_pingpong(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dc_pingpong"))
        .args(args)
        .output()
        .expect("dc_pingpong runs")
}

#[test]
fn four_clients_on_one_dct() {
    let out = dc_pingpong(&["-c", "4", "-n", "200", "-s", "512"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let iters = text
        .lines()
        .filter(|l| l.starts_with("200 iters in "))
        .count();
    assert_eq!(iters, 4, "{text}");
    assert!(
        text.contains("server: 800 messages received on one DCT"),
        "{text}"
    );
}

#[test]
fn a_card_without_dct_is_refused() {
    let out = dc_pingpong(&["-d", "emu:cx4lx"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("DCT"));
}
