//! The device model's IOVA space (`vfio::IovaMemory`, issue 13) against
//! vm-memory's `GuestMemoryMmap` it replaced, in one run:
//!
//! - lookup: a 64-byte `read_slice` at a mapped IOVA (what the model's data
//!   path does per WQE, buffer and CQE), with 4, 32 and 4096 regions;
//! - map: one more 4 KiB region in a space of 4096 (what a vfio-user
//!   DMA_MAP from a guest behind a vIOMMU costs the server thread).
//!
//! Run with `cargo bench -p benches --bench dma_space`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use vfio::IovaMemory;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

const STRIDE: u64 = 0x10_0000;

fn regions(n: u64) -> Vec<Arc<GuestRegionMmap>> {
    (0..n)
        .map(|i| {
            let r = MmapRegion::new(8192).expect("anonymous mapping");
            Arc::new(GuestRegionMmap::new(r, GuestAddress(STRIDE * (i + 1))).expect("region"))
        })
        .collect()
}

fn lookups(c: &mut Criterion) {
    for n in [4u64, 32, 4096] {
        let regs = regions(n);
        let flat = GuestMemoryMmap::from_arc_regions(regs.clone()).expect("collection");
        let chunked = regs
            .iter()
            .fold(IovaMemory::default(), |m, r| m.with(r.clone()));
        let mut buf = [0u8; 64];
        let mut k = 0u64;
        let mut at = move || {
            k = k.wrapping_add(7);
            GuestAddress(STRIDE * (k % n + 1) + 64)
        };
        c.bench_function(
            &format!("dma_space/read 64 B, {n} regions/GuestMemoryMmap"),
            |b| b.iter(|| flat.read_slice(&mut buf, black_box(at())).expect("mapped")),
        );
        c.bench_function(
            &format!("dma_space/read 64 B, {n} regions/IovaMemory"),
            |b| {
                b.iter(|| {
                    chunked
                        .read_slice(&mut buf, black_box(at()))
                        .expect("mapped")
                })
            },
        );
    }
}

fn maps(c: &mut Criterion) {
    let regs = regions(4096);
    let extra = regions(4097).pop().expect("one more");
    let flat = GuestMemoryMmap::from_arc_regions(regs.clone()).expect("collection");
    let chunked = regs
        .iter()
        .fold(IovaMemory::default(), |m, r| m.with(r.clone()));
    c.bench_function("dma_space/map one more of 4096/GuestMemoryMmap", |b| {
        b.iter(|| black_box(flat.insert_region(extra.clone()).expect("free")))
    });
    c.bench_function("dma_space/map one more of 4096/IovaMemory", |b| {
        b.iter(|| black_box(chunked.with(extra.clone())))
    });
}

criterion_group!(benches, lookups, maps);
criterion_main!(benches);
