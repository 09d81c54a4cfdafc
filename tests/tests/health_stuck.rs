//! `mlx5 health` on firmware stuck initializing (issue 15): the init
//! segment is read without a bring-up, so the health buffer shows even
//! though no command could ever run.

use std::time::Duration;

use mlx5_emu::{DeviceConfig, Profile};
use mlx5_hw::health::HealthSyndrome;
use tests::backend::{device, serve, Backend};
use verbs::hca::{Hca, HcaOptions};

fn stuck() -> DeviceConfig {
    DeviceConfig {
        // Long enough that the fault is set before `initializing` clears.
        fw_start: Duration::from_secs(30),
        ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
    }
}

#[test]
fn health_reads_stuck_firmware_without_bringing_it_up() {
    let f = device(Backend::InProcess, stuck());
    f.model().faults().stuck_initializing(true);
    let text = tools::health::report(&*f.function()).unwrap();
    assert!(text.contains("initializing:    yes"), "{text}");
    assert!(text.contains("fw_rev:          14.12.1220"), "{text}");
    assert!(text.contains("verdict:         healthy"), "{text}");
    assert_eq!(f.model().stats().commands, 0, "no command was sent");
    // A bring-up cannot get past it (this is why health must not need one).
    let opts = HcaOptions {
        fw_pre_init_timeout: Duration::from_millis(200),
        ..HcaOptions::default()
    };
    assert!(Hca::open(f.function(), opts).is_err());
}

#[test]
fn health_shows_a_dead_firmware_syndrome_over_vfio_user() {
    let (model, _bus, server) = serve(stuck());
    model.faults().stuck_initializing(true);
    model
        .faults()
        .health_failure(HealthSyndrome::DeadIrisc, 0x12);
    let path = format!("vfio-user:{}", server.path().display());
    let func = tools::dev::Dev::parse(Some(&path)).unwrap().open().unwrap();
    // The model raises the failure on its next pass.
    let start = std::time::Instant::now();
    let text = loop {
        let t = tools::health::report(&*func).unwrap();
        if t.contains("FATAL") || start.elapsed() > Duration::from_secs(20) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(text.contains("FATAL"), "{text}");
    assert!(text.contains("synd:            0x"), "{text}");
    assert!(text.contains("initializing:    yes"), "{text}");
}
