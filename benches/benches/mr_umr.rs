//! Registration through UMR against CREATE_MKEY (issue 19, point 5), on
//! the in-process device model, 4 KiB, 2 MiB and 1 GiB regions of
//! `DmaBuffer`s (memfd; the 1 GiB ones are never touched: registration
//! builds the translation only, one or two MTT entries of one large page),
//! in one run:
//!
//! - `create_mkey`: `reg_mr_buffer` + `dereg` per registration, no mkey
//!   cache (DMA map, CREATE_MKEY, DESTROY_MKEY, unmap: two firmware
//!   commands);
//! - `umr cache`: the same calls with the mkey cache on
//!   (`Context::enable_mkey_cache`): DMA map, a UMR enabling a kept free
//!   key, a UMR revoking it, unmap: no command;
//! - `umr rereg`: one key made beforehand, each registration a
//!   `Mr::rereg(CHANGE_TRANSLATION)` onto the other of two buffers (DMA
//!   map, one UMR with the MTT inline, unmap of the old memory).
//!
//! Every case includes the DMA mapping; each UMR is posted on the
//! context's REG_UMR QP and its completion polled. Registrations per
//! second are criterion's elements/s. `cargo bench -p benches --bench mr_umr`

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use verbs::device::Context;
use verbs::hca::HcaOptions;
use verbs::mr::access;
use verbs::umr::{rereg_flags, Rereg, ReregMemory};
use vfio::DmaBuffer;

const ACC: u32 = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;

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
    let mut g = c.benchmark_group("mr_umr");
    g.measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(1));
    for (size, len) in [
        ("4 KiB", 4usize << 10),
        ("2 MiB", 2 << 20),
        ("1 GiB", 1 << 30),
    ] {
        let bufs = [
            DmaBuffer::new(len).expect("buffer"),
            DmaBuffer::new(len).expect("buffer"),
        ];
        g.bench_function(format!("create_mkey {size}"), |b| {
            b.iter(|| {
                let mr = pd.reg_mr_buffer(&bufs[0], 0, len, ACC).expect("reg");
                mr.dereg().expect("dereg");
            })
        });
        let cache = ctx.enable_mkey_cache(4).expect("mkey cache");
        g.bench_function(format!("umr cache {size}"), |b| {
            b.iter(|| {
                let mr = pd.reg_mr_buffer(&bufs[0], 0, len, ACC).expect("reg");
                mr.dereg().expect("dereg");
            })
        });
        let counts = cache.counts();
        // One key made, every later registration reusing it (in a test
        // run each case runs once: made, not reused), every one returned.
        assert!(
            counts.created <= 1 && counts.returned == counts.created + counts.reused,
            "{counts:?}"
        );
        drop(cache);
        let mut mr = pd.reg_mr_buffer(&bufs[0], 0, len, ACC).expect("reg");
        let mut i = 0;
        g.bench_function(format!("umr rereg {size}"), |b| {
            b.iter(|| {
                i ^= 1;
                let m = ReregMemory::Buffer {
                    buf: &bufs[i],
                    offset: 0,
                    len,
                };
                let how = mr.rereg(rereg_flags::CHANGE_TRANSLATION, None, Some(m), 0);
                assert_eq!(how.expect("rereg"), Rereg::InPlace);
            })
        });
        mr.dereg().expect("dereg");
    }
    g.finish();
}

criterion_group!(benches, registration);
criterion_main!(benches);
