//! The second boot of `qemu_mlx5` (issue 17 part 5): the guest with an
//! emulated Intel IOMMU (caching-mode on, each function behind its own
//! pcie-root-port, so each its own IOMMU group), one function moved from
//! mlx5_core to vfio-pci, and our own driver's binaries (`mlx5`,
//! `mlx5-perf`, built for this host, run on the trixie guest) owning it
//! through the guest kernel's VFIO group path
//! (`scripts/qemu-guest/guest/vfio.sh`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{repo, run_guest, tagged, Boot, Tally};

/// Every check of the VFIO boot, in order.
pub const VFIO_CHECKS: &[&str] = &[
    "vfio/guest_boots_with_the_iommu",
    "vfio/function_bound_to_vfio_pci",
    "vfio/mlx5_devinfo",
    "vfio/devinfo_fields_agree_with_ibv_devinfo",
    "vfio/mlx5_trace",
    "vfio/mlx5_reset",
    "vfio/mlx5e_receives_our_raw_frames",
    "vfio/udmabuf_write_bw_on_the_model",
    "vfio/mlx5_perf_write_bw_both_functions",
    "vfio/udmabuf_refused_through_vfio_type1",
];

/// The function the guest hands to vfio-pci.
const FUNCTION: &str = "0000:02:00.0";

/// Datagrams `mlx5-pkt udp-echo` sends to mlx5e's netdev (`RAW_COUNT`
/// in vfio.sh).
const RAW_COUNT: usize = 16;

/// Builds `mlx5`, `mlx5-perf` and `mlx5-pkt` (release: under TCG a debug build takes
/// minutes to bring a function up) in a target directory of their own (the
/// outer `cargo test` holds the workspace's).
fn build_bins() -> Result<Vec<PathBuf>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("qemu-mlx5-bins");
    let status = Command::new(cargo)
        .args([
            "build",
            "-q",
            "--release",
            "-p",
            "tools",
            "--bin",
            "mlx5",
            "--bin",
            "mlx5-perf",
            "--bin",
            "mlx5-pkt",
        ])
        .env("CARGO_TARGET_DIR", &dir)
        .current_dir(repo())
        .status()
        .map_err(|e| format!("cargo build of the tools: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of the tools failed ({status})"));
    }
    Ok(["mlx5", "mlx5-perf", "mlx5-pkt"]
        .iter()
        .map(|b| dir.join("release").join(b))
        .collect())
}

/// Boots the VFIO guest in `dir` and tallies its checks.
pub fn vfio_boot(t: &mut Tally, dir: &Path) {
    let _ = std::fs::create_dir_all(dir);
    let console = build_bins().and_then(|bins| {
        run_guest(
            dir,
            &Boot {
                script: "vfio.sh",
                iommu: true,
                bins: &bins,
                profile: mlx5_emu::Profile::ConnectX4Lx,
            },
        )
    });
    match console {
        Err(why) => {
            for c in VFIO_CHECKS {
                t.check(c, Err(why.clone()));
            }
        }
        Ok(console) => judge(
            t,
            &console,
            &format!("see {}", dir.join("console.log").display()),
        ),
    }
}

fn judge(t: &mut Tally, console: &str, log: &str) {
    let has = |s: &str| console.contains(s);
    let qemu: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("qemu-system-x86_64:") || l.starts_with("vfio_user"))
        .collect();
    t.check(
        "vfio/guest_boots_with_the_iommu",
        if !qemu.is_empty() {
            Err(format!("{qemu:?}"))
        } else if has("DMAR: IOMMU enabled") && has("=== ib devices: mlx5_0 mlx5_1") {
            Ok(())
        } else {
            Err(format!("no IOMMU or not both mlx5 devices; {log}"))
        },
    );
    let bound = tagged(console, &format!("vfio-pci {FUNCTION}: "));
    t.check(
        "vfio/function_bound_to_vfio_pci",
        match bound.first() {
            Some(l) if l.starts_with("driver=vfio-pci group=") => Ok(()),
            _ => Err(format!("{bound:?}; {log}")),
        },
    );
    let ours = tagged(console, "ours -v: ");
    let ran = tagged(console, "mlx5 devinfo -v ");
    t.check(
        "vfio/mlx5_devinfo",
        if ran.first() == Some(&"rc=0") && ours.iter().any(|l| l.starts_with("hca_id:\t")) {
            Ok(())
        } else {
            Err(format!(
                "{ran:?} {:?}; {log}",
                ours.iter().take(5).collect::<Vec<_>>()
            ))
        },
    );
    t.check(
        "vfio/devinfo_fields_agree_with_ibv_devinfo",
        devinfo_agree(&tagged(console, "ibv -v: "), &ours).map_err(|e| format!("{e}; {log}")),
    );
    judge_tools(t, console, log);
}

/// `mlx5 trace` and `mlx5 reset` through VFIO, and `mlx5-perf write_bw`
/// between the two functions, both ours through VFIO.
fn judge_tools(t: &mut Tally, console: &str, log: &str) {
    let trace = tagged(console, "mlx5 trace ");
    let seq: Vec<&str> = trace
        .iter()
        .find_map(|l| l.strip_prefix("sequence: "))
        .map(|s| s.split_whitespace().collect())
        .unwrap_or_default();
    let names: Vec<&str> = seq
        .iter()
        .map(|c| c.split('(').next().unwrap_or(""))
        .collect();
    let ok = trace.first().is_some_and(|l| l.starts_with("rc=0 "))
        && names.first() == Some(&"ENABLE_HCA")
        && names.last() == Some(&"DISABLE_HCA")
        && ["INIT_HCA", "CREATE_EQ", "MANAGE_PAGES", "TEARDOWN_HCA"]
            .iter()
            .all(|c| names.contains(c));
    t.check(
        "vfio/mlx5_trace",
        if ok {
            Ok(())
        } else {
            Err(format!("{trace:?}; {log}"))
        },
    );
    let reset = tagged(console, "mlx5 reset");
    t.check(
        "vfio/mlx5_reset",
        if reset.first() == Some(&" rc=0")
            && reset.iter().any(|l| l.contains("function reset done"))
        {
            Ok(())
        } else {
            Err(format!("{reset:?}; {log}"))
        },
    );
    judge_raw_frames(t, console, log);
    judge_udmabuf_emu(t, console, log);
    // Any error line fails it (our driver's MSI-X detach at close once
    // logged vfio-pci's EINVAL here: the event loop detached twice).
    let lines = tagged(console, "perf vfio_both ");
    t.check(
        "vfio/mlx5_perf_write_bw_both_functions",
        super::perftest_verdict(&lines, 1, 4).map_err(|e| format!("{e}: {lines:?}; {log}")),
    );
    judge_udmabuf_vfio(t, console, log);
}

/// Our driver's raw packet QP, on the function vfio-pci holds, sends
/// UDP datagrams to the other function's mlx5e netdev: tcpdump there
/// lists each arriving from our MAC, Linux's UDP stack echoes each, and
/// `mlx5-pkt` gets every echo back intact.
fn judge_raw_frames(t: &mut Tally, console: &str, log: &str) {
    let raw = tagged(console, "raw ");
    let count = |head: &str| {
        raw.iter()
            .find_map(|l| l.strip_prefix(head))
            .and_then(|n| n.trim().parse::<usize>().ok())
    };
    let want = format!("pkt: udp-echo: sent {RAW_COUNT} echoed intact {RAW_COUNT}");
    let ok = raw.first().is_some_and(|l| l.starts_with("pkt rc=0 "))
        && raw.contains(&want.as_str())
        && raw.contains(&format!("echo served {RAW_COUNT}").as_str())
        && count("tcpdump from ours: ").is_some_and(|n| n >= RAW_COUNT)
        && count("tcpdump echoes: ").is_some_and(|n| n >= RAW_COUNT);
    t.check(
        "vfio/mlx5e_receives_our_raw_frames",
        if ok {
            Ok(())
        } else {
            Err(format!("{raw:?}; {log}"))
        },
    );
}

/// `mlx5-perf --use_udmabuf` in the guest (whose kernel has udmabuf) on
/// the in-process model: the write_bw completes through dma-buf MRs.
fn judge_udmabuf_emu(t: &mut Tally, console: &str, log: &str) {
    let emu = tagged(console, "udmabuf emu");
    let rows: Vec<&str> = emu.iter().filter_map(|l| l.strip_prefix(": ")).collect();
    let (got, _) = super::perftest_rows(&rows);
    let bad = rows.iter().find(|l| {
        let l = l.to_ascii_lowercase();
        l.contains("error") || l.contains("fail")
    });
    t.check(
        "vfio/udmabuf_write_bw_on_the_model",
        match (emu.first(), bad, got.as_slice()) {
            (Some(&" rc=0"), None, [row]) if row.get(3).is_some_and(|v| *v > 0.0) => Ok(()),
            _ => Err(format!("{emu:?}; {log}")),
        },
    );
}

/// The same flag on a function the guest's VFIO type1 owns: the
/// registration is refused with the reason (type1 maps no `VM_PFNMAP`
/// RAM), and the server exits (no timeout).
fn judge_udmabuf_vfio(t: &mut Tally, console: &str, log: &str) {
    let vf = tagged(console, "udmabuf vfio");
    let refused = vf
        .first()
        .is_some_and(|l| l.starts_with(" rc=") && *l != " rc=0" && *l != " rc=124")
        && vf
            .iter()
            .any(|l| l.contains("ibv_reg_dmabuf_mr") && l.contains("VM_PFNMAP"));
    t.check(
        "vfio/udmabuf_refused_through_vfio_type1",
        if refused {
            Ok(())
        } else {
            Err(format!("{vf:?}; {log}"))
        },
    );
}

/// The `name: value` fields of a devinfo listing (`hca_id` left out: the
/// names differ), in order; capability lines (`name  0x1`) have no colon.
fn fields(lines: &[&str]) -> BTreeMap<String, String> {
    lines
        .iter()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.trim();
            let v = v.trim();
            (!k.is_empty() && !v.is_empty() && k != "hca_id" && !k.contains(' '))
                .then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// Every field both `ibv_devinfo -v` and our `mlx5 devinfo -v` print
/// agrees, and they share at least the fields our devinfo promises.
fn devinfo_agree(ibv: &[&str], ours: &[&str]) -> Result<(), String> {
    let (a, b) = (fields(ibv), fields(ours));
    let common: Vec<&String> = a.keys().filter(|k| b.contains_key(*k)).collect();
    let differ: Vec<String> = common
        .iter()
        .filter(|k| a[**k] != b[**k])
        .map(|k| format!("{k}: ibv {:?} ours {:?}", a[*k], b[*k]))
        .collect();
    let must = [
        "fw_ver",
        "node_guid",
        "sys_image_guid",
        "vendor_id",
        "vendor_part_id",
        "board_id",
        "max_qp",
        "max_cq",
        "max_mr",
        "max_pd",
        "max_srq",
        "state",
        "link_layer",
        "active_mtu",
    ];
    let missing: Vec<&str> = must
        .iter()
        .copied()
        .filter(|k| !common.iter().any(|c| c == k))
        .collect();
    println!(
        "qemu_mlx5: devinfo: {} fields both print, {} differ",
        common.len(),
        differ.len()
    );
    if !differ.is_empty() {
        return Err(format!("{differ:?}"));
    }
    if !missing.is_empty() {
        return Err(format!("not printed by both: {missing:?}"));
    }
    Ok(())
}
