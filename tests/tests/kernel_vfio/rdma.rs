//! The RDMA boots of `kernel_vfio` (issue 14): two functions of the device
//! model served here over vfio-user, a guest with an emulated Intel IOMMU
//! booting this test's initramfs, our driver owning both functions through
//! the guest kernel's VFIO (`rdma-group`: Debian's 6.12, type1; `rdma-cdev`:
//! the IOMMUFD 6.12, iommufd), and `reg_mr_raw` of heap, anonymous mmap,
//! memfd, `MFD_HUGETLB` and hugetlbfs memory carrying RDMA WRITE, READ and
//! SEND between them, with the refusals by name (`tests::usermem_rdma`).
//!
//! QEMU 7.2 (Debian 12's) has no vfio-user client: QEMU runs from the
//! trixie root of `scripts/qemu-guest/build.sh` (its QEMU 10) through
//! `scripts/qemu-guest/run.sh`, booting our kernel and initramfs instead of
//! that guest's. Without that root the checks are skipped, said why
//! (a failure with `MLX5_QEMU_MLX5_REQUIRED=1`, which test-all sets when it
//! built the root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use mlx5_emu::{Device, DeviceConfig, Fabric, Profile};
use vfio::emulated::{Bus, DeviceModel};
use vfio::user::Server;

use super::{repo, run_script, Prepared, Tally};

/// Every check an RDMA guest reports, in order.
pub const RDMA_CHECKS: &[&str] = &[
    "both_functions_open",
    "reg_mr_raw_heap_rdma",
    "reg_mr_raw_anonymous_mmap_rdma",
    "reg_mr_raw_memfd_rdma",
    "reg_mr_raw_memfd_hugetlb_2m_rdma",
    "reg_mr_raw_hugetlbfs_file_rdma",
    "user_mappings_gone_after_dereg",
    "memfd_and_hugetlb_by_map_file_or_by_address",
    "reg_mr_raw_unmapped_and_read_only_refused",
    "reg_mr_raw_memlock_named",
    "reg_mr_raw_mapping_limit_named",
    "mappings_gone_at_close",
];

/// Type1's mapping-count limit in the RDMA guests: room for two functions'
/// bring-up, small enough that the limit check reaches it in seconds.
const DMA_ENTRY_LIMIT: u32 = 256;

/// The trixie root whose QEMU has vfio-user-pci, if it is cached.
fn trixie_root() -> Result<PathBuf, String> {
    let out = run_script(&["scripts/qemu-guest/build.sh", "--path"])?;
    let dir = PathBuf::from(out.trim());
    if dir.join("initrd.gz").is_file() && dir.join("root/usr/bin/qemu-system-x86_64").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "no trixie guest root at {} (its QEMU is the vfio-user client; build it with \
             scripts/qemu-guest/build.sh, as root, ~7 min)",
            dir.display()
        ))
    }
}

/// Skips (or, required, fails) every check of `path`.
pub fn not_run(t: &mut Tally, path: &str, why: &str) {
    let required = std::env::var("MLX5_QEMU_MLX5_REQUIRED").is_ok_and(|v| v == "1");
    for c in RDMA_CHECKS {
        let name = format!("{path}/{c}");
        if required {
            t.fail(&name, why);
        } else {
            t.skip(&name, &format!("NOT RUN: {why}"));
        }
    }
}

/// Serves two cabled model functions on `dir/cx.sock` and `cx.sock.1` and
/// boots `kernel` with the initramfs for `path` (`rdma-group`, `rdma-cdev`)
/// through run.sh; returns the console.
fn boot_served(dir: &Path, kernel: &Path, initrd: &Path, path: &str) -> Result<String, String> {
    let fabric = Fabric::new();
    let mut servers = Vec::new();
    for i in 0..2u32 {
        let sock = dir.join(if i == 0 {
            "cx.sock".into()
        } else {
            format!("cx.sock.{i}")
        });
        let _ = std::fs::remove_file(&sock);
        let bus = Bus::new();
        let mut cfg = DeviceConfig::for_profile(Profile::ConnectX4Lx);
        cfg.mac = mlx5_emu::DEFAULT_MAC + u64::from(i);
        let dev = Arc::new(Device::new(cfg, bus.clone()));
        fabric.attach(&dev);
        let dev: Arc<dyn DeviceModel> = dev;
        let server =
            Server::bind(&sock, dev, bus).map_err(|e| format!("{}: {e}", sock.display()))?;
        servers.push(server.spawn().map_err(|e| e.to_string())?);
    }
    let append = format!(
        "no_timer_check MLX5_PATH={path} MLX5_DMA_ENTRY_LIMIT={DMA_ENTRY_LIMIT} \
         vfio_iommu_type1.dma_entry_limit={DMA_ENTRY_LIMIT}"
    );
    let status = Command::new("bash")
        .arg(repo().join("scripts/qemu-guest/run.sh"))
        .arg("-")
        .arg(dir)
        .env("MLX5_EMU", "served")
        .env("MLX5_QEMU_TIMEOUT", "1200")
        .env("MLX5_QEMU_IOMMU", "1")
        .env("MLX5_QEMU_KERNEL", kernel)
        .env("MLX5_QEMU_INITRD", initrd)
        .env("MLX5_QEMU_APPEND", append)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("running run.sh: {e}"))?;
    drop(servers);
    drop(fabric);
    std::fs::read_to_string(dir.join("console.log"))
        .map_err(|e| format!("no console log (run.sh {status}): {e}"))
}

/// One RDMA boot: `path` is `rdma-group` or `rdma-cdev`.
pub fn boot(t: &mut Tally, p: &Prepared, path: &str, kernel: &Path, modules: Option<&Path>) {
    let fail_all = |t: &mut Tally, why: &str| {
        for c in RDMA_CHECKS {
            t.fail(&format!("{path}/{c}"), why);
        }
    };
    if let Err(why) = trixie_root() {
        not_run(t, path, &why);
        return;
    }
    let dir = p.work.join(path);
    let _ = std::fs::create_dir_all(&dir);
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
        fail_all(t, &e);
        return;
    }
    println!(
        "kernel_vfio: booting {} for the {path} path (log: {})",
        kernel.display(),
        dir.join("console.log").display()
    );
    let begin = Instant::now();
    let mut console = match boot_served(&dir, kernel, &initrd, path) {
        Ok(c) => c,
        Err(e) => {
            fail_all(t, &e);
            return;
        }
    };
    if super::died_before_the_guest(&console) {
        // The kernel died booting, before anything of ours ran: boot once
        // more (what it printed stays in the first console log).
        let first = dir.join("console-first.log");
        let _ = std::fs::write(&first, &console);
        println!(
            "kernel_vfio: {path}: the guest kernel died before the guest binary ran ({}); booting again",
            first.display()
        );
        console = match boot_served(&dir, kernel, &initrd, path) {
            Ok(c) => c,
            Err(e) => {
                fail_all(t, &e);
                return;
            }
        };
    }
    println!(
        "kernel_vfio: {path} guest ran {:.1}s",
        begin.elapsed().as_secs_f64()
    );
    let lines: Vec<&str> = console.lines().map(|l| l.trim_end_matches('\r')).collect();
    for l in lines.iter().filter(|l| l.starts_with("kvfio:")) {
        println!("  {l}");
    }
    let tail = lines[lines.len().saturating_sub(6)..].join(" | ");
    for c in RDMA_CHECKS {
        let prefix = format!("kvfio: check {path}/{c}: ");
        let name = format!("{path}/{c}");
        match lines.iter().find_map(|l| l.strip_prefix(&prefix)) {
            Some("ok") => t.ok(&name),
            Some(s) if s.starts_with("skipped: ") => t.skip(&name, &s["skipped: ".len()..]),
            Some(s) => t.fail(&name, s),
            None => t.fail(
                &name,
                &format!("not reported; the guest's last lines: {tail}"),
            ),
        }
    }
}
