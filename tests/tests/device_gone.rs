//! Issue 15: a device that vanishes under traffic (its vfio-user server
//! stops) fails every wait with a named error: a command in flight and
//! every later one, posts (send, RDMA WRITE fast path, `ibv_wr_*` batch,
//! receive, SRQ receive), polls, a waiter on a completion channel, and
//! async-event waiters (`IBV_EVENT_DEVICE_FATAL`). The
//! other function of the cable carries on.

mod verbs_common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mlx5_emu::{DeviceConfig, Fabric, Profile};
use mlx5_hw::opcode::Opcode;
use verbs::cq::WcStatus;
use verbs::device::AsyncEventKind;
use verbs::health::HealthCause;
use verbs::qp::{send_flags, Payload, PostError, QpType, RecvWr, SendOp, SendWr};
use verbs::Error;
use vfio::emulated::{Bus, DeviceModel};
use vfio::user::{Server, VfioUserFunction};
use vfio::PciFunction;

use verbs_common::*;

/// Only a guard against a hang: the waits end on outcomes.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn vanished(e: &Error) -> bool {
    matches!(e, Error::Health(ev) if matches!(ev.cause, HealthCause::Vanished(_)))
}

#[test]
fn a_vanished_device_fails_commands_posts_polls_and_channel_waits() {
    let fabric = Fabric::new();
    let mut servers = Vec::new();
    let mut models = Vec::new();
    let mut funcs: Vec<Arc<dyn PciFunction>> = Vec::new();
    for i in 0..2u64 {
        let bus = Bus::new();
        let mut cfg = DeviceConfig::for_profile(Profile::ConnectX4Lx);
        cfg.mac = mlx5_emu::DEFAULT_MAC + i;
        let dev = Arc::new(mlx5_emu::Device::new(cfg, bus.clone()));
        fabric.attach(&dev);
        models.push(dev.clone());
        let dev: Arc<dyn DeviceModel> = dev;
        let path = tests::backend::socket_path("gone");
        let server = Server::bind(&path, dev, bus).unwrap().spawn().unwrap();
        funcs.push(Arc::new(VfioUserFunction::connect(server.path()).unwrap()));
        servers.push(server);
    }
    let mut p = Pair {
        a: side(open(funcs[0].clone()), 1 << 16, ALL),
        b: side(open(funcs[1].clone()), 1 << 16, ALL),
        fabric,
    };
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(64));
    let srq = p.a.pd.create_srq(16, 1).unwrap();
    let chan = p.a.ctx.create_comp_channel().unwrap();
    let mut ccq = p.a.ctx.create_cq(16, Some(&chan), None).unwrap();
    ccq.req_notify(false).unwrap();

    // Traffic runs: RDMA WRITEs A -> B complete.
    let sge = p.a.mr.sge(0, 64).unwrap();
    let (raddr, rkey) = (p.b.mr.addr(), p.b.mr.rkey());
    for i in 0..8 {
        qa.post_rdma_write(i, &sge, raddr, rkey, send_flags::SIGNALED)
            .unwrap();
    }
    for w in poll_n(&mut p.a.cq, 8) {
        assert_eq!(w.status, WcStatus::Success);
    }

    // A command the device will never complete is in flight, and a thread
    // waits on the completion channel, when the device goes.
    models[0].faults().never_complete(Opcode::Nop.to_raw());
    let posted = || p.a.ctx.hca().cmd().stats().posted.load(Ordering::Relaxed);
    let before = posted();
    let ctx = p.a.ctx.clone();
    let in_flight = std::thread::spawn(move || ctx.hca().nop());
    let waiter = {
        let chan = chan.clone();
        std::thread::spawn(move || chan.get_cq_event(HANG_GUARD))
    };
    tests::wait::until("the NOP's doorbell", || posted() != before);
    drop(servers.remove(0));

    let e = in_flight.join().unwrap().unwrap_err();
    assert!(vanished(&e), "the NOP in flight: {e}");
    assert!(
        e.to_string()
            .contains("device health failure: the function vanished"),
        "{e}"
    );
    let woke = waiter.join().unwrap().unwrap();
    assert_eq!(woke, Some(ccq.cqn()), "the channel's waiter woke");
    let e = ccq.poll(&mut [Default::default(); 4]).unwrap_err();
    assert!(vanished(&e), "poll after the wake-up: {e}");

    // Async-event waiters hear IBV_EVENT_DEVICE_FATAL.
    let fatal = std::iter::from_fn(|| p.a.ctx.get_async_event(HANG_GUARD))
        .find(|e| *e == AsyncEventKind::DeviceFatal);
    assert_eq!(fatal, Some(AsyncEventKind::DeviceFatal));

    // Every later wait fails at once, with the same cause.
    let e = p.a.cq.poll(&mut [Default::default(); 4]).unwrap_err();
    assert!(vanished(&e), "poll: {e}");
    assert!(vanished(&p.a.ctx.alloc_pd().unwrap_err()), "a command");
    assert!(vanished(&p.a.ctx.hca().check_health().unwrap_err()));
    assert_eq!(
        qa.post_rdma_write(9, &sge, raddr, rkey, send_flags::SIGNALED),
        Err(PostError::DeviceFailed)
    );
    let wr = SendWr {
        wr_id: 10,
        op: SendOp::RdmaWrite { raddr, rkey },
        payload: Payload::Sges(std::slice::from_ref(&sge)),
        flags: send_flags::SIGNALED,
        ud: None,
    };
    assert_eq!(qa.post_send(&[wr]), Err((0, PostError::DeviceFailed)));
    let mut b = qa.wr_start();
    b.wr_id(11, send_flags::SIGNALED)
        .rdma_write(rkey, raddr)
        .set_sge(sge);
    assert_eq!(b.complete(), Err(PostError::DeviceFailed));
    let rwr = RecvWr {
        wr_id: 12,
        sg_list: std::slice::from_ref(&sge),
    };
    assert_eq!(qa.post_recv(&[rwr]), Err((0, PostError::DeviceFailed)));
    let rwr = RecvWr {
        wr_id: 13,
        sg_list: std::slice::from_ref(&sge),
    };
    assert_eq!(srq.post_recv(&[rwr]), Err((0, PostError::DeviceFailed)));

    // The other function is untouched.
    p.b.ctx.hca().nop().unwrap();
    assert!(p.b.ctx.hca().health_failure().is_none());
}

/// The same for firmware that dies in place (health syndrome, `fw_ver` of
/// all ones, the counter stopped) rather than vanishing: once the health
/// poller's next poll is due on the clock, posts and polls fail with the
/// health error, not only commands.
#[test]
fn dead_firmware_fails_posts_and_polls_too() {
    use mlx5_hw::health::HealthSyndrome;
    use verbs::hca::HcaOptions;
    use verbs::health::HEALTH_POLL_DEADLINE;
    use vfio::clock::ManualClock;

    let fabric = Fabric::new();
    let mut sides = Vec::new();
    let mut clocks = Vec::new();
    for i in 0..2u64 {
        // Each function and its driver on a clock of their own that stands
        // still: the health poll comes when the test moves it.
        let clock = ManualClock::new();
        let f = fabric.add(DeviceConfig {
            fw_start: Duration::ZERO,
            clock: clock.shared(),
            mac: mlx5_emu::DEFAULT_MAC + i,
            ..DeviceConfig::for_profile(Profile::ConnectX4Lx)
        });
        let opts = HcaOptions {
            clock: clock.shared(),
            ..HcaOptions::default()
        };
        let ctx = verbs::device::Context::open(f, opts).unwrap();
        sides.push(side(ctx, 1 << 16, ALL));
        clocks.push(clock);
    }
    let b = sides.pop().unwrap();
    let a = sides.pop().unwrap();
    let mut p = Pair { fabric, a, b };
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(64));
    let sge = p.a.mr.sge(0, 64).unwrap();
    let (raddr, rkey) = (p.b.mr.addr(), p.b.mr.rkey());
    for i in 0..8 {
        qa.post_rdma_write(i, &sge, raddr, rkey, send_flags::SIGNALED)
            .unwrap();
    }
    poll_n(&mut p.a.cq, 8);

    let model = p.fabric.function(0).unwrap().model().clone();
    model
        .faults()
        .health_failure(HealthSyndrome::DeadIrisc, 0x12);
    tests::wait::until("firmware to raise the failure", || model.firmware_failed());
    // Until the poll, the driver knows nothing; then everything fails.
    assert!(p.a.ctx.hca().health_failure().is_none());
    clocks[0].advance_to_armed(HEALTH_POLL_DEADLINE, HANG_GUARD);
    tests::wait::until("the health poll's verdict", || {
        p.a.ctx.hca().health_failure().is_some()
    });
    let dead = |e: &Error| matches!(e, Error::Health(_));
    assert!(dead(
        &p.a.cq.poll(&mut [Default::default(); 4]).unwrap_err()
    ));
    assert_eq!(
        qa.post_rdma_write(9, &sge, raddr, rkey, send_flags::SIGNALED),
        Err(PostError::DeviceFailed)
    );
    assert!(dead(&p.a.ctx.alloc_pd().unwrap_err()));
    assert!(p.b.ctx.hca().health_failure().is_none());
    p.b.ctx.hca().nop().unwrap();
}
