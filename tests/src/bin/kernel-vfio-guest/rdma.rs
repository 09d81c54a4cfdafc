//! `kernel-vfio-guest rdma group|cdev ADDR0 ADDR1`: two mlx5 functions
//! through this kernel's VFIO, `reg_mr_raw` of the program's own memory
//! carrying RDMA between them (`tests::usermem_rdma`).

use std::sync::Arc;
use std::time::Instant;

use tests::usermem_rdma::{self, Kind};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use vfio::kernel::{Interface, KernelFunction, OpenOptions, PciAddress};
use vfio::PciFunction;

use super::Report;

/// Where the guest's init mounts a hugetlbfs of 2 MiB pages.
const HUGETLBFS: &str = "/dev/hugepages";

pub fn main(args: &[String]) {
    let (interface, path) = match args.first().map(String::as_str) {
        Some("cdev") => (Interface::Cdev, "rdma-cdev"),
        _ => (Interface::Group, "rdma-group"),
    };
    let mut rep = Report { path, failed: 0 };
    let addrs: Vec<PciAddress> = match args[1..].iter().map(|a| a.parse()).collect() {
        Ok(a) => a,
        Err(e) => {
            println!("kvfio: {e}");
            std::process::exit(2);
        }
    };
    run(&mut rep, &addrs, interface);
    println!("kvfio: done ({} failed)", rep.failed);
}

fn open(addr: PciAddress, interface: Interface) -> Result<(Arc<KernelFunction>, Context), String> {
    let opts = OpenOptions {
        interface,
        ..Default::default()
    };
    let f = Arc::new(KernelFunction::open(addr, &opts).map_err(|e| format!("{addr}: {e}"))?);
    let t = Instant::now();
    let ctx = Context::open(f.clone(), HcaOptions::default())
        .map_err(|e| format!("{addr}: open: {e}"))?;
    println!(
        "kvfio: {addr} up through {:?} in {:.1}s, {} DMA mappings",
        f.interface(),
        t.elapsed().as_secs_f64(),
        f.dma_mappings()
    );
    Ok((f, ctx))
}

/// On iommufd, file-backed memory (the queues' memfds, the user's memfd
/// and hugetlb pools) went by `IOMMU_IOAS_MAP_FILE` where the kernel has
/// it (6.13 on) and by address, after one ENOTTY, where it does not.
fn map_file(f: &KernelFunction) -> Result<(), String> {
    let Some((by_file, by_addr, enotty)) = f.map_file_stats() else {
        return Err("no iommufd statistics on a cdev function".into());
    };
    let uname = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "kvfio:   kernel {}: {by_file} file-backed mappings by IOMMU_IOAS_MAP_FILE, {by_addr} by \
         IOMMU_IOAS_MAP after {}",
        uname.trim(),
        if enotty { "ENOTTY" } else { "no refusal" }
    );
    let mut v = uname
        .trim()
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let has = (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (6, 13);
    match (has, by_file, enotty) {
        (true, 1.., false) => Ok(()),
        (false, 0, true) if by_addr > 0 => Ok(()),
        _ => Err(format!(
            "kernel {} (MAP_FILE expected: {has}): {by_file} by file, {by_addr} by address, \
             ENOTTY {enotty}",
            uname.trim()
        )),
    }
}

fn run(rep: &mut Report, addrs: &[PciAddress], interface: Interface) {
    let [a0, a1] = addrs else {
        rep.record(
            "both_functions_open",
            Err(format!("two addresses, not {addrs:?}")),
        );
        return;
    };
    let opened = open(*a0, interface).and_then(|x| Ok((x, open(*a1, interface)?)));
    let ((f0, c0), (f1, c1)) = match opened {
        Ok(x) => x,
        Err(e) => {
            rep.record("both_functions_open", Err(e));
            return;
        }
    };
    rep.record("both_functions_open", Ok(()));
    let ctx = [c0, c1];
    let before = [f0.dma_mappings(), f1.dma_mappings()];
    for kind in Kind::ALL {
        let t = Instant::now();
        let r = usermem_rdma::traffic(kind, &ctx, HUGETLBFS);
        println!("kvfio:   {} {:.1}s", kind.name(), t.elapsed().as_secs_f64());
        rep.record(kind.name(), r);
    }
    let after = [f0.dma_mappings(), f1.dma_mappings()];
    if interface == Interface::Cdev {
        rep.record("memfd_and_hugetlb_by_map_file_or_by_address", map_file(&f0));
    } else {
        rep.skip(
            "memfd_and_hugetlb_by_map_file_or_by_address",
            "type1 maps by address only (VFIO_IOMMU_MAP_DMA)",
        );
    }
    rep.record(
        "user_mappings_gone_after_dereg",
        if before == after {
            Ok(())
        } else {
            Err(format!("DMA mappings {before:?} before, {after:?} after"))
        },
    );
    rep.record(
        "reg_mr_raw_unmapped_and_read_only_refused",
        usermem_rdma::refuses_unmapped_and_read_only(&ctx[0]),
    );
    rep.record(
        "reg_mr_raw_memlock_named",
        usermem_rdma::refuses_past_memlock(&ctx[0]),
    );
    match f0.dma_mappings_left() {
        Ok(Some(left)) if left <= 4096 => rep.record(
            "reg_mr_raw_mapping_limit_named",
            usermem_rdma::refuses_past_mapping_limit(&ctx[0], left),
        ),
        Ok(Some(left)) => rep.skip(
            "reg_mr_raw_mapping_limit_named",
            &format!("{left} mappings left: boot with a smaller vfio_iommu_type1.dma_entry_limit"),
        ),
        Ok(None) => rep.skip(
            "reg_mr_raw_mapping_limit_named",
            "iommufd has no mapping-count limit (type1's dma_entry_limit)",
        ),
        Err(e) => rep.record("reg_mr_raw_mapping_limit_named", Err(e.to_string())),
    }
    drop(ctx);
    rep.record(
        "mappings_gone_at_close",
        if f0.dma_mappings() == 0 && f1.dma_mappings() == 0 {
            Ok(())
        } else {
            Err(format!(
                "{} and {} DMA mappings left after close",
                f0.dma_mappings(),
                f1.dma_mappings()
            ))
        },
    );
}
