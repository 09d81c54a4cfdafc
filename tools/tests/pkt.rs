//! `mlx5-pkt` (issue 26) on two cabled device-model functions: every mode
//! runs to its end with every frame accounted for, RSS spreads the flows
//! over the queues as Toeplitz under the tool's key says, and bad
//! arguments are refused with a reason.

use tools::pkt::main_with;

/// The report of `mlx5-pkt ARGS`.
fn run(args: &[&str]) -> String {
    let mut out = Vec::new();
    main_with(args, &mut out).unwrap_or_else(|e| panic!("mlx5-pkt {args:?}: {e}"));
    String::from_utf8(out).unwrap()
}

/// The packet count of the report line that starts with `what`.
fn packets(report: &str, what: &str) -> u64 {
    let l = report
        .lines()
        .find(|l| l.starts_with(what) && l[what.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no {what:?} line in\n{report}"));
    l[what.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{l}"))
}

#[test]
fn rxonly_spreads_64_flows_evenly_over_4_queues() {
    // 2048 frames, 32 of each of the 64 flows (UDP source ports 10000 to
    // 10063 from 198.18.0.1 to 198.18.0.2:9000): under the Microsoft key,
    // Toeplitz puts 16 flows on each of the 4 queues (computed apart from
    // the model with Python), so 512 frames each; 4 x 512 buffers are
    // posted, so nothing can be missed.
    let r = run(&["rxonly", "-n", "2048", "-q", "4", "-s", "128"]);
    assert_eq!(packets(&r, "port 0 tx"), 2048, "{r}");
    assert_eq!(packets(&r, "port 1 rx"), 2048, "{r}");
    assert_eq!(packets(&r, "port 1 rx missed"), 0, "{r}");
    for q in 0..4 {
        assert_eq!(packets(&r, &format!("port 1 rx queue {q}")), 512, "{r}");
    }
    assert!(r.contains("bad frames: port 0 0 port 1 0"), "{r}");
}

#[test]
fn empw_bursts_reach_every_queue_checked() {
    // The generator's frames by enhanced multi-packet WQEs (ConnectX-5):
    // every one received over 4 queues, its payload as sent.
    let r = run(&[
        "rxonly", "-d", "emu:cx5", "--empw", "-n", "2048", "-q", "4", "-s", "200",
    ]);
    assert_eq!(packets(&r, "port 0 tx"), 2048, "{r}");
    assert_eq!(packets(&r, "port 1 rx"), 2048, "{r}");
    assert!(r.contains("bad frames: port 0 0 port 1 0"), "{r}");
    // ConnectX-4 Lx offers no eMPW: refused with the reason.
    let mut out = Vec::new();
    let e = main_with(&["txonly", "--empw", "-n", "10"], &mut out).unwrap_err();
    assert!(e.contains("eMPW"), "{e}");
}

#[test]
fn io_and_macswap_send_every_frame_back() {
    for mode in ["io", "macswap"] {
        let r = run(&[mode, "-n", "256", "-q", "2", "-b", "16"]);
        for what in ["port 0 tx", "port 1 rx", "port 1 tx", "port 0 rx"] {
            assert_eq!(packets(&r, what), 256, "{mode} {what}: {r}");
        }
        assert!(r.contains("bad frames: port 0 0 port 1 0"), "{mode}: {r}");
    }
}

#[test]
fn txonly_sends_them_all() {
    let r = run(&["txonly", "-n", "1000", "-s", "1500"]);
    assert_eq!(packets(&r, "port 0 tx"), 1000, "{r}");
    assert!(!r.contains("port 1 rx"), "{r}");
}

#[test]
fn bad_arguments_are_refused_with_a_reason() {
    for (args, why) in [
        (&["rxonly", "-q", "3"][..], "power of two"),
        (&["rxonly", "-s", "20"][..], "frame size"),
        (&["rxonly", "-s", "4000"][..], "frame size"),
        (&["rxonly", "-b", "0"][..], "burst"),
        (&["rxonly", "--peer", "emu"][..], "built-in model"),
        (&["rxonly", "-d", "vfio-user:/nonexistent"][..], "--peer"),
        (&["fastest"][..], "invalid value"),
        (&["udp-echo"][..], "--peer-mac"),
        (
            &["udp-echo", "--peer-mac", "1:2:3", "--peer-ip", "10.0.0.1"][..],
            "six bytes",
        ),
    ] {
        let mut out = Vec::new();
        let e = main_with(args, &mut out).expect_err(&format!("{args:?} accepted"));
        assert!(e.contains(why), "{args:?}: {e}");
    }
}
