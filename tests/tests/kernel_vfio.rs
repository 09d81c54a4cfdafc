//! The `vfio` crate's kernel backend against the real Linux VFIO stack.
//!
//! No machine here has a passthrough NIC, so this boots a QEMU guest (TCG)
//! with an emulated Intel IOMMU and QEMU's `edu` device, and runs
//! `kernel-vfio-guest` (a static binary of this crate) in it: open edu by PCI
//! address, BAR0, DMA both ways with completion MSIs, an unmapped IOVA
//! blocked by the IOMMU, the limits, resets, the driver's bring-up, close
//! and reopen, unplug.
//!
//! - group path: Debian's own 6.12 kernel (`scripts/guest-debian-kernel.sh`);
//! - cdev path: a 6.12 built with IOMMUFD (`scripts/guest-kernel-iommufd.sh`),
//!   when it is cached; otherwise the output says it is skipped and why;
//! - no-IOMMU mode: that kernel again (Debian's lacks VFIO_NOIOMMU), no
//!   IOMMU in the machine, `vfio.enable_unsafe_noiommu_mode=1`.
//!
//! The function-interface contract the driver relies on
//! (`tests::function_contract`) runs here against the device model and in
//! the guest against the kernel backend, so both are held to the same checks.
//!
//! Needs qemu-system-x86, busybox-static, cpio, kmod and xz-utils
//! (`bash scripts/test-all.sh` installs them as root on Debian). Without
//! them the guest checks are reported skipped, unless
//! `MLX5_KERNEL_VFIO_REQUIRED=1`, which makes that a failure.
//!
//! Its own `main` (no libtest): every check is printed by name.

#[path = "kernel_vfio/rdma.rs"]
mod rdma;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Every check the guest reports, in its order.
const GUEST_CHECKS: &[&str] = &[
    "discovery_errors",
    "open_by_address",
    "region_info",
    "iova_ranges",
    "contract_bar0_maps_whole_from_offset_0",
    "contract_config_region_is_config_space",
    "contract_command_register_enables",
    "contract_dma_map_unmap_exact",
    "contract_dma_refusals",
    "contract_backend_holds_mapped_buffers",
    "contract_irq_attach_detach",
    "bar0_id_and_liveness",
    "dma_both_ways_with_msi",
    "dma_to_unmapped_iova_blocked",
    "hugetlb_dma_buffer",
    "dma_map_host_heap",
    "dma_map_host_anonymous_mmap",
    "dma_map_host_memfd",
    "dma_map_host_memfd_hugetlb_2m",
    "dma_map_host_memlock_named",
    "intx_without_msi",
    "mapping_count_limit_named",
    "memlock_limit_named",
    "function_reset",
    "hot_reset",
    "driver_bringup_runs_unchanged",
    "close_and_reopen",
    "device_request_on_unplug",
];

/// The no-IOMMU guest's checks (no IOMMU in the machine; Debian's kernel).
const NOIOMMU_CHECKS: &[&str] = &[
    "refused_unless_asked",
    "open_when_asked",
    "dma_with_physical_addresses",
];

/// How long one guest may run (host time) before it is killed and its
/// missing checks fail. TCG boots in seconds; this covers a loaded host.
const GUEST_DEADLINE: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Tally {
    fn ok(&mut self, name: &str) {
        println!("test {name} ... ok");
        self.passed += 1;
    }
    fn fail(&mut self, name: &str, why: &str) {
        println!("test {name} ... FAILED: {why}");
        self.failed += 1;
    }
    fn skip(&mut self, name: &str, why: &str) {
        println!("test {name} ... skipped: {why}");
        self.skipped += 1;
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

fn main() {
    let start = Instant::now();
    let mut t = Tally::default();
    let required = std::env::var("MLX5_KERNEL_VFIO_REQUIRED").is_ok_and(|v| v == "1");

    // The contract on the device model, through the same checks the guest
    // runs on the kernel backend.
    let emu = mlx5_emu::emulated(mlx5_emu::Profile::ConnectX4Lx);
    for (name, r) in tests::function_contract::check(&emu) {
        match r {
            Ok(()) => t.ok(&format!("emu/{name}")),
            Err(e) => t.fail(&format!("emu/{name}"), &e),
        }
    }
    drop(emu);

    match prepare() {
        Err(why) => {
            let why = format!(
                "{why} (bash scripts/test-all.sh installs what it needs as root on Debian)"
            );
            for (path, checks) in [
                ("group", GUEST_CHECKS),
                ("noiommu", NOIOMMU_CHECKS),
                ("cdev", GUEST_CHECKS),
            ] {
                for c in checks {
                    if required {
                        t.fail(&format!("{path}/{c}"), &why);
                    } else {
                        t.skip(&format!("{path}/{c}"), &why);
                    }
                }
            }
            rdma::not_run(&mut t, "rdma-group", &why);
            rdma::not_run(&mut t, "rdma-cdev", &why);
        }
        Ok(p) => {
            if asked(&mut t, "group", GUEST_CHECKS) {
                boot(&mut t, &p, "group", &p.debian_kernel, Some(&p.modules));
            }
            if asked(&mut t, "rdma-group", rdma::RDMA_CHECKS) {
                rdma::boot(&mut t, &p, "rdma-group", &p.debian_kernel, Some(&p.modules));
            }
            let iommufd = cached_iommufd_kernel();
            match iommufd {
                Some(k) => {
                    if asked(&mut t, "cdev", GUEST_CHECKS) {
                        boot(&mut t, &p, "cdev", &k, None);
                    }
                    if asked(&mut t, "noiommu", NOIOMMU_CHECKS) {
                        boot(&mut t, &p, "noiommu", &k, None);
                    }
                    if asked(&mut t, "rdma-cdev", rdma::RDMA_CHECKS) {
                        rdma::boot(&mut t, &p, "rdma-cdev", &k, None);
                    }
                }
                None => {
                    let why = format!(
                        "no IOMMUFD guest kernel cached at {} (Debian's 6.12 has IOMMUFD and \
                         VFIO_NOIOMMU off; build it with `bash scripts/guest-kernel-iommufd.sh`, \
                         ~15 min on 2 cores)",
                        iommufd_kernel_path().display()
                    );
                    for c in GUEST_CHECKS {
                        t.skip(&format!("cdev/{c}"), &why);
                    }
                    for c in NOIOMMU_CHECKS {
                        t.skip(&format!("noiommu/{c}"), &why);
                    }
                    for c in rdma::RDMA_CHECKS {
                        t.skip(&format!("rdma-cdev/{c}"), &why);
                    }
                }
            }
        }
    }

    println!();
    println!(
        "test result: {}. {} passed; {} failed; {} ignored; 0 measured; 0 filtered out; finished in {:.2}s",
        if t.failed == 0 { "ok" } else { "FAILED" },
        t.passed,
        t.failed,
        t.skipped,
        start.elapsed().as_secs_f64()
    );
    if t.failed > 0 {
        std::process::exit(1);
    }
}

/// Whether the run boots `path`: all of them, unless
/// `MLX5_KERNEL_VFIO_PATHS` (comma-separated: group, rdma-group, cdev,
/// noiommu, rdma-cdev) names others; a path left out has every check
/// reported skipped, never passed.
fn asked(t: &mut Tally, path: &str, checks: &[&str]) -> bool {
    let Ok(only) = std::env::var("MLX5_KERNEL_VFIO_PATHS") else {
        return true;
    };
    if only.split(',').any(|p| p.trim() == path) {
        return true;
    }
    for c in checks {
        t.skip(
            &format!("{path}/{c}"),
            &format!("not booted: MLX5_KERNEL_VFIO_PATHS={only}"),
        );
    }
    false
}

struct Prepared {
    qemu: PathBuf,
    debian_kernel: PathBuf,
    modules: PathBuf,
    guest_bin: PathBuf,
    work: PathBuf,
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn run_script(args: &[&str]) -> Result<String, String> {
    let out = Command::new("bash")
        .args(args)
        .current_dir(repo())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("bash {}: {e}", args[0]))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", args.join(" "), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn iommufd_kernel_path() -> PathBuf {
    run_script(&["scripts/guest-kernel-iommufd.sh", "--path"])
        .map(|s| PathBuf::from(s.trim()))
        .unwrap_or_else(|_| PathBuf::from("(cache)/iommufd-kernel/bzImage"))
}

fn cached_iommufd_kernel() -> Option<PathBuf> {
    let p = iommufd_kernel_path();
    p.is_file().then_some(p)
}

fn prepare() -> Result<Prepared, String> {
    let qemu = which("qemu-system-x86_64").ok_or("qemu-system-x86_64 is not installed")?;
    for tool in ["busybox", "cpio", "depmod", "xz", "apt-get", "dpkg"] {
        which(tool).ok_or(format!("{tool} is not installed"))?;
    }
    let out = run_script(&["scripts/guest-debian-kernel.sh"])?;
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(PathBuf::from)
            .ok_or(format!("guest-debian-kernel.sh printed no {k}="))
    };
    let debian_kernel = field("kernel")?;
    let modules = field("modules")?;
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernel-vfio");
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let guest_bin = build_guest(&work)?;
    Ok(Prepared {
        qemu,
        debian_kernel,
        modules,
        guest_bin,
        work,
    })
}

/// Builds `kernel-vfio-guest` static for the gnu target, in its own target
/// directory (the outer `cargo test` holds the workspace's).
fn build_guest(work: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = "x86_64-unknown-linux-gnu";
    let dir = work.join("target");
    let status = Command::new(cargo)
        .args(["build", "-q", "-p", "tests", "--bin", "kernel-vfio-guest"])
        .args(["--target", target])
        .env("CARGO_TARGET_DIR", &dir)
        .env(
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
            "-C target-feature=+crt-static",
        )
        .current_dir(repo())
        .status()
        .map_err(|e| format!("cargo build of the guest binary: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of the guest binary failed ({status})"));
    }
    Ok(dir.join(target).join("debug").join("kernel-vfio-guest"))
}

/// Whether a guest's console shows its kernel died (an oops or a panic)
/// before the guest binary printed anything: under TCG a boot sometimes
/// dies in the kernel's own code (seen: an `int3` oops in
/// `sched_clock_idle_wakeup_event` while the kernel patched its text, in
/// the idle loop), which says nothing of what the boot was to test.
fn died_before_the_guest(console: &str) -> bool {
    let ours = console
        .lines()
        .any(|l| l.trim_start().starts_with("kvfio:"));
    !ours && (console.contains("Kernel panic") || console.contains("Oops:"))
}

/// Boots `kernel` with the guest binary for `path` (group, cdev or
/// noiommu) and tallies the checks it reports.
fn boot(t: &mut Tally, p: &Prepared, path: &str, kernel: &Path, modules: Option<&Path>) {
    let checks = if path == "noiommu" {
        NOIOMMU_CHECKS
    } else {
        GUEST_CHECKS
    };
    let initrd = p.work.join(format!("initramfs-{path}.cpio.gz"));
    let mut args = vec![
        "scripts/guest-initramfs.sh".to_string(),
        initrd.display().to_string(),
        p.guest_bin.display().to_string(),
    ];
    if let Some(m) = modules {
        args.push(m.display().to_string());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Err(e) = run_script(&refs) {
        for c in checks {
            t.fail(&format!("{path}/{c}"), &e);
        }
        return;
    }
    let log_path = p.work.join(format!("guest-{path}.log"));
    println!(
        "kernel_vfio: booting {} for the {path} path (log: {})",
        kernel.display(),
        log_path.display()
    );
    // no_timer_check: under TCG on a loaded host the IO-APIC timer check
    // can miss its ticks and panic ("timer doesn't work through
    // Interrupt-remapped IO-APIC"); the guest's timer is fine.
    let append = format!(
        "console=ttyS0 intel_iommu=on iommu=pt panic=-1 loglevel=4 no_timer_check \
         vfio_iommu_type1.dma_entry_limit=64 vfio.enable_unsafe_noiommu_mode={} MLX5_PATH={path}",
        u8::from(path == "noiommu")
    );
    let mut qemu = Command::new(&p.qemu);
    qemu.args(["-machine", "q35,kernel-irqchip=split", "-accel", "tcg"])
        .args(["-smp", "1", "-nodefaults", "-no-reboot"])
        .args(["-display", "none", "-serial", "stdio", "-monitor", "none"]);
    if path == "noiommu" {
        // No IOMMU at all; 256 MiB keeps every physical address inside
        // edu's 28-bit DMA mask.
        qemu.args(["-m", "256"]);
    } else {
        qemu.args(["-m", "512"])
            .args(["-device", "intel-iommu,intremap=on,caching-mode=on"]);
    }
    let child = qemu
        .args(["-device", "pcie-root-port,id=rp0,chassis=1,slot=1"])
        .args(["-device", "edu,bus=rp0"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", &append])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            for c in checks {
                t.fail(&format!("{path}/{c}"), &format!("starting QEMU: {e}"));
            }
            return;
        }
    };
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let tx2 = tx.clone();
    let readers = [
        std::thread::spawn(move || {
            if let Some(s) = stdout {
                for l in BufReader::new(s).lines().map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            }
        }),
        std::thread::spawn(move || {
            if let Some(s) = stderr {
                for l in BufReader::new(s).lines().map_while(Result::ok) {
                    let _ = tx2.send(format!("qemu: {l}"));
                }
            }
        }),
    ];
    let begin = Instant::now();
    let mut log = Vec::new();
    let mut timed_out = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(l) => {
                let l = l.trim_end_matches('\r').to_string();
                if l.starts_with("kvfio:") || l.starts_with("qemu:") {
                    println!("  {l}");
                }
                log.push(l);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if begin.elapsed() > GUEST_DEADLINE {
                    timed_out = true;
                    let _ = child.kill();
                }
            }
        }
    }
    let _ = child.wait();
    for r in readers {
        let _ = r.join();
    }
    let _ = std::fs::write(&log_path, log.join("\n"));
    println!(
        "kernel_vfio: {path} guest ran {:.1}s",
        begin.elapsed().as_secs_f64()
    );
    let mut tail = Some({
        let from = log.len().saturating_sub(6);
        log[from..].join(" | ")
    });
    for c in checks {
        let prefix = format!("kvfio: check {path}/{c}: ");
        let name = format!("{path}/{c}");
        match log.iter().find_map(|l| l.strip_prefix(&prefix)) {
            Some("ok") => t.ok(&name),
            Some(s) if s.starts_with("skipped: ") => t.skip(&name, &s["skipped: ".len()..]),
            Some(s) => t.fail(&name, s),
            None if timed_out => t.fail(&name, &format!("guest killed after {GUEST_DEADLINE:?}")),
            None => match tail.take() {
                Some(tail) => t.fail(
                    &name,
                    &format!("not reported; the guest's last lines: {tail}"),
                ),
                None => t.fail(&name, "not reported"),
            },
        }
    }
}
