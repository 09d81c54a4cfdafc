//! Linux's own mlx5_core and mlx5_ib against the device model.
//!
//! A User-Mode Linux kernel (built by `scripts/uml/build-kernel.sh`, cached
//! outside the repo) boots with `virtio_uml.device=SOCKET:1234`; this test
//! process hosts the model (`mlx5_emu::Device`) and serves it on SOCKET as a
//! virtio_pcidev PCI function (`pcidev_vhost::Server`). The guest's root is
//! the host's file system (hostfs); its init is a shell script that waits
//! for the IB device, records what sysfs says, unbinds the driver, records
//! dmesg, and powers off. The test then reads those files and the model's
//! counters and command log.
//!
//! Artifacts of the last run: `target/uml-mlx5/` (console, dmesg, sysfs
//! dump, `command-log.txt`).
//!
//! Without a kernel (none cached for the build script's current version, no
//! `MLX5_UML_KERNEL`) the test says why and skips; `scripts/test-all.sh`
//! builds the kernel first unless `MLX5_UML_BUILD=0`.
//!
//! The checks go in layers: mlx5_core's probe (firmware version, EQs,
//! health, the PCIe link, flow steering's anchor table), its teardown on
//! unbind (every object destroyed, every page back, DISABLE_HCA last,
//! nothing alive at TEARDOWN_HCA), a dmesg without failures, then mlx5_ib.
//!
//! Ignored for now: mlx5_core probes and tears down cleanly and mlx5_ib
//! registers mlx5_0 and tears down cleanly too, but some runs fail in the
//! guest's virt-pci driver: a read queued before it marks itself waiting
//! can have its completion drained by the command queue's callback ("um
//! virt-pci delay", then a read of all ones: "PCI slot is unavailable").

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mlx5_emu::{Device, DeviceConfig};
use mlx5_hw::trace::opcode_name;
use pcidev_vhost::Server;
use vfio::emulated::Bus;

/// The virtio device id the kernel was configured with
/// (CONFIG_UML_PCI_OVER_VIRTIO_DEVICE_ID in scripts/uml/config.fragment).
const PCIDEV_VIRTIO_ID: u32 = 1234;
/// A guard against a hung guest (not a measurement): boot, probe, unbind
/// and power-off take well under a minute here.
const GUEST_DEADLINE: Duration = Duration::from_secs(300);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The UML kernel to boot (`MLX5_UML_KERNEL`, else the build script's cached
/// one), or why there is none (the skip message).
fn kernel() -> Result<PathBuf, String> {
    if let Ok(k) = std::env::var("MLX5_UML_KERNEL") {
        // Asked for by name: a wrong path is an error, not a skip.
        let path = PathBuf::from(&k);
        assert!(path.is_file(), "MLX5_UML_KERNEL={k} is not a file");
        return Ok(path);
    }
    let script = workspace().join("scripts/uml/build-kernel.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--path")
        .output()
        .map_err(|e| format!("cannot run bash {}: {e}", script.display()))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "no UML kernel at {} (the build script's cache for its current version): \
             build it with `bash scripts/uml/build-kernel.sh` (a few minutes on 2 cores; \
             scripts/test-all.sh does unless MLX5_UML_BUILD=0 or the build tools are \
             missing), or point MLX5_UML_KERNEL at one",
            path.display()
        ))
    }
}

fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .join("uml-mlx5");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("artifact directory");
    dir
}

/// The guest's init: everything it finds goes to files in `out` (the same
/// path in the guest, through hostfs).
fn init_script(out: &Path) -> String {
    let out = out.display();
    format!(
        r#"#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
out={out}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo "init: waiting for mlx5_0" > /dev/console
i=0
while [ ! -e /sys/class/infiniband/mlx5_0/ports/1/state ] && [ $i -lt 300 ]; do
    sleep 0.1
    i=$((i + 1))
done
ls /sys/bus/pci/drivers/mlx5_core > $out/bound.txt 2>&1
dev=/sys/class/infiniband/mlx5_0
for f in fw_ver hca_type node_type node_guid sys_image_guid board_id \
         ports/1/state ports/1/phys_state ports/1/link_layer ports/1/lid \
         ports/1/sm_lid ports/1/rate ports/1/gids/0 ports/1/pkeys/0; do
    [ -e $dev/$f ] && echo "$f=$(cat $dev/$f 2>&1)" >> $out/ib.txt
done
ls /sys/class/infiniband > $out/ib-devices.txt 2>&1
# Let the health poller (every 2 s) run a few times.
sleep 5
dmesg > $out/dmesg-probe.txt
# The guest's memory with mlx5_ib up (its mkey cache included): the artifact
# that says whether mem= leaves room.
cat /proc/meminfo > $out/meminfo-probe.txt
echo "init: unbinding" > /dev/console
for d in /sys/bus/pci/drivers/mlx5_core/0000:*; do
    [ -e "$d" ] && echo "$(basename $d)" > /sys/bus/pci/drivers/mlx5_core/unbind
done
ls /sys/class/infiniband > $out/ib-devices-after.txt 2>&1
dmesg > $out/dmesg.txt
echo done > $out/done
echo o > /proc/sysrq-trigger
sleep 10
"#
    )
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// dmesg lines of the mlx5 drivers that report a failure.
fn failures(dmesg: &str) -> Vec<&str> {
    dmesg
        .lines()
        .filter(|l| {
            let lc = l.to_ascii_lowercase();
            let ours = lc.contains("mlx5") || lc.contains("infiniband");
            let bad = [
                "error", "fail", "timeout", "warn", "err(", "unknown", "bug", "leak",
            ]
            .iter()
            .any(|w| lc.contains(w));
            (ours && bad)
                || lc.contains("call trace")
                || lc.contains("kernel bug")
                || lc.contains("um virt-pci delay")
        })
        .collect()
}

#[test]
fn linux_mlx5_probes_registers_ib_and_tears_down() {
    // RUST_LOG=debug shows the vhost-user conversation and the model.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let kernel = match kernel() {
        Ok(k) => k,
        Err(why) => {
            println!("uml_mlx5: SKIPPED: {why}");
            return;
        }
    };
    let out = artifacts();
    let sock = out.join("pcidev.sock");
    let init = out.join("init.sh");
    std::fs::write(&init, init_script(&out)).expect("init script");
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod init");

    let bus = Bus::new();
    let model = Arc::new(Device::new(DeviceConfig::default(), bus.clone()));
    let server = Server::spawn(&sock, model.clone(), bus).expect("vhost-user socket");

    let console = std::fs::File::create(out.join("console.txt")).expect("console log");
    let mut guest = Command::new(&kernel)
        // The guest has 750 MiB free with mlx5_ib up (meminfo-probe.txt).
        .arg("mem=768M")
        // virt-pci spins on every read for at most this many 1 us delays
        // (40000 by default), then fails it with all ones and leaves the
        // request queued, where the next command overwrites its header. The
        // backend answers at once, but a loaded host can leave its thread
        // unscheduled for longer than 40 ms: wait up to ~5 s instead.
        .arg("virt_pci.max_delay_us=5000000")
        .arg("root=/dev/root")
        .arg("rootfstype=hostfs")
        .arg("rootflags=/")
        .arg("rw")
        .arg(format!("init={}", init.display()))
        .arg(format!(
            "virtio_uml.device={}:{PCIDEV_VIRTIO_ID}",
            sock.display()
        ))
        .arg("con0=null,fd:1")
        .arg("con=null")
        .arg("loglevel=7")
        // virt-pci gives up on the device when an MMIO read is not answered
        // within 40 ms (its default): a backend thread that a loaded host
        // (CI, 2 shared cores) leaves unscheduled that long is not a device
        // fault. 2 s; a longer stall still shows as "um virt-pci delay".
        .env("TMPDIR", "/dev/shm")
        .stdin(Stdio::null())
        .stdout(console.try_clone().expect("console fd"))
        .stderr(console)
        .process_group(0)
        .spawn()
        .expect("start UML");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = guest.try_wait().expect("wait UML") {
            break Some(s);
        }
        if start.elapsed() > GUEST_DEADLINE {
            // UML's helper processes share its process group.
            let pgid = guest.id() as i32;
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{pgid}"))
                .status();
            let _ = guest.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let health_reads = server.mmio_reads_at(0, mlx5_emu::initseg::HEALTH_COUNTER as u64);
    let served = server.stop().expect("vhost-user service");
    let stats = model.stats();
    let log = model.command_log();

    // The command log, as the artifact of the run.
    let mut text = String::new();
    let mut count: BTreeMap<&str, usize> = BTreeMap::new();
    for e in &log {
        let name = opcode_name(e.opcode);
        *count.entry(name).or_default() += 1;
        let _ = writeln!(
            text,
            "slot {:2} {:<28} ({:#06x}) op_mod {:#x} delivery {:#x} status {:#x} syndrome {:#010x}",
            e.slot, name, e.opcode, e.op_mod, e.delivery, e.status, e.syndrome
        );
    }
    let _ = writeln!(text, "\n# counts");
    for (n, c) in &count {
        let _ = writeln!(text, "{n} {c}");
    }
    let _ = writeln!(text, "\n# model stats\n{stats:#?}\n# backend\n{served:#?}");
    std::fs::write(out.join("command-log.txt"), &text).expect("command log artifact");

    let console = read(&out, "console.txt");
    assert!(
        status.is_some(),
        "UML did not power off within {GUEST_DEADLINE:?}; console tail:\n{}",
        tail(&console, 40)
    );
    assert_eq!(
        read(&out, "done").trim(),
        "done",
        "init did not finish:\n{}",
        tail(&console, 60)
    );

    // mlx5_core probed and read our firmware version and PCIe link.
    let probe = read(&out, "dmesg-probe.txt");
    let dmesg = read(&out, "dmesg.txt");
    let (maj, min, sub) = model.config().profile.fw_version();
    let fw = format!("{maj}.{min}.{sub}");
    assert!(
        probe.contains(&format!("firmware version: {fw}")),
        "mlx5_core did not report firmware {fw}:\n{}",
        tail(&probe, 40)
    );
    for op in [
        "ENABLE_HCA",
        "QUERY_PAGES",
        "MANAGE_PAGES",
        "INIT_HCA",
        "CREATE_EQ",
    ] {
        assert!(
            count.get(op).copied().unwrap_or(0) > 0,
            "no {op} in the command log"
        );
    }
    assert!(
        served.msis > 0,
        "no MSI-X message reached the guest: {served:?}"
    );
    assert!(
        health_reads >= 2,
        "the health counter was read {health_reads} times"
    );
    assert_eq!(
        served.refused, 0,
        "the backend refused requests: {served:?}"
    );
    // A ConnectX-4 Lx's PCIe Gen3 x8 link (link capabilities 2 and status).
    assert!(
        probe.contains("63.008 Gb/s available PCIe bandwidth (8.0 GT/s PCIe x8 link)"),
        "mlx5_core did not see a Gen3 x8 link:\n{}",
        tail(&probe, 40)
    );
    // mlx5_core found the vendor-specific gateway and used it (crdump's
    // probe of the crspace size locks and unlocks it); nothing is left
    // locked.
    let gw = model.vsc_gateway();
    assert!(gw.tickets() > 0, "mlx5_core never took the VSC gateway");
    assert_eq!(gw.semaphore(), 0, "VSC gateway left locked");
    assert!(
        gw.locks().is_empty(),
        "semaphores left held: {:?}",
        gw.locks()
    );
    // Flow steering: the anchor table, and the root it becomes.
    for op in ["CREATE_FLOW_TABLE", "SET_FLOW_TABLE_ROOT"] {
        assert!(
            count.get(op).copied().unwrap_or(0) > 0,
            "mlx5_core made no {op}"
        );
    }

    // Unbinding tore mlx5_core's objects down, firmware's pages came back.
    for (create, destroy) in [
        ("CREATE_EQ", "DESTROY_EQ"),
        ("ALLOC_UAR", "DEALLOC_UAR"),
        ("CREATE_FLOW_TABLE", "DESTROY_FLOW_TABLE"),
        ("CREATE_FLOW_GROUP", "DESTROY_FLOW_GROUP"),
        ("SET_FLOW_TABLE_ENTRY", "DELETE_FLOW_TABLE_ENTRY"),
        ("ALLOC_FLOW_COUNTER", "DEALLOC_FLOW_COUNTER"),
    ] {
        assert_eq!(
            count.get(create),
            count.get(destroy),
            "{create} and {destroy} do not pair up"
        );
    }
    assert_eq!(
        log.last().map(|e| opcode_name(e.opcode)),
        Some("DISABLE_HCA")
    );
    assert_eq!(stats.pages_held, 0, "pages left with firmware");
    assert_eq!(stats.eqs, 0, "EQs left");
    assert_eq!(stats.uars, 0, "UARs left");
    assert_eq!(
        (
            stats.flow_tables,
            stats.flow_groups,
            stats.ftes,
            stats.flow_counters
        ),
        (0, 0, 0, 0),
        "flow objects left"
    );
    assert_eq!(stats.leaked_at_teardown, 0, "objects alive at TEARDOWN_HCA");
    assert_eq!(stats.dma_faults, 0, "DMA faults");

    // Nothing in dmesg from the drivers reports a failure.
    let bad = failures(&dmesg);
    assert!(
        bad.is_empty(),
        "the kernel reported failures:\n{}",
        bad.join("\n")
    );

    // mlx5_ib registered mlx5_0 with a port, GUIDs and a state.
    let ib = read(&out, "ib.txt");
    let ib: BTreeMap<&str, &str> = ib.lines().filter_map(|l| l.split_once('=')).collect();
    assert_eq!(
        read(&out, "ib-devices.txt").trim(),
        "mlx5_0",
        "no IB device; dmesg:\n{}",
        tail(&probe, 60)
    );
    assert_eq!(ib.get("fw_ver").copied(), Some(fw.as_str()));
    for key in ["node_guid", "sys_image_guid"] {
        let guid = ib.get(key).copied().unwrap_or("");
        assert!(
            guid.len() == 19 && guid != "0000:0000:0000:0000",
            "{key} is {guid:?}"
        );
    }
    let state = ib.get("ports/1/state").copied().unwrap_or("");
    assert!(
        state.contains("ACTIVE") || state.contains("DOWN"),
        "port state {state:?}"
    );
    for op in [
        "ALLOC_PD",
        "CREATE_MKEY",
        "CREATE_CQ",
        "CREATE_QP",
        "ALLOC_XRCD",
        "ALLOC_Q_COUNTER",
    ] {
        assert!(
            count.get(op).copied().unwrap_or(0) > 0,
            "mlx5_ib made no {op}"
        );
    }

    // Unbinding tore mlx5_ib's objects down too.
    assert_eq!(read(&out, "ib-devices-after.txt").trim(), "");
    for (create, destroy) in [
        ("ALLOC_PD", "DEALLOC_PD"),
        ("CREATE_MKEY", "DESTROY_MKEY"),
        ("CREATE_CQ", "DESTROY_CQ"),
        ("CREATE_QP", "DESTROY_QP"),
        ("ALLOC_XRCD", "DEALLOC_XRCD"),
        ("ALLOC_Q_COUNTER", "DEALLOC_Q_COUNTER"),
        ("CREATE_XRC_SRQ", "DESTROY_XRC_SRQ"),
        ("CREATE_RMP", "DESTROY_RMP"),
    ] {
        assert_eq!(
            count.get(create),
            count.get(destroy),
            "{create} and {destroy} do not pair up"
        );
    }
    assert_eq!(
        (stats.pds, stats.mkeys, stats.cqs, stats.qps),
        (0, 0, 0, 0),
        "verbs objects left"
    );
    assert_eq!(
        (stats.srqs, stats.xrcds, stats.q_counters),
        (0, 0, 0),
        "SRQs, XRC domains or Q counter sets left"
    );
    assert!(
        log.iter().all(|e| e.delivery == 0 && e.status == 0),
        "a command failed:\n{text}"
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
