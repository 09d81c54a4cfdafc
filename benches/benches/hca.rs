//! Bring-up (open to ready, and the teardown after it) and a command round
//! trip (NOP), polled and in event mode, against the in-process device model.

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use verbs::hca::{Hca, HcaOptions};
use vfio::PciFunction;

fn opts(event_mode: bool) -> HcaOptions {
    HcaOptions {
        event_mode,
        health_interval: None,
        ..HcaOptions::default()
    }
}

fn function() -> Arc<dyn PciFunction> {
    Arc::new(mlx5_emu::emulated(mlx5_emu::Profile::ConnectX4Lx))
}

fn bringup(c: &mut Criterion) {
    let mut g = c.benchmark_group("hca");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    for (name, ev) in [("polled", false), ("event", true)] {
        // One function, opened and closed again and again, as a process
        // restarting its data plane would.
        let func = function();
        g.bench_function(format!("bring-up open-to-ready ({name})"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let t = std::time::Instant::now();
                    let hca = Hca::open(func.clone(), opts(ev)).expect("bring-up");
                    total += t.elapsed();
                    hca.close().expect("teardown");
                }
                total
            })
        });
    }
    for (name, ev) in [("polled", false), ("event", true)] {
        let hca = Hca::open(function(), opts(ev)).expect("bring-up");
        g.bench_function(format!("NOP round trip ({name})"), |b| {
            b.iter(|| hca.nop().expect("NOP"))
        });
        hca.close().expect("teardown");
    }
    g.finish();
}

criterion_group!(benches, bringup);
criterion_main!(benches);
