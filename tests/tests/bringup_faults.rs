//! Fault injection, mailbox chains, run-time pages and the bring-up order:
//! the driver's HCA layer against the device model.
//!
//! Every fault must end in a *named* error once the device's advertised
//! timeout has passed, and the driver must then close cleanly (no DMA
//! mappings, no eventfds) so that a fresh `Hca::open` on the same function
//! succeeds.
//!
//! The driver and the model share a `ManualClock`: time moves only when a
//! test moves it, to the deadline the driver is waiting for
//! (`ManualClock::advance_to_armed`), so a timeout fires because the test
//! said so and never because the machine was busy, and nothing times out
//! while the test does not move time. Tests assert what happened (which
//! error, after how much time on that clock), never how long it took.

use std::sync::Arc;
use std::time::Duration;

use mlx5_emu::{CmdLogEntry, DeviceConfig, Profile};
use mlx5_hw::health::HealthSyndrome;
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::{CmdStatus, DeliveryStatus};
use tests::backend::{Backend, Func};
use tests::wait::{until, HANG_GUARD};
use verbs::bringup::INITIALIZING_DEADLINE;
use verbs::cmd::{CMD_DEADLINE, CMD_TIMEOUT_SLACK};
use verbs::hca::{Hca, HcaOptions};
use verbs::health::{HealthCause, HEALTH_POLL_DEADLINE};
use verbs::Error;
use vfio::clock::ManualClock;

/// The backend this suite runs on (`vfio_user_bringup.rs` includes this
/// file and runs it over vfio-user).
#[allow(dead_code)]
const BACKEND: Backend = Backend::InProcess;

/// The command execution timeout the model advertises (iseg 0xff8).
const EXEC_TO_MS: u32 = 250;
/// The health poll interval.
const HEALTH_INTERVAL: Duration = Duration::from_millis(250);
/// How long the driver waits for `initializing` before the queue exists.
const PRE_INIT_TIMEOUT: Duration = Duration::from_millis(300);

/// The function, and the clock its model and driver share.
struct Dev {
    f: Func,
    clock: Arc<ManualClock>,
}

impl std::ops::Deref for Dev {
    type Target = Func;
    fn deref(&self) -> &Func {
        &self.f
    }
}

fn device() -> Dev {
    device_of(Profile::ConnectX4Lx)
}

fn device_of(profile: Profile) -> Dev {
    let clock = ManualClock::new();
    let f = tests::backend::device(
        crate::BACKEND,
        DeviceConfig {
            cmd_exec_timeout_ms: EXEC_TO_MS,
            cmd_init_timeout_ms: 500,
            // Ready at power-on: on a clock that stands still, any delay
            // would hold every bring-up.
            fw_start: Duration::ZERO,
            clock: clock.shared(),
            ..DeviceConfig::for_profile(profile)
        },
    );
    Dev { f, clock }
}

fn opts(f: &Dev, event_mode: bool) -> HcaOptions {
    HcaOptions {
        event_mode,
        health_interval: Some(HEALTH_INTERVAL),
        fw_pre_init_timeout: PRE_INIT_TIMEOUT,
        clock: f.clock.shared(),
        ..HcaOptions::default()
    }
}

fn try_open(f: &Func, o: HcaOptions) -> Result<Hca, Error> {
    Hca::open(f.function(), o)
}

/// Opens on another thread, moves the clock to the deadline named `what`
/// once the driver waits for it, and returns what the open returned.
fn open_past(f: &Dev, o: HcaOptions, what: &str) -> Result<Hca, Error> {
    let func = f.function();
    let t = std::thread::spawn(move || Hca::open(func, o));
    f.clock.advance_to_armed(what, HANG_GUARD);
    t.join().expect("the open panicked")
}

fn open(f: &Func, o: HcaOptions) -> Hca {
    try_open(f, o).unwrap_or_else(|e| panic!("open: {e}"))
}

/// Nothing of the driver is left on the function.
fn assert_clean(f: &Func, what: &str) {
    assert_eq!(f.dma_mappings(), 0, "{what}: DMA mappings left");
    assert_eq!(f.bus().irqs.attached(), 0, "{what}: eventfds left");
}

/// A fresh open (after an FLR if `reset`) works and closes cleanly.
fn reopen_works(f: &Dev, reset: bool, event_mode: bool) {
    f.model().faults().clear();
    if reset {
        f.reset().unwrap();
    }
    let hca = open(f, opts(f, event_mode));
    hca.nop().unwrap();
    hca.close().unwrap();
    assert_clean(f, "after the re-open");
}

const ADAPTER_OUT: usize = mlx5_hw::ifc::query_adapter_out::SIZE_BYTES;

fn exec_to() -> Duration {
    Duration::from_millis(EXEC_TO_MS.into())
}

/// Runs `input` on another thread, moves the clock to its command deadline
/// once the driver waits for it, and returns what the command returned.
fn exec_past_deadline(f: &Dev, hca: &Hca, input: Vec<u8>, out: usize) -> verbs::Result<Vec<u8>> {
    let cmd = hca.cmd().clone();
    let t = std::thread::spawn(move || cmd.exec(&input, out));
    f.clock.advance_to_armed(CMD_DEADLINE, HANG_GUARD);
    t.join().expect("the command panicked")
}

fn raw(op: Opcode, op_mod: u16, len: usize) -> Vec<u8> {
    let mut inb = vec![0u8; len.max(16)];
    inb[..2].copy_from_slice(&op.to_raw().to_be_bytes());
    inb[6..8].copy_from_slice(&op_mod.to_be_bytes());
    inb
}

fn log_since(f: &Func, from: usize) -> Vec<CmdLogEntry> {
    f.model().command_log().split_off(from)
}

// ---------------------------------------------------------------------------
// 1. Faults
// ---------------------------------------------------------------------------

#[test]
fn a_firmware_stuck_initializing_times_out_by_name() {
    let f = device();
    f.model().faults().stuck_initializing(true);
    f.reset().unwrap();
    let e = open_past(&f, opts(&f, false), INITIALIZING_DEADLINE).unwrap_err();
    match &e {
        Error::Timeout { what, after } => {
            assert!(what.contains("initializing"), "{e}");
            // It gave up exactly when its timeout passed on the clock.
            assert_eq!(*after, PRE_INIT_TIMEOUT, "{e}");
        }
        other => panic!("expected a timeout naming initializing, got {other:?}"),
    }
    assert!(e.to_string().contains("initializing"), "{e}");
    assert_eq!(f.model().stats().commands, 0, "no command was sent");
    assert_clean(&f, "failed open");
    // Still stuck: still a timeout, still clean.
    assert!(matches!(
        open_past(&f, opts(&f, true), INITIALIZING_DEADLINE),
        Err(Error::Timeout { .. })
    ));
    assert_clean(&f, "second failed open");
    reopen_works(&f, true, true);
}

fn never_completes(event_mode: bool) {
    let f = device();
    let hca = open(&f, opts(&f, event_mode));
    assert_eq!(
        hca.cmd().geometry().exec_timeout,
        exec_to(),
        "cmd_exec_to read"
    );
    f.model()
        .faults()
        .never_complete(Opcode::QueryAdapter.to_raw());
    let e =
        exec_past_deadline(&f, &hca, raw(Opcode::QueryAdapter, 0, 16), ADAPTER_OUT).unwrap_err();
    match &e {
        Error::Timeout { what, after } => {
            assert!(what.contains("QUERY_ADAPTER"), "{e}");
            // Not before the advertised timeout and the kernel's slack.
            assert_eq!(*after, exec_to() + CMD_TIMEOUT_SLACK, "{e}");
        }
        other => panic!("expected a timeout naming QUERY_ADAPTER, got {other:?}"),
    }
    // The stuck slot is not reused: other commands still work, many times.
    for _ in 0..2 * hca.cmd().slots() {
        hca.nop().unwrap();
    }
    // The same opcode keeps timing out (fault is forever) and is named again.
    let e = exec_past_deadline(&f, &hca, raw(Opcode::QueryAdapter, 0, 16), ADAPTER_OUT);
    assert!(matches!(e, Err(Error::Timeout { what, .. }) if what.contains("QUERY_ADAPTER")));
    hca.nop().unwrap();
    f.model().faults().clear();
    hca.close().unwrap();
    assert_clean(&f, "close after a lost command");
    reopen_works(&f, true, event_mode);
}

#[test]
fn b_never_completing_command_times_out_by_opcode_polled() {
    never_completes(false);
}

#[test]
fn b_never_completing_command_times_out_by_opcode_event() {
    never_completes(true);
}

#[test]
fn c_delivery_error_is_named() {
    for event_mode in [false, true] {
        let f = device();
        let hca = open(&f, opts(&f, event_mode));
        let n = f.model().command_log().len();
        f.model()
            .faults()
            .delivery_error(Opcode::Nop.to_raw(), DeliveryStatus::BadBlockNumber, 1);
        // The clock stands still: the answer is the delivery status, never
        // a timeout.
        let e = hca.nop().unwrap_err();
        match &e {
            Error::Delivery {
                opcode,
                op_mod,
                status,
            } => {
                assert_eq!(*opcode, Opcode::Nop);
                assert_eq!(*op_mod, 0);
                assert_eq!(*status, DeliveryStatus::BadBlockNumber);
            }
            other => panic!("expected a delivery error, got {other:?}"),
        }
        assert_eq!(
            e.to_string(),
            "NOP (0x80d) op_mod 0: delivery failed: bad block number (0x3)"
        );
        let log = log_since(&f, n);
        assert_eq!(log.len(), 1, "{log:?}");
        assert_eq!(log[0].opcode, Opcode::Nop.to_raw());
        assert_eq!(log[0].delivery, DeliveryStatus::BadBlockNumber.to_raw());
        assert_eq!(f.model().stats().delivery_errors, 1);
        // One-shot: the next NOP goes through.
        hca.nop().unwrap();
        hca.close().unwrap();
        assert_clean(&f, "close after a delivery error");
        reopen_works(&f, false, event_mode);
    }
}

#[test]
fn d_command_status_and_syndrome_are_named() {
    let f = device();
    let hca = open(&f, opts(&f, true));
    f.model().faults().command_status(
        Opcode::Nop.to_raw(),
        CmdStatus::BadParameter,
        0x1a2b_3c4d,
        1,
    );
    let e = hca.nop().unwrap_err();
    match &e {
        Error::Cmd {
            opcode,
            op_mod,
            status,
            syndrome,
        } => {
            assert_eq!(*opcode, Opcode::Nop);
            assert_eq!(*op_mod, 0);
            assert_eq!(*status, CmdStatus::BadParameter);
            assert_eq!(*syndrome, 0x1a2b_3c4d);
        }
        other => panic!("expected a command error, got {other:?}"),
    }
    assert_eq!(
        e.to_string(),
        "NOP (0x80d) op_mod 0: bad parameter (0x3), syndrome 0x1a2b3c4d"
    );
    let last = *f.model().command_log().last().unwrap();
    assert_eq!(
        (last.opcode, last.status, last.syndrome),
        (Opcode::Nop.to_raw(), 0x3, 0x1a2b_3c4d)
    );
    hca.nop().unwrap();
    hca.close().unwrap();
    assert_clean(&f, "close after a failing status");
}

#[test]
fn d_failing_status_during_bring_up_unwinds() {
    let f = device();
    f.model().faults().command_status(
        Opcode::InitHca.to_raw(),
        CmdStatus::BadResourceState,
        0x0bad_0001,
        1,
    );
    let e = try_open(&f, opts(&f, true)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Cmd {
                opcode: Opcode::InitHca,
                status: CmdStatus::BadResourceState,
                syndrome: 0x0bad_0001,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "INIT_HCA (0x102) op_mod 0: bad resource state (0x9), syndrome 0xbad0001"
    );
    assert_clean(&f, "failed open");
    println!("{:?}", names(&f.model().command_log()));
    // The unwind gave the pages back and disabled the HCA.
    assert_eq!(f.model().stats().pages_held, 0);
    reopen_works(&f, false, true);
}

fn health_failure(event_mode: bool) {
    let f = device();
    let hca = open(&f, opts(&f, event_mode));
    let rx = hca.subscribe_health();
    hca.nop().unwrap();
    f.model()
        .faults()
        .health_failure(HealthSyndrome::DeadIrisc, 0x12);
    until("firmware to raise the failure", || {
        f.model().firmware_failed()
    });
    // Nothing is reported until the poller's next poll is due.
    assert!(rx.try_recv().is_err(), "reported before a poll");
    // The poller's next poll: one is enough.
    f.clock.advance_to_armed(HEALTH_POLL_DEADLINE, HANG_GUARD);
    let ev = rx.recv_timeout(HANG_GUARD).expect("a health event");
    println!("health event: {ev}");
    assert_eq!(ev.synd, Some(HealthSyndrome::DeadIrisc), "{ev}");
    assert_eq!(ev.ext_synd, 0x12, "{ev}");
    assert!(ev.to_string().contains("irisc not responding"), "{ev}");
    assert!(matches!(
        ev.cause,
        HealthCause::PciDead | HealthCause::Syndrome { .. } | HealthCause::CounterStuck(_)
    ));
    assert_eq!(hca.health_failure().as_ref(), Some(&ev));
    // Every later command fails at once with the event: none reaches
    // firmware (and the clock stands still, so none could time out).
    let sent = f.model().stats().commands;
    for _ in 0..3 {
        match hca.nop() {
            Err(Error::Health(e)) => assert_eq!(e, ev),
            other => panic!("expected a health error, got {other:?}"),
        }
    }
    let e = hca
        .cmd()
        .exec(&raw(Opcode::QueryAdapter, 0, 16), ADAPTER_OUT);
    assert!(matches!(e, Err(Error::Health(_))));
    assert_eq!(
        f.model().stats().commands,
        sent,
        "a command reached firmware"
    );
    f.model().faults().clear();
    let hca = hca.recover().unwrap_or_else(|e| panic!("recover: {e}"));
    assert!(hca.health_failure().is_none());
    hca.nop().unwrap();
    assert!(hca.fw_pages() > 0);
    hca.close().unwrap();
    assert_clean(&f, "close after recovery");
}

#[test]
fn e_health_failure_reported_and_recovered_event() {
    health_failure(true);
}

#[test]
fn e_health_failure_reported_and_recovered_polled() {
    health_failure(false);
}

#[test]
fn f_page_request_storm_loses_nothing() {
    let f = device();
    let hca = open(&f, opts(&f, true));
    let before = f.model().stats().pages_held;
    assert_eq!(before, hca.fw_pages() as u64);
    const STORM: u64 = 600;
    f.model().faults().page_request_storm(STORM as u32);
    until("the storm's pages", || {
        f.model().stats().pages_held == before + STORM && hca.fw_pages() as u64 == before + STORM
    });
    // And nothing more arrives late: a command round trip later (the
    // model's worker has passed its page requests again), still the same.
    hca.nop().unwrap();
    assert_eq!(f.model().stats().pages_held, before + STORM);
    assert_eq!(hca.fw_pages() as u64, before + STORM);
    assert_eq!(f.model().stats().eq_overruns, 0);
    hca.nop().unwrap();
    hca.close().unwrap();
    assert_clean(&f, "close after the storm");
}

// ---------------------------------------------------------------------------
// 2. Mailbox chains
// ---------------------------------------------------------------------------

#[test]
fn mailbox_chains_of_0_1_2_8_and_10_plus_blocks() {
    use mlx5_hw::init::mailbox_blocks as blocks_for;
    let f = device();
    let hca = open(&f, opts(&f, true));
    let cmd = hca.cmd();
    let n0 = f.model().command_log().len();

    // 0 blocks each way: NOP.
    assert_eq!(blocks_for(16), 0);
    cmd.exec(&raw(Opcode::Nop, 0, 16), 16).unwrap();

    // 1 block out: QUERY_ADAPTER.
    assert_eq!(blocks_for(ADAPTER_OUT), 1);
    let out = cmd
        .exec(&raw(Opcode::QueryAdapter, 0, 16), ADAPTER_OUT)
        .unwrap();
    assert_eq!(out.len(), ADAPTER_OUT);
    assert!(
        out[16..].iter().any(|&b| b != 0),
        "adapter data came back through the mailbox"
    );

    // 1 block each way: ACCESS_REG (PAOS read) returns the port asked for.
    let mut paos = [0u8; 16];
    paos[1] = 1;
    let r = hca
        .access_reg(mlx5_hw::init::RegisterId::Paos, 0, &paos, false)
        .unwrap();
    assert_eq!(r[1], 1, "PAOS local_port echoed: {r:?}");

    // 8 blocks out: QUERY_HCA_CAP general current (0x1010 bytes).
    assert_eq!(blocks_for(0x1010), 8);
    let out = cmd.exec(&raw(Opcode::QueryHcaCap, 1, 16), 0x1010).unwrap();
    assert_eq!(&out[16..], &hca.caps().general.current[..]);

    // 10 blocks out: the same page through a longer outbox; the tail is zero.
    let long = 16 + 10 * 512;
    assert_eq!(blocks_for(long), 10);
    let out = cmd.exec(&raw(Opcode::QueryHcaCap, 1, 16), long).unwrap();
    assert_eq!(&out[16..0x1010], &hca.caps().general.current[..]);

    // 12 blocks in: a NOP carrying a long (ignored) input, every block signed.
    let mut big = raw(Opcode::Nop, 0, 16 + 12 * 512 - 7);
    for (i, b) in big.iter_mut().enumerate().skip(16) {
        *b = i as u8;
    }
    assert_eq!(blocks_for(big.len()), 12);
    cmd.exec(&big, 16).unwrap();

    // Runtime pages: 100 pages = 2 blocks of PAS; 600 = 8 blocks (512 per
    // command, the driver's PAGES_PER_CMD) + 2 blocks.
    let held = f.model().stats().pages_held;
    f.model().request_pages(100);
    until("100 pages", || f.model().stats().pages_held == held + 100);
    f.model().request_pages(600);
    until("600 pages", || f.model().stats().pages_held == held + 700);
    until("driver's count", || hca.fw_pages() as u64 == held + 700);

    let log = log_since(&f, n0);
    assert!(
        log.iter().all(|e| e.delivery == 0 && e.status == 0),
        "every command delivered and succeeded: {log:?}"
    );
    let gives = log
        .iter()
        .filter(|e| e.opcode == Opcode::ManagePages.to_raw() && e.op_mod == 1)
        .count();
    assert_eq!(gives, 3, "100 in one command, 600 in two: {log:?}");
    assert_eq!(f.model().stats().delivery_errors, 0);
    assert_eq!(f.model().stats().dma_faults, 0);
    hca.close().unwrap();
    assert_clean(&f, "close");
}

// ---------------------------------------------------------------------------
// 3. Run-time page give and take
// ---------------------------------------------------------------------------

#[test]
fn runtime_pages_give_then_take() {
    for event_mode in [false, true] {
        let f = device();
        let hca = open(&f, opts(&f, event_mode));
        let base = f.model().stats().pages_held;
        assert_eq!(hca.fw_pages() as u64, base);
        f.model().request_pages(300);
        until("give", || {
            f.model().stats().pages_held == base + 300 && hca.fw_pages() as u64 == base + 300
        });
        f.model().request_pages(-120);
        until("take", || {
            f.model().stats().pages_held == base + 180 && hca.fw_pages() as u64 == base + 180
        });
        let n = f.model().command_log().len();
        hca.close().unwrap();
        assert_clean(&f, "close after give/take");
        // Graceful teardown reclaims everything; fast teardown makes
        // firmware drop its pages. Either way firmware holds none.
        assert_eq!(f.model().stats().pages_held, 0);
        println!(
            "teardown: {:?}",
            log_since(&f, n)
                .iter()
                .map(|e| (Opcode::from_raw(e.opcode).name(), e.op_mod))
                .collect::<Vec<_>>()
        );
    }
}

// ---------------------------------------------------------------------------
// 4. Bring-up and teardown order
// ---------------------------------------------------------------------------

fn names(log: &[CmdLogEntry]) -> Vec<(&'static str, u16)> {
    log.iter()
        .map(|e| (Opcode::from_raw(e.opcode).name(), e.op_mod))
        .collect()
}

/// ConnectX-4 (the traced firmware) does not offer `fast_teardown`; ConnectX-5
/// and later do, so the fast branch runs on those.
fn order(event_mode: bool, fast_teardown: bool) {
    order_on(Profile::ConnectX4Lx, event_mode, fast_teardown);
    if fast_teardown {
        order_on(Profile::ConnectX5, event_mode, true);
    }
}

fn order_on(profile: Profile, event_mode: bool, fast_teardown: bool) {
    let f = device_of(profile);
    f.model().clear_command_log();
    let hca = open(
        &f,
        HcaOptions {
            fast_teardown,
            ..opts(&f, event_mode)
        },
    );
    let up = names(&f.model().command_log());
    println!("bring-up (event_mode {event_mode}): {up:?}");
    let ops: Vec<&str> = up.iter().map(|e| e.0).collect();
    // The kernel's order, exactly, up to INIT_HCA.
    let init = ops.iter().position(|&o| o == "INIT_HCA").unwrap();
    let head = &up[..=init];
    let mut i = 0;
    fn expect(head: &[(&str, u16)], i: &mut usize, name: &str, op_mod: Option<u16>) {
        assert!(*i < head.len(), "missing {name}: {head:?}");
        assert_eq!(head[*i].0, name, "at {i}: {head:?}");
        if let Some(m) = op_mod {
            assert_eq!(head[*i].1, m, "{name} op_mod at {i}: {head:?}");
        }
        *i += 1;
    }
    expect(head, &mut i, "ENABLE_HCA", None);
    expect(head, &mut i, "QUERY_ISSI", None);
    expect(head, &mut i, "SET_ISSI", None);
    expect(head, &mut i, "QUERY_PAGES", Some(1));
    expect(head, &mut i, "MANAGE_PAGES", Some(1));
    expect(head, &mut i, "ACCESS_REG", Some(0));
    expect(head, &mut i, "QUERY_HCA_CAP", None);
    while head[i].0 == "QUERY_HCA_CAP" || head[i].0 == "SET_HCA_CAP" {
        i += 1;
    }
    assert!(
        head[..i].iter().any(|e| e.0 == "SET_HCA_CAP"),
        "SET_HCA_CAP sent: {head:?}"
    );
    expect(head, &mut i, "QUERY_PAGES", Some(2));
    while head[i].0 == "MANAGE_PAGES" {
        assert_eq!(head[i].1, 1);
        i += 1;
    }
    expect(head, &mut i, "INIT_HCA", None);
    // After INIT_HCA: caps re-read, the UAR, the command EQ before any
    // command completes by event, the async EQ, identity.
    let tail: Vec<&str> = ops[init + 1..].to_vec();
    let pos = |n: &str| tail.iter().position(|&o| o == n);
    assert!(pos("QUERY_HCA_CAP").is_some(), "{tail:?}");
    let uar = pos("ALLOC_UAR").unwrap();
    let eq = pos("CREATE_EQ").unwrap();
    assert!(uar < eq, "{tail:?}");
    assert_eq!(tail.iter().filter(|&&o| o == "CREATE_EQ").count(), 2);
    assert!(pos("QUERY_ADAPTER").unwrap() > eq, "{tail:?}");
    assert!(up.iter().all(|e| e.0 != "TEARDOWN_HCA"));

    f.model().clear_command_log();
    let fast = fast_teardown && hca.caps().gen().fast_teardown();
    hca.close().unwrap();
    assert_clean(&f, "close");
    let down = names(&f.model().command_log());
    println!("teardown (fast {fast}): {down:?}");
    let ops: Vec<&str> = down.iter().map(|e| e.0).collect();
    assert_eq!(
        &ops[..5],
        &[
            "DESTROY_EQ",
            "DESTROY_EQ",
            "DEALLOC_UAR",
            "DEALLOC_UAR",
            "TEARDOWN_HCA"
        ],
        "{down:?}"
    );
    let td = 4;
    if fast {
        // Fast unload: PREPARE_FAST_TEARDOWN, the nic_interface handshake,
        // and nothing after it (no reclaim, no DISABLE_HCA), as documented
        // in verbs/src/bringup.rs.
        assert_eq!(down[td].1, 0, "{down:?}");
        assert_eq!(ops.len(), td + 1, "nothing after fast teardown: {down:?}");
    } else {
        assert_eq!(ops.last(), Some(&"DISABLE_HCA"), "{down:?}");
        assert!(
            ops[td + 1..ops.len() - 1]
                .iter()
                .zip(&down[td + 1..])
                .all(|(o, e)| *o == "MANAGE_PAGES" && e.1 == 2),
            "only MANAGE_PAGES TAKE between TEARDOWN_HCA and DISABLE_HCA: {down:?}"
        );
        assert!(ops.len() > td + 2, "pages reclaimed: {down:?}");
    }
    // After a fast teardown the driver's wait ends on nic_interface reading
    // "disabled"; in shared BAR memory it can read its own store before the
    // model's worker has acted on it, so the model lets go of its pages a
    // moment later (a limit of polled shared memory, see ARCHITECTURE.md).
    until("firmware to let go of its pages", || {
        f.model().stats().pages_held == 0
    });
    assert_eq!(fast, fast_teardown && profile != Profile::ConnectX4Lx);
    // The function can be opened again at once.
    reopen_works(&f, false, event_mode);
}

#[test]
fn order_polled_fast_teardown() {
    order(false, true);
}

#[test]
fn order_event_fast_teardown() {
    order(true, true);
}

#[test]
fn order_polled_graceful_teardown() {
    order(false, false);
}

#[test]
fn order_event_graceful_teardown() {
    order(true, false);
}
