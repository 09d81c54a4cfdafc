//! End-to-end: the driver's HCA layer against the device model.

use tests::backend::{Backend, Func};
use verbs::cmd::TraceSink;
use verbs::hca::{Hca, HcaOptions};

/// The backend this suite runs on (`vfio_user_bringup.rs` includes this
/// file and runs it over vfio-user).
#[allow(dead_code)]
const BACKEND: Backend = Backend::InProcess;

fn device() -> Func {
    tests::backend::device(
        crate::BACKEND,
        mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX4Lx),
    )
}

fn opts(event_mode: bool) -> HcaOptions {
    HcaOptions {
        event_mode,
        // The health poller at the kernel's interval (HcaOptions::default):
        // three polls without a tick (6 s) declare the firmware dead, which a
        // loaded machine starving the model's worker for 1.5 s must not.
        ..HcaOptions::default()
    }
}

fn open(f: &Func, o: HcaOptions) -> Hca {
    Hca::open(f.function(), o).unwrap_or_else(|e| panic!("open: {e}"))
}

fn up_and_down(event_mode: bool) {
    let f = device();
    let (sink, text) = TraceSink::memory();
    let hca = open(
        &f,
        HcaOptions {
            trace: Some(sink),
            ..opts(event_mode)
        },
    );
    assert_eq!(hca.cmd().event_mode(), event_mode);
    assert!(hca.caps().gen().log_max_qp() > 0);
    assert!(hca.fw_pages() > 0, "firmware got pages");
    let (c, a) = hca.eqns();
    assert!(c.is_some() && a.is_some());
    hca.nop().unwrap();
    println!("fw {} identity {:?}", hca.fw_version(), hca.identity());
    hca.close().unwrap();
    assert_eq!(f.dma_mappings(), 0);
    assert_eq!(f.bus().irqs.attached(), 0);
    let t = text.lock().unwrap();
    assert!(t.contains("ENABLE_HCA"), "trace has the commands");
    assert!(t.contains("INIT_HCA"));
}

#[test]
fn bring_up_and_teardown_polled() {
    up_and_down(false);
}

#[test]
fn bring_up_and_teardown_event_mode() {
    up_and_down(true);
}

#[test]
fn eight_threads_of_nop() {
    let f = device();
    let hca = open(&f, opts(true));
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..200 {
                    hca.nop().unwrap();
                }
            });
        }
    });
    println!("{:?}", hca.cmd().stats());
    assert!(
        hca.cmd()
            .stats()
            .by_event
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    hca.close().unwrap();
    assert_eq!(f.dma_mappings(), 0);
}

#[test]
fn hundred_open_close_cycles() {
    let f = device();
    for i in 0..100 {
        let hca = open(&f, opts(i % 2 == 0));
        hca.nop().unwrap();
        hca.close().unwrap();
        assert_eq!(f.dma_mappings(), 0, "cycle {i}: DMA mappings left");
        assert_eq!(f.bus().irqs.attached(), 0, "cycle {i}: eventfds left");
        assert_eq!(
            f.model().stats().pages_held,
            0,
            "cycle {i}: pages left with firmware"
        );
    }
}

/// ConnectX-7 closes by fast teardown (nic_interface = disabled): the
/// close ends once the device took it, so the firmware holds no page when
/// it returns and the next open finds the queue geometry (the race an
/// open/close loop of rdma-core's tests found: EOPNOTSUPP at open).
#[test]
fn fifty_open_close_cycles_with_fast_teardown() {
    let f = tests::backend::device(
        crate::BACKEND,
        mlx5_emu::DeviceConfig::for_profile(mlx5_emu::Profile::ConnectX7),
    );
    for i in 0..50 {
        let hca = open(&f, opts(i % 2 == 0));
        hca.nop().unwrap();
        hca.close().unwrap();
        assert_eq!(
            f.model().stats().pages_held,
            0,
            "cycle {i}: the close returned before the firmware let go of its pages"
        );
    }
}

#[test]
fn drop_without_close_cleans_up() {
    let f = device();
    {
        let _hca = open(&f, opts(true));
    }
    assert_eq!(f.dma_mappings(), 0);
    assert_eq!(f.bus().irqs.attached(), 0);
    let hca = open(&f, opts(true));
    hca.close().unwrap();
}

/// What a subscriber wrote, shared with the test.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// A clean open and close, in event mode, logs no warning on the closing
/// thread: the event loop detaches its MSI-X vectors once (a second
/// detach, from its Drop after the explicit stop, is EINVAL from
/// vfio-pci, which the in-process backend answers as the kernel does).
#[test]
fn teardown_warns_of_nothing() {
    use tracing_subscriber::util::SubscriberInitExt;
    let cap = Captured::default();
    let sub = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .with_ansi(false)
        .with_writer(cap.clone())
        .finish();
    let _on_this_thread = sub.set_default();
    let f = device();
    let hca = open(&f, opts(true));
    hca.nop().unwrap();
    hca.close().unwrap();
    assert_eq!(f.bus().irqs.attached(), 0);
    let text = String::from_utf8(cap.0.lock().unwrap().clone()).unwrap();
    assert!(text.is_empty(), "warnings at teardown: {text}");
}
