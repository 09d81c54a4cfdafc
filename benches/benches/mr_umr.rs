//! Registration through UMR against CREATE_MKEY (issue 19, point 3), on
//! the in-process device model, 4 KiB and 2 MiB regions of `DmaBuffer`s:
//!
//! - `create_mkey`: `reg_mr_buffer` + `dereg` per registration (DMA map,
//!   CREATE_MKEY, DESTROY_MKEY, unmap: two firmware commands);
//! - `umr`: one key made beforehand, each registration a
//!   `Mr::rereg(CHANGE_TRANSLATION)` onto the other of two buffers (DMA
//!   map, one UMR WQE on the context's REG_UMR QP with the MTT inline,
//!   its completion polled, unmap of the old memory: no command).
//!
//! Both include the DMA mapping, so the difference is the firmware
//! command pair against the UMR round trip. Registrations per second are
//! 1 / the time criterion prints. `cargo bench -p benches --bench mr_umr`

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
    for (size, len) in [("4 KiB", 4usize << 10), ("2 MiB", 2 << 20)] {
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
        let mut mr = pd.reg_mr_buffer(&bufs[0], 0, len, ACC).expect("reg");
        let mut i = 0;
        g.bench_function(format!("umr {size}"), |b| {
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
