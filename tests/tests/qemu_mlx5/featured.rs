//! The feature-rich boot of `qemu_mlx5`: the same guest with two cabled
//! ConnectX-7 functions (firmware 28.39: DC, DevX, ODP, device memory,
//! host-endian atomics, all of which the ConnectX-4 Lx of the first boot
//! lacks), running `scripts/qemu-guest/guest/featured.sh`: Linux's
//! mlx5_core and mlx5_ib on those caps, perftest `ib_atomic_bw` and
//! `ib_write_bw -c DC` between the functions, DPDK's testpmd (its mlx5
//! PMD over mlx5_ib: `txonly` to `rxonly`, then `io` both ways), mlx5e's
//! traffic, and rdma-core's whole suite held to its own ratchet (`tests/data/rdma-core-ratchet-cx7.txt`), so
//! test_mlx5_dc, test_mlx5_devx, test_odp, test_mlx5_mkey, the device-memory
//! and atomic tests run against the model instead of skipping.
//!
//! A boot of its own rather than four functions in one: the first boot's
//! checks (the traced firmware's) stay exactly as they were, each pair is
//! `mlx5_0`/`mlx5_1` and `eth0`/`eth1` in its guest, and the price is one
//! more kernel boot and probe (measured in docs/MEASUREMENTS.md).

use std::path::Path;

use mlx5_emu::Profile;

use super::{perftest_verdict, print_mlx5_lines, run_guest, suite, tagged, Boot, Tally};

/// Every check of the feature-rich boot, in order (the suite's two last).
pub const CX7_CHECKS: &[&str] = &[
    "cx7/guest_boots",
    "cx7/mlx5_core_probes_both_functions",
    "cx7/no_command_timeout_or_recovery",
    "cx7/ports_active",
    "cx7/ibv_devinfo_offers_atomics",
    "perftest_ib_atomic_bw",
    "cx7/perftest_ib_write_bw_dc",
    "cx7/mlx5_ib_dmabuf_mr_takes_rdma_write_and_read",
    "cx7/mlx5_ib_dmabuf_mr_refusals",
    "cx7/mlx5_ib_resolves_odp_faults_on_srq_wqes",
    "cx7/mlx5e_udp_echo_between_functions",
    "cx7/mlx5e_tcp_stream_between_functions",
    "cx7/mlx5e_vxlan_udp_echo_between_functions",
    "cx7/mlx5e_vxlan_tcp_stream_between_functions",
    "cx7/mlx5e_gre_udp_echo_between_functions",
    "cx7/mlx5e_gre_tcp_stream_between_functions",
    "cx7/mlx5e_ping_and_iperf3_between_functions",
    "cx7/mlx5e_leaves_inner_checksums_to_the_device",
    "cx7/mlx5e_pktgen_bursts_arrive",
    "cx7/mlx5e_sends_by_enhanced_multi_packet_wqes",
    "cx7/mlx5e_receives_through_striding_rqs",
    "cx7/mlx5e_reads_and_sets_global_pause",
    "cx7/mlx5e_checksum_complete_matches_the_frames",
    "cx7/mlx5e_lro_merges_the_tcp_stream",
    "cx7/mlx5e_expands_compressed_cqes",
    "cx7/mlx5e_takes_the_inner_checksums_from_tunnelled_cqes",
    "cx7/dpdk_testpmd_txonly_reaches_rxonly",
    "cx7/dpdk_defaults_testpmd_txonly_reaches_rxonly",
    "cx7/dpdk_testpmd_io_forwards_both_ways",
    "cx7/dpdk_defaults_testpmd_io_forwards_both_ways",
    "cx7/dpdk_makes_multi_packet_rqs",
    "cx7/dpdk_mprq_testpmd_txonly_reaches_rxonly",
    "cx7/dpdk_mprq_testpmd_io_forwards_both_ways",
    "cx7/dpdk_expands_compressed_cqes",
    "cx7/rdma_core_suite_runs_whole",
    "cx7/rdma_core_suite_ratchet",
];

/// The firmware version Linux prints for the ConnectX-7 profile.
const FW: &str = "28.39.1002";

/// Boots the ConnectX-7 guest in `dir` and tallies its checks.
pub fn featured_boot(t: &mut Tally, dir: &Path) {
    let _ = std::fs::create_dir_all(dir);
    let boot = Boot {
        script: "featured.sh",
        iommu: false,
        bins: &[],
        profile: Profile::ConnectX7,
    };
    let console = match run_guest(dir, &boot) {
        Ok(c) => c,
        Err(why) => {
            for c in CX7_CHECKS {
                t.check(c, Err(why.clone()));
            }
            return;
        }
    };
    print_mlx5_lines(&console);
    let log = format!("see {}", dir.join("console.log").display());
    let emu = std::fs::read_to_string(dir.join(super::EMU_COUNTS)).unwrap_or_default();
    judge(t, &console, &emu, &log);
    suite::judge(t, &console, &log, &suite::CX7);
}

/// `emu`: the functions' counts of the boot ([`super::EMU_COUNTS`]).
fn judge(t: &mut Tally, console: &str, emu: &str, log: &str) {
    let has = |s: &str| console.contains(s);
    let up = tagged(console, "up ");
    let probed = tagged(console, "probed at ");
    if let (Some(u), Some(p)) = (up.first(), probed.first()) {
        println!("qemu_mlx5: cx7 boot: script at {u}, both IB devices at {p} s (guest uptime)");
    }
    t.check(
        "cx7/guest_boots",
        if up.is_empty() {
            Err(format!("the guest script never ran; {log}"))
        } else {
            Ok(())
        },
    );
    let missing: Vec<&str> = ["0000:01:00.0", "0000:02:00.0"]
        .into_iter()
        .filter(|f| !has(&format!("mlx5_core {f}: firmware version: {FW}")))
        .collect();
    t.check(
        "cx7/mlx5_core_probes_both_functions",
        if missing.is_empty() && has("=== ib devices: mlx5_0 mlx5_1") {
            Ok(())
        } else {
            Err(format!(
                "no {FW} firmware line for {missing:?} or not both IB devices; {log}"
            ))
        },
    );
    let stalls: Vec<&str> = console
        .lines()
        .filter(|l| l.contains("mlx5") && (l.contains("Recovered") || l.contains("timeout")))
        .collect();
    t.check(
        "cx7/no_command_timeout_or_recovery",
        if stalls.is_empty() {
            Ok(())
        } else {
            Err(format!("{stalls:?}"))
        },
    );
    let ports = tagged(console, "port ");
    let active = ports.iter().filter(|l| l.ends_with("4: ACTIVE")).count();
    t.check(
        "cx7/ports_active",
        if active == 2 {
            Ok(())
        } else {
            Err(format!("{ports:?}; {log}"))
        },
    );
    let atomics: Vec<&str> = ["mlx5_0", "mlx5_1"]
        .into_iter()
        .filter(|d| {
            !tagged(console, &format!("devinfo -v {d}: "))
                .iter()
                .any(|l| l.contains("atomic_cap:") && l.contains("ATOMIC_HCA"))
        })
        .collect();
    t.check(
        "cx7/ibv_devinfo_offers_atomics",
        if atomics.is_empty() {
            Ok(())
        } else {
            Err(format!("no atomic_cap ATOMIC_HCA on {atomics:?}; {log}"))
        },
    );
    for (tag, check) in [
        ("atomic_bw", "perftest_ib_atomic_bw"),
        ("dc_write_bw", "cx7/perftest_ib_write_bw_dc"),
    ] {
        let lines = tagged(console, &format!("perf {tag} "));
        t.check(
            check,
            perftest_verdict(&lines, 1, 4).map_err(|e| format!("{e}: {lines:?}; {log}")),
        );
    }
    judge_dmabuf(t, console, log);
    judge_odp_srq(t, console, log);
    super::judge_eth_traffic(t, console, log, "cx7/", true);
    judge_dpdk(t, console, log);
    judge_dpdk_compressed(t, console, emu, log);
}

/// DPDK's receivers asked for compressed CQEs (its default; the devx run
/// logs it at debug level) and read them: the model wrote more compressed
/// sessions in the boot (both functions, [`super::EMU_COUNTS`]) than
/// mlx5e expanded (its `rx_cqe_compress_blks`, both
/// netdevs; mlx5e compresses only once eth_pair.sh turns it on, after
/// DPDK's runs), by at least [`DPDK_MIN_SESSIONS`]; the frames' counts
/// are judged by the DPDK checks.
fn judge_dpdk_compressed(t: &mut Tally, console: &str, emu: &str, log: &str) {
    let asked = tagged(console, "dpdk devx-rxq: ")
        .iter()
        .any(|l| l.contains("Rx CQE compression is enabled"));
    let model: u64 = emu
        .lines()
        .filter_map(|l| l.strip_prefix("function "))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let at = w.iter().position(|x| *x == "compressed_sessions")?;
            w.get(at + 1)?.parse::<u64>().ok()
        })
        .sum();
    let mlx5e: u64 = tagged(console, "eth stat ")
        .iter()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "rx_cqe_compress_blks", v] => v.parse::<u64>().ok(),
            _ => None,
        })
        .sum();
    t.check(
        "cx7/dpdk_expands_compressed_cqes",
        if asked && model >= mlx5e + DPDK_MIN_SESSIONS {
            println!("qemu_mlx5: compressed sessions {model} in the model, {mlx5e} read by mlx5e");
            Ok(())
        } else {
            Err(format!(
                "asked {asked}, sessions {model} in the model, {mlx5e} read by mlx5e; {log}"
            ))
        },
    );
}

/// Compressed sessions DPDK's runs must have read at the least (they
/// receive hundreds of thousands of frames in bursts of 32).
const DPDK_MIN_SESSIONS: u64 = 1000;

/// One port's forward statistics from testpmd as it stopped (`dpdk.sh`):
/// frames received, missed by the device (no buffer posted), sent.
#[derive(Debug, Clone, Copy)]
struct PortStats {
    rx: u64,
    missed: u64,
    tx: u64,
}

/// `=== dpdk TAG port N rx R missed M tx T` of run `tag`, port `port`.
fn dpdk_port(lines: &[&str], tag: &str, port: u32) -> Option<PortStats> {
    let head = format!("{tag} port {port} ");
    let l = lines.iter().find_map(|l| l.strip_prefix(head.as_str()))?;
    let w: Vec<&str> = l.split_whitespace().collect();
    match w[..] {
        ["rx", rx, "missed", missed, "tx", tx] => Some(PortStats {
            rx: rx.parse().ok()?,
            missed: missed.parse().ok()?,
            tx: tx.parse().ok()?,
        }),
        _ => None,
    }
}

/// Frames a sending port may still hold in its send queue when testpmd
/// stops it (counted sent by testpmd, never put on the cable): the
/// PMD's default ring of 512 and a burst, with room.
const DPDK_TX_QUEUED: u64 = 1024;

/// Frames circulating in `io` mode: `--tx-first` sends one burst of 32
/// from each port, and io forwards what it receives, nothing more.
const DPDK_IO_LOOP: u64 = 64;

/// The two netdevs' own frames during a phase (`=== dpdk TAG kernel K0
/// K1`): both ports are promiscuous, so these may arrive beside
/// testpmd's (an upper bound: some go elsewhere).
fn dpdk_kernel(lines: &[&str], tag: &str) -> Option<(u64, u64)> {
    let head = format!("{tag} kernel ");
    let l = lines.iter().find_map(|l| l.strip_prefix(head.as_str()))?;
    let mut w = l.split_whitespace().map(|n| n.parse::<u64>().ok());
    Some((w.next()??, w.next()??))
}

/// DPDK's testpmd with its mlx5 PMD over mlx5_ib (`dpdk.sh`), with its
/// queues and flows through verbs (`verbs`) and with DPDK's defaults
/// (`devx`: DevX queues in UMEMs, DV flows), and with its Multi-Packet
/// RQs (`mprq`: the device's striding RQs). `txonly` on mlx5_0's
/// function to `rxonly` on mlx5_1's: every frame sent (testpmd's and
/// the netdevs' own) arrived or was counted missed by the receiving
/// device, except what the sender's queue held when it stopped. Then
/// `io` with both ports in one process, each forwarding what the other
/// sends: no frame lost or made up (each direction's received is at most
/// what was sent plus what the netdevs sent into the loop, and sent less
/// received at most what is in flight). A function's own multicast is
/// not looped back to it (mlx5_core leaves the vport's local loopback
/// off, one user transport domain per device does not turn it on): were
/// it, each multicast frame a netdev sends would double at every pass.
fn judge_dpdk(t: &mut Tally, console: &str, log: &str) {
    let lines = tagged(console, "dpdk ");
    let rc_ok = |tag: &str| lines.contains(&format!("{tag} rc=0").as_str());
    let why = |what: &str| format!("{what}: {lines:?}; {log}");
    for (l, check) in [
        ("verbs", "dpdk_testpmd"),
        ("devx", "dpdk_defaults_testpmd"),
        ("mprq", "dpdk_mprq_testpmd"),
    ] {
        let tag = |x: &str| format!("{l}-{x}");
        // The MPRQ run's receiver made Multi-Packet RQs (else DPDK fell
        // back to its plain RQs and the run judges nothing new).
        let mprq = lines.iter().any(|x| {
            x.starts_with(&format!("{l}-rxq: ")) && x.contains("Multi-Packet RQ is configured")
        });
        if l == "mprq" {
            t.check(
                "cx7/dpdk_makes_multi_packet_rqs",
                if mprq {
                    Ok(())
                } else {
                    Err(why(
                        "no \"Multi-Packet RQ is configured\" from the mprq receiver",
                    ))
                },
            );
        }
        let txonly = match (
            dpdk_port(&lines, &tag("tx"), 0),
            dpdk_port(&lines, &tag("rx"), 0),
            dpdk_kernel(&lines, &tag("txonly")),
        ) {
            (Some(s), Some(r), Some((k0, k1))) if rc_ok(&tag("tx")) && rc_ok(&tag("rx")) => {
                // The netdevs' own frames may arrive too: the sender's
                // across the cable.
                let (arrived, sent) = (r.rx + r.missed, s.tx + k0 + k1);
                if r.rx > 0 && arrived <= sent && sent - arrived <= DPDK_TX_QUEUED {
                    println!(
                        "qemu_mlx5: dpdk {l} txonly sent {} (+{} by the netdevs) rxonly received {} missed {}",
                        s.tx, k0 + k1, r.rx, r.missed
                    );
                    Ok(())
                } else {
                    Err(why("received plus missed is not what was sent"))
                }
            }
            _ => Err(why("no statistics from both testpmd runs")),
        };
        t.check(&format!("cx7/{check}_txonly_reaches_rxonly"), txonly);
        let io = match (
            dpdk_port(&lines, &tag("io"), 0),
            dpdk_port(&lines, &tag("io"), 1),
            dpdk_kernel(&lines, &tag("io")),
        ) {
            (Some(p0), Some(p1), Some((k0, k1))) if rc_ok(&tag("io")) => {
                let k = k0 + k1;
                let ok = [(p0, p1), (p1, p0)].iter().all(|(from, to)| {
                    to.missed == 0
                        && to.rx > DPDK_IO_LOOP
                        && to.rx <= from.tx + k
                        && from.tx <= to.rx + DPDK_IO_LOOP + k
                });
                if ok {
                    println!(
                        "qemu_mlx5: dpdk {l} io forwarded {} and {} frames (+{k} by the netdevs)",
                        p0.tx, p1.tx
                    );
                    Ok(())
                } else {
                    Err(why("an io direction lost, missed or made up frames"))
                }
            }
            _ => Err(why("no statistics from the io run")),
        };
        t.check(&format!("cx7/{check}_io_forwards_both_ways"), io);
    }
}

/// `odp_srq.py`: SENDs into SRQ WQEs over never-touched ODP memory land
/// intact, each in its WQE, after mlx5_ib resolved the model's RMP page
/// faults (its own per-MR page-fault counter above zero).
fn judge_odp_srq(t: &mut Tally, console: &str, log: &str) {
    let lines = tagged(console, "odp_srq ");
    let has = |s: &str| lines.iter().any(|l| l.starts_with(s));
    let faults = lines
        .iter()
        .find_map(|l| l.strip_prefix("page faults "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    let ok = lines.first() == Some(&"rc=0")
        && has("reg ok lkey")
        && has("send 0 status 0")
        && has("send 1 status 0")
        && has("receives ok")
        && has("data ok")
        && faults.is_some_and(|n| n > 0)
        && has("done");
    t.check(
        "cx7/mlx5_ib_resolves_odp_faults_on_srq_wqes",
        if ok {
            Ok(())
        } else {
            Err(format!("{lines:?}; {log}"))
        },
    );
}

/// `dmabuf.py`: a udmabuf registered through mlx5_ib (`ibv_reg_dmabuf_mr`)
/// takes an RDMA WRITE (the memfd behind it holds the bytes) and answers
/// an RDMA READ (with bytes rewritten through the memfd); a range past the
/// dma-buf, a memfd that is not one and a closed fd are refused.
fn judge_dmabuf(t: &mut Tally, console: &str, log: &str) {
    let lines = tagged(console, "dmabuf ");
    let has = |s: &str| lines.iter().any(|l| l.starts_with(s));
    let traffic = lines.first() == Some(&"rc=0")
        && has("reg ok rkey")
        && has("write status 0 landed ok")
        && has("read status 0 returned ok")
        && has("done");
    t.check(
        "cx7/mlx5_ib_dmabuf_mr_takes_rdma_write_and_read",
        if traffic {
            Ok(())
        } else {
            Err(format!("{lines:?}; {log}"))
        },
    );
    let refused = ["past-end", "not-a-dmabuf", "closed-fd"]
        .iter()
        .all(|w| has(&format!("refused {w} ok:")));
    t.check(
        "cx7/mlx5_ib_dmabuf_mr_refusals",
        if refused {
            Ok(())
        } else {
            Err(format!("{lines:?}; {log}"))
        },
    );
}
