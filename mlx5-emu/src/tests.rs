//! Tests of the whole function, driven the way a driver drives it: config
//! space, the mapped BAR, DMA buffers mapped at IOVAs, eventfds.
//!
//! Where time matters (start-up delay, the HCA clock, retry timers) the
//! model runs on a `ManualClock` the test moves. Otherwise a test waits for
//! the worker thread to do something with [`until`], whose limit is only a
//! hang guard, and checks that something did *not* happen after
//! [`settle`] (whole worker passes), never after a sleep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vfio::clock::ManualClock;

use mlx5_hw::health::HealthSyndrome;
use mlx5_hw::ifc::cmd_hca_cap;
use mlx5_hw::status::{CmdStatus, DeliveryStatus};
use vfio::emulated::EmulatedFunction;

mod devx;
mod dp;
mod eth;
mod flow;
mod ib;
mod memic_ops;
mod raw_eth;
mod sizes;
use vfio::{DmaBuffer, Iova, IrqKind, PciFunction};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::initseg::{self, rd, wr};
use crate::{cap_type, emulated_with, Device, DeviceConfig, HcaState, Profile};

const CMDQ_IOVA: u64 = 0x10_0000;
const IN_IOVA: u64 = 0x20_0000;
const OUT_IOVA: u64 = 0x40_0000;
const PAGES_IOVA: u64 = 0x1000_0000;
const EQ_IOVA: u64 = 0x80_0000;
const MBOX: usize = 0x20_0000;

struct Drv {
    f: Arc<EmulatedFunction<Device>>,
    cmdq: Arc<DmaBuffer>,
    inb: Arc<DmaBuffer>,
    outb: Arc<DmaBuffer>,
    token: u8,
    next_page: u64,
    pages: Vec<Arc<DmaBuffer>>,
}

fn bar(d: &Drv) -> &DmaBuffer {
    d.f.model().bar0()
}

/// How long a test waits for the worker before calling it a hang.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(180);

/// Looks at `cond` until it holds; panics naming `what` after
/// [`HANG_GUARD`] (a hang, never a measurement).
pub(crate) fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = Instant::now() + HANG_GUARD;
    let mut looks = 0u32;
    while !cond() {
        assert!(
            Instant::now() < give_up,
            "{what}: not within {HANG_GUARD:?}"
        );
        looks += 1;
        if looks < 1000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Returns once the worker has made a whole pass after this call.
pub(crate) fn settle(dev: &Device) {
    let n = dev.worker_passes();
    until("a worker pass", || dev.worker_passes() >= n + 2);
}

impl Drv {
    fn new() -> Self {
        Self::with(DeviceConfig::default())
    }

    fn with(cfg: DeviceConfig) -> Self {
        Self::on(Arc::new(emulated_with(cfg)))
    }

    /// A function on a clock the test moves, ready at power-on.
    fn manual() -> (Self, Arc<ManualClock>) {
        let clock = ManualClock::new();
        let d = Self::with(DeviceConfig {
            fw_start: Duration::ZERO,
            clock: clock.shared(),
            ..DeviceConfig::default()
        });
        (d, clock)
    }

    fn on(f: Arc<EmulatedFunction<Device>>) -> Self {
        let cmdq = DmaBuffer::new(4096).unwrap();
        let inb = DmaBuffer::new(MBOX).unwrap();
        let outb = DmaBuffer::new(MBOX).unwrap();
        f.dma_map(Iova(CMDQ_IOVA), &cmdq).unwrap();
        f.dma_map(Iova(IN_IOVA), &inb).unwrap();
        f.dma_map(Iova(OUT_IOVA), &outb).unwrap();
        Self {
            f,
            cmdq,
            inb,
            outb,
            token: 0,
            next_page: PAGES_IOVA,
            pages: vec![],
        }
    }

    fn wait_ready(&self) {
        until("initializing to clear", || {
            rd(bar(self), initseg::INITIALIZING) & initseg::INITIALIZING_BIT == 0
        });
    }

    /// Bus master on, cmdq address written, firmware ready.
    fn open(&mut self) {
        self.f.config_write(4, &0x0006u16.to_le_bytes()).unwrap();
        self.wait_ready();
        wr(bar(self), initseg::CMDQ_ADDR_H, 0);
        wr(bar(self), initseg::CMDQ_ADDR_L_SZ, CMDQ_IOVA as u32);
    }

    /// Posts a command on `slot`; returns (delivery status, output message).
    fn post(
        &mut self,
        slot: u8,
        input: &[u8],
        outlen: usize,
        tweak: impl FnOnce(&mut [u8; 64]),
    ) -> (u8, Vec<u8>) {
        self.token = self.token.wrapping_add(1).max(1);
        let token = self.token;
        let nin = input.len().saturating_sub(16).div_ceil(512);
        let nout = outlen.saturating_sub(16).div_ceil(512);
        for (buf, iova, n, data) in [
            (&self.inb, IN_IOVA, nin, Some(input)),
            (&self.outb, OUT_IOVA, nout, None),
        ] {
            for i in 0..n {
                let off = i * 1024;
                let mut b = [0u8; 576];
                if let Some(d) = data {
                    let from = 16 + i * 512;
                    let k = (d.len() - from).min(512);
                    b[..k].copy_from_slice(&d[from..from + k]);
                }
                let next = if i + 1 < n {
                    iova + (off as u64) + 1024
                } else {
                    0
                };
                b[0x230..0x238].copy_from_slice(&next.to_be_bytes());
                b[0x238..0x23c].copy_from_slice(&(i as u32).to_be_bytes());
                b[0x23d] = token;
                buf.write(off, &b).unwrap();
            }
        }
        let mut e = [0u8; 64];
        e[0] = 7;
        e[4..8].copy_from_slice(&(input.len() as u32).to_be_bytes());
        if nin > 0 {
            e[8..16].copy_from_slice(&IN_IOVA.to_be_bytes());
        }
        let k = input.len().min(16);
        e[0x10..0x10 + k].copy_from_slice(&input[..k]);
        if nout > 0 {
            e[0x30..0x38].copy_from_slice(&OUT_IOVA.to_be_bytes());
        }
        e[0x38..0x3c].copy_from_slice(&(outlen as u32).to_be_bytes());
        e[0x3c] = token;
        tweak(&mut e);
        e[0x3f] = 1;
        let at = usize::from(slot) * 64;
        write_entry(&self.cmdq, at, &e);
        wr(bar(self), initseg::CMD_DBELL, 1 << slot);
        until("the command to complete", || {
            self.cmdq.load_u8_acquire(at + 0x3f).unwrap() & 1 == 0
        });
        let mut ent = [0u8; 64];
        self.cmdq.read(at, &mut ent).unwrap();
        let mut out = ent[0x20..0x30].to_vec();
        for i in 0..nout {
            let mut d = [0u8; 512];
            self.outb.read(i * 1024, &mut d).unwrap();
            out.extend_from_slice(&d);
        }
        out.truncate(outlen);
        (ent[0x3f] >> 1, out)
    }

    fn exec(&mut self, input: &[u8], outlen: usize) -> Vec<u8> {
        let (d, out) = self.post(0, input, outlen, |_| {});
        assert_eq!(d, 0, "delivery status");
        out
    }

    fn ok(&mut self, input: &[u8], outlen: usize) -> Vec<u8> {
        let out = self.exec(input, outlen);
        assert_eq!(
            out[0],
            0,
            "status of {:#x}: syndrome {:#x}",
            be16(input, 0),
            be32(&out, 4)
        );
        out
    }

    fn give_pages(&mut self, n: usize) -> Vec<u8> {
        let buf = DmaBuffer::new(n * 4096).unwrap();
        let base = self.next_page;
        self.f.dma_map(Iova(base), &buf).unwrap();
        self.next_page += (n as u64 * 4096).next_multiple_of(1 << 20);
        self.pages.push(buf);
        let mut inp = cmd_in(0x108, 1, 16 + n * 8);
        inp[12..16].copy_from_slice(&(n as u32).to_be_bytes());
        for i in 0..n {
            let at = 16 + i * 8;
            inp[at..at + 8].copy_from_slice(&(base + i as u64 * 4096).to_be_bytes());
        }
        self.exec(&inp, 16)
    }

    fn query_pages(&mut self, op_mod: u16) -> u32 {
        be32(&self.ok(&cmd_in(0x107, op_mod, 16), 16), 12)
    }

    /// The kernel's bring-up up to INIT_HCA.
    fn bring_up(&mut self) {
        self.bring_up_as(|_| {});
    }

    /// [`Drv::bring_up`], with `before_init` run after the pages are
    /// given and before INIT_HCA (where a driver sets caps).
    fn bring_up_as(&mut self, before_init: impl FnOnce(&mut Self)) {
        self.open();
        self.ok(&cmd_in(0x104, 0, 16), 16);
        let issi = self.ok(&cmd_in(0x10a, 0, 16), 0x70);
        assert_eq!(be32(&issi, 0x6c), 2);
        let mut set = cmd_in(0x10b, 0, 16);
        set[10..12].copy_from_slice(&1u16.to_be_bytes());
        self.ok(&set, 16);
        let profile = self.f.model().config().profile;
        let boot = self.query_pages(1);
        assert_eq!(boot, profile.boot_pages());
        let out = self.give_pages(boot as usize);
        assert_eq!(
            out[0],
            0,
            "boot pages: syndrome {:#x}, log {:x?}",
            be32(&out, 4),
            self.f.model().command_log()
        );
        let init = self.query_pages(2);
        assert_eq!(init, profile.init_pages());
        let out = self.give_pages(init as usize);
        assert_eq!(
            out[0],
            0,
            "init pages: syndrome {:#x}, log {:x?}",
            be32(&out, 4),
            self.f.model().command_log()
        );
        before_init(self);
        self.ok(&cmd_in(0x102, 0, 16), 16);
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn cmd_in(opcode: u16, op_mod: u16, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(16)];
    v[0..2].copy_from_slice(&opcode.to_be_bytes());
    v[6..8].copy_from_slice(&op_mod.to_be_bytes());
    v
}

#[test]
fn initializing_clears_after_fw_start_and_counter_moves() {
    const FW_START: Duration = Duration::from_millis(20);
    let clock = ManualClock::new();
    let d = Drv::with(DeviceConfig {
        fw_start: FW_START,
        clock: clock.shared(),
        ..DeviceConfig::default()
    });
    let initializing = || rd(bar(&d), initseg::INITIALIZING) & initseg::INITIALIZING_BIT != 0;
    assert!(initializing(), "set at power-on");
    // A whole worker pass 1 µs before fw_start: still initializing.
    clock.advance(FW_START - Duration::from_micros(1));
    settle(d.f.model());
    assert!(initializing(), "ready before fw_start passed");
    // At fw_start: ready.
    clock.advance(Duration::from_micros(1));
    d.wait_ready();
    // The health counter beats while firmware lives (on real time: it says
    // the worker runs).
    let c0 = rd(bar(&d), initseg::HEALTH_COUNTER);
    until("the health counter to move", || {
        rd(bar(&d), initseg::HEALTH_COUNTER) != c0
    });
    assert_eq!(rd(bar(&d), initseg::FW_REV), 12 << 16 | 14);
}

#[test]
fn nop_round_trip_and_bad_opcode() {
    let mut d = Drv::new();
    d.open();
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    // Unknown opcode: bad operation with a syndrome.
    let out = d.exec(&cmd_in(0x7ff, 0, 16), 16);
    assert_eq!(out[0], CmdStatus::BadOperation.to_raw());
    assert_ne!(be32(&out, 4), 0);
    // Commands before ENABLE_HCA: bad system state.
    let out = d.exec(&cmd_in(0x100, 1, 16), 0x1010);
    assert_eq!(out[0], CmdStatus::BadSystemState.to_raw());
    let log = d.f.model().command_log();
    assert_eq!(log.len(), 3);
    assert_eq!(log[1].opcode, 0x7ff);
    assert_eq!(log[1].status, 2);
    // Many NOPs in a row (how fast is the benches' business).
    for _ in 0..100 {
        d.ok(&cmd_in(0x80d, 0, 16), 16);
    }
    assert_eq!(d.f.model().command_log().len(), 103);
}

#[test]
fn delivery_status_errors() {
    let mut d = Drv::new();
    d.open();
    let nop = cmd_in(0x80d, 0, 16);
    assert_eq!(
        d.post(0, &nop, 16, |e| e[0] = 3).0,
        DeliveryStatus::BadDescriptor.to_raw()
    );
    assert_eq!(
        d.post(0, &nop, 16, |e| e[4..8]
            .copy_from_slice(&4u32.to_be_bytes()))
            .0,
        7
    );
    // A long input whose in_ptr is not 1 KiB aligned.
    let big = cmd_in(0x80d, 0, 600);
    assert_eq!(
        d.post(0, &big, 16, |e| e[8..16]
            .copy_from_slice(&(IN_IOVA + 8).to_be_bytes()))
            .0,
        DeliveryStatus::InPtrAlignment.to_raw()
    );
    assert_eq!(
        d.post(0, &nop, 600, |e| e[0x30..0x38]
            .copy_from_slice(&(OUT_IOVA + 0x40).to_be_bytes()))
            .0,
        DeliveryStatus::OutPtrAlignment.to_raw()
    );
    // Token mismatch between entry and mailbox.
    assert_eq!(
        d.post(0, &big, 16, |e| e[0x3c] ^= 0x55).0,
        DeliveryStatus::TokenError.to_raw()
    );
    // A chain that ends too early.
    assert_eq!(
        d.post(0, &big, 16, |e| e[8..16].fill(0)).0,
        DeliveryStatus::InputLength.to_raw()
    );
    // Still alive.
    d.ok(&nop, 16);
    assert_eq!(d.f.model().stats().delivery_errors, 6);
}

#[test]
fn bring_up_caps_and_teardown() {
    let mut d = Drv::new();
    d.open();
    d.ok(&cmd_in(0x104, 0, 16), 16);
    // INIT_HCA before the pages: bad system state.
    let out = d.exec(&cmd_in(0x102, 0, 16), 16);
    assert_eq!(out[0], CmdStatus::BadSystemState.to_raw());
    // SET_ISSI 5: unsupported.
    let mut set = cmd_in(0x10b, 0, 16);
    set[10..12].copy_from_slice(&5u16.to_be_bytes());
    assert_eq!(d.exec(&set, 16)[0], CmdStatus::BadParameter.to_raw());
    assert_eq!(d.give_pages(6)[0], 0);
    // An unmapped page is a bad parameter.
    let mut mp = cmd_in(0x108, 1, 24);
    mp[12..16].copy_from_slice(&1u32.to_be_bytes());
    mp[16..24].copy_from_slice(&0x7000_0000u64.to_be_bytes());
    assert_eq!(d.exec(&mp, 16)[0], CmdStatus::BadParameter.to_raw());
    // Caps: current and max as the trace has them.
    let cur = d.ok(&cmd_in(0x100, 1, 16), 0x1010);
    let max = d.ok(&cmd_in(0x100, 0, 16), 0x1010);
    assert_eq!(cmd_hca_cap::LOG_MAX_QP.get(&cur[16..]), 0xe);
    assert_eq!(cmd_hca_cap::LOG_MAX_QP.get(&max[16..]), 0x17);
    // SET beyond max: refused; within: taken.
    let mut s = cmd_in(0x109, 0, 0x1010);
    s[16..].copy_from_slice(&cur[16..]);
    cmd_hca_cap::LOG_MAX_QP.set(&mut s[16..], 0x18);
    assert_eq!(d.exec(&s, 16)[0], CmdStatus::BadParameter.to_raw());
    cmd_hca_cap::LOG_MAX_QP.set(&mut s[16..], 0x11);
    d.ok(&s, 16);
    let cur = d.ok(&cmd_in(0x100, 1, 16), 0x1010);
    assert_eq!(cmd_hca_cap::LOG_MAX_QP.get(&cur[16..]), 0x11);
    // Unknown cap type.
    assert_eq!(
        d.exec(&cmd_in(0x100, 0x55 << 1, 16), 0x1010)[0],
        CmdStatus::BadParameter.to_raw()
    );
    let init = d.query_pages(2);
    assert_eq!(d.give_pages(init as usize)[0], 0);
    d.ok(&cmd_in(0x102, 0, 16), 16);
    // SET after INIT: bad system state.
    assert_eq!(d.exec(&s, 16)[0], CmdStatus::BadSystemState.to_raw());
    let st = d.f.model().stats();
    assert_eq!(st.hca_state, HcaState::Initialized);
    assert_eq!(st.pages_held, 6 + 0x3244);
    // TAKE before teardown returns nothing firmware needs.
    let mut take = cmd_in(0x108, 2, 16);
    take[12..16].copy_from_slice(&10u32.to_be_bytes());
    let out = d.ok(&take, 16 + 80);
    assert_eq!(be32(&out, 8), 0);
    // Graceful teardown, reclaim all, disable.
    d.ok(&cmd_in(0x103, 0, 16), 16);
    let n = 6 + 0x3244u32;
    take[12..16].copy_from_slice(&n.to_be_bytes());
    let out = d.ok(&take, 16 + n as usize * 8);
    assert_eq!(be32(&out, 8), n);
    d.ok(&cmd_in(0x105, 0, 16), 16);
    let st = d.f.model().stats();
    assert_eq!((st.pages_held, st.hca_state), (0, HcaState::Disabled));
}

fn create_eq(d: &mut Drv, uar: u32, log_size: u8, mask: u64, vector: u16) -> u8 {
    let ring = DmaBuffer::new(64 << log_size).unwrap();
    // Owner bits start at 1.
    for i in 0..(1usize << log_size) {
        ring.write(i * 64 + 0x3f, &[1]).unwrap();
    }
    let iova = EQ_IOVA + u64::from(d.next_page as u32 & 0xff) * 0x10_0000;
    d.next_page += 1;
    d.f.dma_map(Iova(iova), &ring).unwrap();
    let npas = (64usize << log_size).div_ceil(4096);
    let mut inp = cmd_in(0x301, 0, 0x110 + npas * 8);
    let ctx = &mut inp[0x10..0x50];
    mlx5_hw::ifc::eqc::LOG_EQ_SIZE.set(ctx, u64::from(log_size));
    mlx5_hw::ifc::eqc::UAR_PAGE.set(ctx, u64::from(uar));
    mlx5_hw::ifc::eqc::INTR.set(ctx, u64::from(vector));
    inp[0x58..0x60].copy_from_slice(&mask.to_be_bytes());
    for i in 0..npas {
        let at = 0x110 + i * 8;
        inp[at..at + 8].copy_from_slice(&(iova + i as u64 * 4096).to_be_bytes());
    }
    d.pages.push(ring);
    let out = d.ok(&inp, 16);
    out[11]
}

/// Waits for an interrupt on `fd` (panics after the hang guard).
fn wait_irq(fd: &EventFd) -> bool {
    until("an interrupt", || fd.read().is_ok());
    true
}

#[test]
fn trapped_eq_rearm_with_the_same_consumer_index_fires() {
    // Linux's mlx5_core re-arms an EQ with an unchanged consumer index when
    // an interrupt finds nothing new; through trapped writes (UML's
    // virtio_pcidev) that repeat of the register's value must still arm.
    let mut d = Drv::new();
    d.bring_up();
    let fd = EventFd::new(EFD_NONBLOCK).unwrap();
    d.f.set_irqs(IrqKind::MsiX, 0, &[Some(&fd)]).unwrap();
    d.f.config_write(0x9e, &0x8000u16.to_le_bytes()).unwrap();
    let uar = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    let eqn = create_eq(&mut d, uar, 2, 1 << 0x0a, 0);
    let arm = |d: &Drv| {
        let v = u32::from(eqn) << 24;
        d.f.region_write(0, (u64::from(uar) << 12) + 0x40, &v.to_be_bytes())
            .unwrap();
    };
    arm(&d);
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    assert!(wait_irq(&fd), "the first EQE fires the armed EQ");
    // The same arm again, EQE 0 still unconsumed: fires at once.
    arm(&d);
    assert!(
        wait_irq(&fd),
        "a re-arm with the same ci while EQEs wait fires"
    );
}

#[test]
fn eq_events_ownership_and_doorbells() {
    let mut d = Drv::new();
    d.bring_up();
    let fd = EventFd::new(EFD_NONBLOCK).unwrap();
    d.f.set_irqs(IrqKind::MsiX, 0, &[Some(&fd)]).unwrap();
    // MSI-X enable.
    d.f.config_write(0x9e, &0x8000u16.to_le_bytes()).unwrap();
    let uar = be32(&d.ok(&cmd_in(0x802, 0, 16), 16), 8);
    assert_eq!(uar, 16);
    // Bad UAR: bad resource.
    let mut bad = cmd_in(0x301, 0, 0x118);
    mlx5_hw::ifc::eqc::UAR_PAGE.set(&mut bad[0x10..0x50], 99);
    mlx5_hw::ifc::eqc::LOG_EQ_SIZE.set(&mut bad[0x10..0x50], 2);
    assert_eq!(d.exec(&bad, 16)[0], CmdStatus::BadResource.to_raw());
    let eqn = create_eq(&mut d, uar, 2, 1 << 0x0a | 1 << 0x0b, 0);
    assert_eq!(eqn, 0x10);
    let ring = d.pages.last().unwrap().clone();
    // The CREATE_EQ itself posts nothing to the new EQ; not armed yet.
    assert_eq!(ring.read_u32_be(0).unwrap(), 0);
    let db = |d: &Drv, off: usize, ci: u32| {
        wr(
            bar(d),
            ((uar as usize) << 12) + off,
            ci & 0xff_ffff | u32::from(eqn) << 24,
        )
    };
    db(&d, 0x40, 0);
    // A NOP completes through the EQ: owner 0 on the first pass, slot 0 bit.
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    assert!(wait_irq(&fd));
    assert_eq!(ring.load_u8_acquire(0x3f).unwrap() & 1, 0);
    let mut e = [0u8; 64];
    ring.read(0, &mut e).unwrap();
    assert_eq!(e[1], 0x0a);
    assert_eq!(be32(&e, 0x20), 1);
    // Not re-armed: the next EQE raises nothing. `stats` waits for the
    // firmware lock, under which an EQE is written and its interrupt
    // decided: once it counts the EQE, the interrupt would have come.
    let (eqes, irqs) = (d.f.model().stats().eqes, d.f.model().stats().interrupts);
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    until("the NOP's EQE", || d.f.model().stats().eqes == eqes + 1);
    assert_eq!(d.f.model().stats().interrupts, irqs);
    assert!(fd.read().is_err());
    // Arm with ci=1 while EQE 1 is pending: fires at once.
    db(&d, 0x40, 1);
    assert!(wait_irq(&fd));
    // Fill the ring: 4 entries, ci=2, pi=2: four more fit, the fifth overruns.
    db(&d, 0x48, 2);
    settle(d.f.model());
    for _ in 0..3 {
        d.ok(&cmd_in(0x80d, 0, 16), 16);
    }
    // Entry 4 wraps to index 0 with owner 1 (the EQE follows the
    // command's ownership bit, so wait for it).
    until("entry 4 at index 0", || {
        ring.load_u8_acquire(0x3f).unwrap() & 1 == 1
    });
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    until("the overrun", || d.f.model().stats().eq_overruns == 1);
    let mut q = cmd_in(0x303, 0, 16);
    q[11] = eqn;
    let out = d.ok(&q, 0x110 + 8);
    assert_eq!(mlx5_hw::ifc::eqc::STATUS.get(&out[0x10..0x50]), 0xa);
    // Page request hook.
    let mut d2 = d;
    let mut destroy = cmd_in(0x302, 0, 16);
    destroy[11] = eqn;
    d2.ok(&destroy, 16);
    assert_eq!(d2.exec(&destroy, 16)[0], CmdStatus::BadResource.to_raw());
    let eqn = create_eq(&mut d2, uar, 3, 1 << 0x0b, 0);
    let ring = d2.pages.last().unwrap().clone();
    d2.f.model().request_pages(3);
    until("the page request EQE", || {
        ring.load_u8_acquire(0x3f).unwrap() & 1 == 0
    });
    ring.read(0, &mut e).unwrap();
    assert_eq!(e[1], 0x0b);
    assert_eq!(be32(&e, 0x24), 3);
    assert_eq!(d2.query_pages(3), 3);
    let _ = eqn;
}

#[test]
fn faults_and_reset() {
    // On a clock that stands still, so `initializing` after the FLR is set
    // until the test moves time, however slow the machine.
    const FW_START: Duration = Duration::from_millis(2);
    let clock = ManualClock::new();
    let mut d = Drv::with(DeviceConfig {
        fw_start: FW_START,
        clock: clock.shared(),
        ..DeviceConfig::default()
    });
    clock.advance(FW_START);
    d.open();
    d.f.model()
        .faults()
        .command_status(0x80d, CmdStatus::InternalError, 0xdead, 1);
    let out = d.exec(&cmd_in(0x80d, 0, 16), 16);
    assert_eq!((out[0], be32(&out, 4)), (1, 0xdead));
    d.f.model()
        .faults()
        .delivery_error(0x80d, DeliveryStatus::FirmwareError, 1);
    assert_eq!(d.post(0, &cmd_in(0x80d, 0, 16), 16, |_| {}).0, 6);
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    // Health failure.
    d.f.model()
        .faults()
        .health_failure(HealthSyndrome::FwInternalError, 7);
    // Once the worker has acted on it (fw_ver reads all ones, the
    // syndrome is in the counter's top byte), the counter stops.
    until("the health failure to apply", || {
        rd(bar(&d), initseg::HEALTH_FW_VER) == 0xffff_ffff
            && rd(bar(&d), initseg::HEALTH_COUNTER) >> 24 != 0
    });
    assert!(d.f.model().firmware_failed());
    let c = rd(bar(&d), initseg::HEALTH_COUNTER);
    // Worker passes over two beats of a live firmware's heartbeat (which
    // is on real time: the window is what is observed, not a wait).
    let window = Instant::now();
    while window.elapsed() <= 2 * crate::fw::HEALTH_TICK {
        settle(d.f.model());
    }
    assert_eq!(rd(bar(&d), initseg::HEALTH_COUNTER), c);
    let mut b = [0u8; 1];
    bar(&d).read(initseg::HEALTH_SYND, &mut b).unwrap();
    assert_eq!(b[0], 1);
    // FLR brings it back, initializing again.
    d.f.model().faults().clear();
    d.f.reset().unwrap();
    let initializing = || rd(bar(&d), initseg::INITIALIZING) & initseg::INITIALIZING_BIT != 0;
    assert!(initializing());
    settle(d.f.model());
    assert!(initializing(), "ready before fw_start after the FLR");
    clock.advance(FW_START);
    d.open();
    d.ok(&cmd_in(0x80d, 0, 16), 16);
    assert_eq!(d.f.model().stats().resets, 1);
}

#[test]
fn fast_teardown_releases_pages() {
    let mut d = Drv::new();
    d.bring_up();
    let mut td = cmd_in(0x103, 0, 16);
    td[10..12].copy_from_slice(&2u16.to_be_bytes());
    d.ok(&td, 16);
    let l = rd(bar(&d), initseg::CMDQ_ADDR_L_SZ);
    wr(bar(&d), initseg::CMDQ_ADDR_L_SZ, (l & 0xffff_f000) | 1 << 8);
    until("the fast teardown", || {
        (rd(bar(&d), initseg::CMDQ_ADDR_L_SZ) >> 8) & 7 == 1 && d.f.model().stats().pages_held == 0
    });
    assert_eq!(rd(bar(&d), initseg::CMDQ_ADDR_L_SZ) & 0xff, 0x56);
    assert_eq!(d.f.model().stats().hca_state, HcaState::FastTornDown);
}

#[test]
fn profiles_and_config() {
    for p in Profile::ALL {
        let f = crate::emulated(p);
        let mut b = [0u8; 4];
        f.config_read(0, &mut b).unwrap();
        assert_eq!(u16::from_le_bytes([b[2], b[3]]), p.device_id());
        assert_eq!(f.irq_count(IrqKind::MsiX).unwrap(), p.msix_vectors());
        assert_eq!(f.region_info(0).unwrap().size, p.bar0_size());
        assert!(!p.caps().cur[&cap_type::GENERAL].is_empty());
    }
    // The device frequency the traced firmware gives in MHz (275), also in
    // kHz, the field Linux's PTP clock needs.
    let caps = Profile::ConnectX4Lx.caps();
    assert_eq!(
        caps.get(cap_type::GENERAL, cmd_hca_cap::DEVICE_FREQUENCY_MHZ),
        275
    );
    assert_eq!(
        caps.get(cap_type::GENERAL, cmd_hca_cap::DEVICE_FREQUENCY_KHZ),
        275_000
    );
}

/// A command entry handed to hardware (ownership set) on `slot`, inline
/// input only, its doorbell not rung.
fn hand_over(d: &Drv, slot: u8, input: &[u8; 16], token: u8) {
    let mut e = [0u8; 64];
    e[0] = 7;
    e[4..8].copy_from_slice(&16u32.to_be_bytes());
    e[0x10..0x20].copy_from_slice(input);
    e[0x38..0x3c].copy_from_slice(&16u32.to_be_bytes());
    e[0x3c] = token;
    e[0x3f] = 1;
    write_entry(&d.cmdq, usize::from(slot) * 64, &e);
}

/// Writes a command entry as a driver must: every field, then `status_own`
/// alone with release ordering. One copy of all 64 bytes may store a byte
/// twice (glibc's vector memcpy of exactly 64 bytes can, as seen here): the
/// model's lost-doorbell scan can run the command between the two stores,
/// and the second store hands it to hardware again.
fn write_entry(cmdq: &DmaBuffer, at: usize, e: &[u8; 64]) {
    cmdq.write(at, &e[..0x3f]).unwrap();
    cmdq.store_u8_release(at + 0x3f, e[0x3f]).unwrap();
}

fn owned_by_hw(d: &Drv, slot: u8) -> bool {
    d.cmdq
        .load_u8_acquire(usize::from(slot) * 64 + 0x3f)
        .unwrap()
        & 1
        != 0
}

#[test]
fn trapped_command_doorbells_run_only_the_slots_they_ring() {
    use vfio::emulated::DeviceModel;
    let mut d = Drv::new();
    d.open();
    let nop: [u8; 16] = {
        let mut c = [0u8; 16];
        c[..2].copy_from_slice(&0x10du16.to_be_bytes());
        c
    };
    // Slot 0 handed over but not rung (Linux sets ownership, then marks the
    // command pending, then rings); slot 1 rung as a trapped write.
    hand_over(&d, 0, &nop, 1);
    hand_over(&d, 1, &nop, 2);
    let ring = |slot: u8| {
        d.f.model()
            .region_write(0, initseg::CMD_DBELL as u64, &(1u32 << slot).to_be_bytes());
    };
    ring(1);
    until("slot 1 to complete", || !owned_by_hw(&d, 1));
    settle(d.f.model());
    assert!(owned_by_hw(&d, 0), "slot 0 ran before its doorbell");
    // Its doorbell runs it; two rings between two worker passes both count.
    hand_over(&d, 1, &nop, 3);
    ring(0);
    ring(1);
    until("both rung slots to complete", || {
        !owned_by_hw(&d, 0) && !owned_by_hw(&d, 1)
    });
    assert_eq!(d.f.model().stats().commands, 3);
}
