//! Memory registration (issue 14): `reg_mr_raw` + `dereg` of 4 KiB, 2 MiB
//! and 1 GiB regions of the process's own memory, heap (4 KiB pages)
//! against hugetlb memory of 2 MiB and of 1 GiB pages, on the in-process
//! device model (CREATE_MKEY and DESTROY_MKEY through the command queue,
//! one DMA mapping each way). Before the timings it prints each case's
//! MTT: page size, entries and bytes mapped. Then, to show where the time
//! goes, the page-size look-up alone and a registration with the page size
//! given (`reg_mr_raw_paged`).
//!
//! Huge pages: as root the bench grows the kernel's pools by what it uses
//! (512 pages of 2 MiB, one of 1 GiB) and gives them back at the end; a
//! case whose pages the kernel cannot give says `NOT RUN` and is left out.
//! The heap is an anonymous mapping never touched, as `malloc` of that
//! size gives (the in-process backend maps it without faulting it in;
//! a kernel backend would pin every page).
//!
//! `cargo bench -p benches --bench mr_reg`

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::access;
use verbs::pd::Pd;
use vfio::dma::HugePage;
use vfio::DmaBuffer;

const K4: usize = 4 << 10;
const M2: usize = 2 << 20;
const G1: usize = 1 << 30;

/// Pages added to a kernel pool, given back on drop (root only).
struct Pool {
    file: String,
    added: u64,
}

impl Pool {
    fn grow(page_kib: u64, n: u64) -> Self {
        let file = format!("/sys/kernel/mm/hugepages/hugepages-{page_kib}kB/nr_hugepages");
        let read =
            |f: &str| -> Option<u64> { std::fs::read_to_string(f).ok()?.trim().parse().ok() };
        let mut added = 0;
        if let Some(total) = read(&file) {
            if std::fs::write(&file, (total + n).to_string()).is_ok() {
                added = read(&file).unwrap_or(total).saturating_sub(total);
            }
        }
        Self { file, added }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let total: Option<u64> = std::fs::read_to_string(&self.file)
            .ok()
            .and_then(|s| s.trim().parse().ok());
        if let Some(t) = total.filter(|_| self.added > 0) {
            let _ = std::fs::write(&self.file, t.saturating_sub(self.added).to_string());
        }
    }
}

/// 1 GiB + 4 KiB of anonymous memory (4 KiB pages), 4 KiB aligned.
struct Heap(*mut u8);

impl Heap {
    fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping; nothing else uses it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                G1 + K4,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap 1 GiB of heap");
        Self(p.cast())
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no MR left over it.
        unsafe { libc::munmap(self.0.cast(), G1 + K4) };
    }
}

fn reg_dereg(pd: &Pd, at: *mut u8, len: usize) {
    const ALL: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    // SAFETY: the memory (the heap mapping or a huge-page buffer) outlives
    // every MR of the bench and is not touched while registered.
    let mr = unsafe { pd.reg_mr_raw(at, len, ALL) }.expect("reg_mr_raw");
    mr.dereg().expect("dereg");
}

fn registration(c: &mut Criterion) {
    let ctx = Context::open(
        Arc::new(mlx5_emu::emulated(mlx5_emu::Profile::ConnectX4Lx)),
        HcaOptions {
            health_interval: None,
            ..HcaOptions::default()
        },
    )
    .expect("open");
    let pd = ctx.alloc_pd().expect("pd");
    let _pools = (Pool::grow(2048, 512), Pool::grow(1 << 20, 1));
    let heap = Heap::new();
    let huge = |page: HugePage, size: usize| {
        DmaBuffer::with_huge_page(G1, page)
            .ok()
            .filter(|b| b.page_size() == size)
    };
    let h2m = huge(HugePage::Size2M, M2);
    let h1g = huge(HugePage::Size1G, G1);
    let mut memories: Vec<(&str, *mut u8)> = vec![("heap 4 KiB pages", heap.0)];
    for (name, b) in [("hugetlb 2 MiB pages", &h2m), ("hugetlb 1 GiB pages", &h1g)] {
        match b {
            Some(b) => memories.push((name, b.host_addr() as *mut u8)),
            None => println!("mr_reg {name}: NOT RUN (the kernel gave no such pages)"),
        }
    }
    let mut g = c.benchmark_group("mr_reg");
    g.measurement_time(Duration::from_secs(4));
    for (mem, at) in &memories {
        for (size, len) in [("4 KiB", K4), ("2 MiB", M2), ("1 GiB", G1)] {
            // SAFETY: as in `reg_dereg`.
            let mr = unsafe { pd.reg_mr_raw(*at, len, access::LOCAL_WRITE) }.expect("reg");
            println!(
                "mr_reg {mem}, {size}: MTT page 2^{} B, {} entries, {} KiB mapped in 1 DMA mapping",
                mr.log_page_size(),
                mr.mtt_entries(),
                mr.mapped_len() >> 10
            );
            mr.dereg().expect("dereg");
            g.bench_function(format!("reg+dereg {size} ({mem})"), |b| {
                b.iter(|| reg_dereg(&pd, *at, len))
            });
        }
    }
    // Where the time goes: the page-size look-up alone, and the
    // registration with the page size given (no look-up).
    for (mem, at) in &memories {
        g.bench_function(format!("page-size look-up 4 KiB ({mem})"), |b| {
            b.iter(|| verbs::vma::page_size_of(*at as u64, K4 as u64).expect("look-up"))
        });
    }
    g.bench_function("reg+dereg 4 KiB, page size given (heap 4 KiB pages)", |b| {
        b.iter(|| {
            // SAFETY: as in `reg_dereg`; the heap has 4 KiB pages.
            let mr = unsafe { pd.reg_mr_raw_paged(heap.0, K4, access::LOCAL_WRITE, K4 as u64) };
            mr.expect("reg").dereg().expect("dereg");
        })
    });
    g.finish();
    drop((h2m, h1g));
}

criterion_group!(benches, registration);
criterion_main!(benches);
