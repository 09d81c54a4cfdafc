//! `mlx5 health` on firmware stuck initializing (issue 15): the init
//! segment is read without a bring-up, so the health buffer shows even
//! though no command could ever run.

use std::sync::Arc;
use std::time::Duration;

use mlx5_emu::{DeviceConfig, Profile};
use mlx5_hw::health::HealthSyndrome;
use tests::backend::{device, serve, Backend};
use tests::wait::{until, HANG_GUARD};
use verbs::bringup::INITIALIZING_DEADLINE;
use verbs::hca::{Hca, HcaOptions};
use vfio::clock::ManualClock;

/// Firmware on a clock that stands still: `initializing` stays set until
/// the test moves time (it never does past `fw_start`), so the fault is
/// always in place first.
fn stuck(clock: &Arc<ManualClock>) -> DeviceConfig {
    DeviceConfig {
        fw_start: Duration::from_secs(30),
        clock: clock.shared(),
        ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
    }
}

#[test]
fn health_reads_stuck_firmware_without_bringing_it_up() {
    let clock = ManualClock::new();
    let f = device(Backend::InProcess, stuck(&clock));
    f.model().faults().stuck_initializing(true);
    let text = tools::health::report(&*f.function()).unwrap();
    assert!(text.contains("initializing:    yes"), "{text}");
    assert!(text.contains("fw_rev:          14.12.1220"), "{text}");
    assert!(text.contains("verdict:         healthy"), "{text}");
    assert_eq!(f.model().stats().commands, 0, "no command was sent");
    // A bring-up cannot get past it (this is why health must not need one):
    // it times out once its wait for `initializing` has passed.
    let opts = HcaOptions {
        fw_pre_init_timeout: Duration::from_millis(200),
        clock: clock.shared(),
        ..HcaOptions::default()
    };
    let func = f.function();
    let open = std::thread::spawn(move || Hca::open(func, opts).map(|_| ()));
    clock.advance_to_armed(INITIALIZING_DEADLINE, HANG_GUARD);
    assert!(matches!(
        open.join().unwrap(),
        Err(verbs::Error::Timeout { .. })
    ));
}

#[test]
fn health_shows_a_dead_firmware_syndrome_over_vfio_user() {
    let clock = ManualClock::new();
    let (model, _bus, server) = serve(stuck(&clock));
    model.faults().stuck_initializing(true);
    model
        .faults()
        .health_failure(HealthSyndrome::DeadIrisc, 0x12);
    let path = format!("vfio-user:{}", server.path().display());
    let func = tools::dev::Dev::parse(Some(&path)).unwrap().open().unwrap();
    // The model raises the failure on its next pass.
    until("firmware to raise the failure", || model.firmware_failed());
    let text = tools::health::report(&*func).unwrap();
    assert!(text.contains("FATAL"), "{text}");
    assert!(text.contains("synd:            0x"), "{text}");
    assert!(text.contains("initializing:    yes"), "{text}");
}
