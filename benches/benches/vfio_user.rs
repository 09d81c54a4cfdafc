//! The device model in-process vs. over vfio-user: a NOP command round trip
//! polled (the driver rings the command doorbell in mapped BAR0 and polls
//! the ownership bit: doorbell to completion, no message on the way), the
//! same completed by event (doorbell to EQE and MSI-X eventfd), and a
//! trapped config-space read (one message round trip over the socket).

use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use verbs::hca::{Hca, HcaOptions};
use vfio::emulated::{Bus, DeviceModel};
use vfio::user::{Server, ServerThread, VfioUserFunction};
use vfio::PciFunction;

fn opts(event_mode: bool) -> HcaOptions {
    HcaOptions {
        event_mode,
        health_interval: None,
        ..HcaOptions::default()
    }
}

fn config() -> mlx5_emu::DeviceConfig {
    mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX4Lx)
}

fn in_process() -> (Arc<dyn PciFunction>, Option<ServerThread>) {
    (Arc::new(mlx5_emu::emulated_with(config())), None)
}

fn over_vfio_user() -> (Arc<dyn PciFunction>, Option<ServerThread>) {
    let bus = Bus::new();
    let dev: Arc<dyn DeviceModel> = Arc::new(mlx5_emu::Device::new(config(), bus.clone()));
    let path = std::env::temp_dir().join(format!("mlx5-bench-{}.sock", std::process::id()));
    let server = Server::bind(&path, dev, bus)
        .and_then(Server::spawn)
        .expect("vfio-user server");
    let f = VfioUserFunction::connect(&path).expect("vfio-user client");
    (Arc::new(f), Some(server))
}

fn compare(c: &mut Criterion) {
    let mut g = c.benchmark_group("vfio-user");
    g.sample_size(30).measurement_time(Duration::from_secs(4));
    type Make = fn() -> (Arc<dyn PciFunction>, Option<ServerThread>);
    let backends: [(&str, Make); 2] = [("in-process", in_process), ("vfio-user", over_vfio_user)];
    for (backend, make) in backends {
        let (func, server) = make();
        for (what, ev) in [
            ("NOP round trip, polled", false),
            ("doorbell to completion event", true),
        ] {
            let hca = Hca::open(func.clone(), opts(ev)).expect("bring-up");
            g.bench_function(format!("{what} ({backend})"), |b| {
                b.iter(|| hca.nop().expect("NOP"))
            });
            hca.close().expect("teardown");
        }
        g.bench_function(format!("trapped config read ({backend})"), |b| {
            let mut v = [0u8; 4];
            b.iter(|| func.config_read(0, &mut v).expect("config read"))
        });
        drop(func);
        drop(server);
    }
    g.finish();
}

criterion_group!(benches, compare);
criterion_main!(benches);
