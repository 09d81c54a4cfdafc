//! Firmware health: the poller that notices a dead or failing device.
//!
//! Firmware increments `health_counter` (init-segment 0x1010, bits 23:0)
//! while it runs, and on a fatal error fills the health buffer (0x200):
//! `synd` (0x23d) names the error, `rfr` (bit 7 of 0x238) says a recovery
//! flow is required. A `fw_ver` of 0xffffffff means reads return all ones:
//! the PCI link is gone. `nic_interface` (0x14 bits 10:8) of 1 (disabled) or
//! 7 (software reset) means the function was taken away.
//!
//! The poller checks these every interval (the kernel: 2 s) on its own
//! thread. Before the registers it reads the function's vendor and device
//! ID from config space, as the kernel checks `pci_channel_offline`: a
//! function that vanished (a vfio-user server that hung up or died, a
//! device unplugged, config reads of all ones) fails at once, while the
//! mapped BAR of a dead server would still read its last values. A counter
//! that stays still for [`HEALTH_MAX_MISSES`] polls in a row, or any fatal
//! sensor, becomes a [`HealthEvent`]: the command queue fails every waiting
//! and later command with [`crate::Error::Health`], posts fail with
//! `PostError::DeviceFailed`, an empty CQ poll returns the failure, every
//! CQ's completion handler fires once (as mlx5_ib's internal-error flow
//! does) so that waiters on completion channels wake and poll, and
//! subscribers are told (health subscribers the event, async-event ones
//! `IBV_EVENT_DEVICE_FATAL`). Nothing aborts; recovery is a function reset
//! and a fresh bring-up, when the caller asks ([`crate::hca::Hca::recover`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mlx5_hw::event::EventType;
use mlx5_hw::health::{self as hw, HealthSyndrome};
use mlx5_hw::ifc::HealthBuffer;
use mlx5_hw::init::{self as iseg, NicInterface};
use vfio::clock::{Deadline, SharedClock};
use vfio::{Mmio, PciFunction};
use zerocopy::{FromZeros, IntoBytes};

use crate::cmd::CmdQueue;
use crate::eq::{AsyncEvent, CompTable};
use crate::{Error, Result};

pub use mlx5_hw::health::HEALTH_MAX_MISSES;

/// Names the poller's wait for its next poll (a test's
/// `ManualClock::wait_armed`).
pub const HEALTH_POLL_DEADLINE: &str = "health poll";

/// Why the device is considered failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCause {
    /// `fw_ver` reads 0xffffffff: PCI reads return all ones.
    PciDead,
    /// `nic_interface` reads 1: the interface was disabled.
    NicDisabled,
    /// `nic_interface` reads 7: software reset.
    NicSwReset,
    /// The health buffer holds a syndrome (with `rfr` as read).
    Syndrome {
        /// The syndrome.
        synd: HealthSyndrome,
        /// Extended syndrome.
        ext_synd: u16,
        /// Recovery flow required.
        rfr: bool,
    },
    /// The health counter did not move for this many polls.
    CounterStuck(u32),
    /// The device could not be read at all.
    Unreadable(String),
    /// The function vanished: its config space cannot be read (a vfio-user
    /// server that hung up or died) or reads all ones (unplugged).
    Vanished(String),
}

/// A decoded health failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthEvent {
    /// What was seen.
    pub cause: HealthCause,
    /// The health buffer's fw_ver word.
    pub fw_ver: u32,
    /// The health buffer's hw_id word.
    pub hw_id: u32,
    /// The assert variables.
    pub assert_var: [u32; 6],
    /// Assert exit pointer.
    pub assert_exit_ptr: u32,
    /// Assert call return address.
    pub assert_callra: u32,
    /// irisc index.
    pub irisc_index: u8,
    /// The last health counter value.
    pub counter: u32,
    /// The health buffer's syndrome (0x23d), decoded; `None` when 0. Kept
    /// whatever sensor fired, as the kernel's health report prints it.
    pub synd: Option<HealthSyndrome>,
    /// The health buffer's extended syndrome (0x23e).
    pub ext_synd: u16,
}

impl fmt::Display for HealthEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            HealthCause::PciDead => write!(f, "PCI link dead (fw_ver reads 0xffffffff)")?,
            HealthCause::NicDisabled => write!(f, "NIC interface disabled")?,
            HealthCause::NicSwReset => write!(f, "NIC interface in software reset")?,
            HealthCause::Syndrome {
                synd,
                ext_synd,
                rfr,
            } => write!(
                f,
                "{} ({:#x}), ext_synd {ext_synd:#x}{}",
                synd.name(),
                synd.to_raw(),
                if *rfr { ", recovery flow required" } else { "" }
            )?,
            HealthCause::CounterStuck(n) => write!(
                f,
                "health counter stuck at {:#x} for {n} polls",
                self.counter
            )?,
            HealthCause::Unreadable(e) => write!(f, "health registers unreadable: {e}")?,
            HealthCause::Vanished(e) => write!(f, "the function vanished: {e}")?,
        }
        if let (Some(synd), false) = (
            self.synd,
            matches!(self.cause, HealthCause::Syndrome { .. }),
        ) {
            write!(
                f,
                "; health syndrome {} ({:#x}), ext_synd {:#x}",
                synd.name(),
                synd.to_raw(),
                self.ext_synd
            )?;
        }
        write!(
            f,
            " (fw_ver {:#x}, hw_id {:#x}, exit_ptr {:#x}, callra {:#x}, irisc {})",
            self.fw_ver, self.hw_id, self.assert_exit_ptr, self.assert_callra, self.irisc_index
        )
    }
}

/// What the initialization segment says without any command: firmware
/// version, command interface revision, whether firmware is still
/// initializing, and the health registers. Reading it needs no bring-up,
/// so it works on firmware that is stuck (`initializing` never clears) or
/// dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitSegment {
    /// `fw_rev` (0x00) and `fw_rev_subminor` (0x04).
    pub fw: crate::bringup::FwVersion,
    /// `cmd_interface_rev` (0x04 bits 31:16).
    pub cmdif_rev: u16,
    /// `initializing` (0x1fc bit 31).
    pub initializing: bool,
    /// The health buffer and counter.
    pub health: HealthSnapshot,
}

impl InitSegment {
    /// Maps BAR0 of `func` and reads the segment (no config-space write,
    /// no command).
    pub fn read(func: &dyn vfio::PciFunction) -> Result<Self> {
        let bar = func.map_region(0)?;
        let fw_rev = bar.read32_be(iseg::ISEG_FW_REV)?;
        let sub = bar.read32_be(iseg::ISEG_CMDIF_REV_FW_SUB)?;
        Ok(Self {
            fw: crate::bringup::FwVersion {
                major: iseg::fw_rev_major(fw_rev),
                minor: iseg::fw_rev_minor(fw_rev),
                subminor: iseg::fw_rev_subminor(sub),
            },
            cmdif_rev: iseg::cmdif_rev(sub),
            initializing: iseg::fw_initializing(bar.read32_be(iseg::ISEG_INITIALIZING)?),
            health: HealthSnapshot::read(&bar)?,
        })
    }
}

/// A snapshot of the health registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// The health buffer (64 bytes at 0x200).
    pub buffer: HealthBuffer,
    /// `health_counter` (0x1010).
    pub counter_reg: u32,
    /// `cmdq_addr_l_sz` (0x14), for nic_interface.
    pub cmdq_l: u32,
}

impl Default for HealthSnapshot {
    fn default() -> Self {
        Self {
            buffer: HealthBuffer::new_zeroed(),
            counter_reg: 0,
            cmdq_l: 0,
        }
    }
}

impl HealthSnapshot {
    /// Reads the registers (the buffer as the big-endian dwords it is made of).
    pub fn read(bar: &Mmio) -> Result<Self> {
        let mut s = Self::default();
        for (i, w) in s.buffer.as_mut_bytes().chunks_exact_mut(4).enumerate() {
            w.copy_from_slice(&bar.read32_be(iseg::ISEG_HEALTH + 4 * i)?.to_be_bytes());
        }
        s.counter_reg = bar.read32_be(iseg::ISEG_HEALTH_COUNTER)?;
        s.cmdq_l = bar.read32_be(iseg::ISEG_CMDQ_ADDR_L_SZ)?;
        Ok(s)
    }

    /// `fw_ver`.
    pub fn fw_ver(&self) -> u32 {
        self.buffer.fw_ver.get()
    }

    /// `synd`.
    pub fn synd(&self) -> u8 {
        self.buffer.synd
    }

    /// `rfr` (bit 7 of `rfr_severity`).
    pub fn rfr(&self) -> bool {
        hw::rfr(self.buffer.rfr_severity)
    }

    /// The 24-bit counter.
    pub fn counter(&self) -> u32 {
        hw::health_counter(self.counter_reg)
    }

    /// `nic_interface`, read as both drivers read it: `(0x14 >> 8) & 7`.
    pub fn nic_interface(&self) -> NicInterface {
        iseg::nic_interface(self.cmdq_l)
    }

    /// The fatal sensors, in the order the kernel checks them.
    pub fn fatal(&self) -> Option<HealthCause> {
        if self.fw_ver() == hw::HEALTH_FW_VER_DEAD {
            return Some(HealthCause::PciDead);
        }
        match self.nic_interface() {
            NicInterface::Disabled => return Some(HealthCause::NicDisabled),
            NicInterface::SwReset => return Some(HealthCause::NicSwReset),
            _ => {}
        }
        if self.synd() != hw::HEALTH_SYNDROME_NONE {
            return Some(HealthCause::Syndrome {
                synd: HealthSyndrome::from_raw(self.synd()),
                ext_synd: self.buffer.ext_synd.get(),
                rfr: self.rfr(),
            });
        }
        None
    }

    /// The event for `cause`, with this snapshot's details.
    pub fn event(&self, cause: HealthCause) -> HealthEvent {
        let b = &self.buffer;
        HealthEvent {
            cause,
            fw_ver: self.fw_ver(),
            hw_id: b.hw_id.get(),
            assert_var: b.assert_var.map(|w| w.get()),
            assert_exit_ptr: b.assert_exit_ptr.get(),
            assert_callra: b.assert_callra.get(),
            irisc_index: b.irisc_index,
            counter: self.counter(),
            synd: (self.synd() != hw::HEALTH_SYNDROME_NONE)
                .then(|| HealthSyndrome::from_raw(self.synd())),
            ext_synd: b.ext_synd.get(),
        }
    }
}

/// Counter-liveness bookkeeping: a miss is a poll that saw no change.
#[derive(Debug, Default, Clone, Copy)]
pub struct Liveness {
    last: Option<u32>,
    misses: u32,
}

impl Liveness {
    /// Feeds one counter reading; returns the miss count if it reached
    /// [`HEALTH_MAX_MISSES`].
    pub fn observe(&mut self, counter: u32) -> Option<u32> {
        if self.last == Some(counter) {
            self.misses += 1;
        } else {
            self.misses = 0;
        }
        self.last = Some(counter);
        (self.misses >= HEALTH_MAX_MISSES).then_some(self.misses)
    }
}

/// What the sensors read and whom a failure is told: shared by the
/// poller and [`crate::hca::Hca::check_health`].
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    pub(crate) func: Arc<dyn PciFunction>,
    pub(crate) bar: Arc<Mmio>,
    pub(crate) cmd: Arc<CmdQueue>,
    pub(crate) comp: Arc<CompTable>,
    pub(crate) subs: HealthSubscribers,
    /// Async-event subscribers: they get an INTERNAL_ERROR event
    /// (`IBV_EVENT_DEVICE_FATAL`), as mlx5_ib dispatches on a fatal error.
    pub(crate) events: Arc<Mutex<Vec<Sender<AsyncEvent>>>>,
}

impl Watch {
    /// The sensors that need no history, read now: config space first (a
    /// vanished function), then the fatal registers. Without a failure the
    /// snapshot comes back, for the counter's liveness.
    pub(crate) fn sense(&self) -> std::result::Result<HealthSnapshot, HealthEvent> {
        let mut id = [0u8; 4];
        let gone = match self.func.config_read(0, &mut id) {
            Err(e) => Some(format!("config space unreadable: {e}")),
            Ok(()) if id == [0xff; 4] => Some("config space reads all ones".to_string()),
            Ok(()) => None,
        };
        if let Some(why) = gone {
            // The registers, for the report, if they still read.
            let s = HealthSnapshot::read(&self.bar).unwrap_or_default();
            return Err(s.event(HealthCause::Vanished(why)));
        }
        let s = HealthSnapshot::read(&self.bar)
            .map_err(|e| HealthSnapshot::default().event(HealthCause::Unreadable(e.to_string())))?;
        match s.fatal() {
            Some(c) => Err(s.event(c)),
            None => Ok(s),
        }
    }

    /// Declares the device failed, once: commands, posts and polls fail from
    /// now on, every CQ's completion handler fires (waiters on channels wake
    /// and find the failure), subscribers are told.
    pub(crate) fn declare(&self, ev: HealthEvent) {
        if !self.cmd.fail(ev.clone()) {
            return;
        }
        tracing::error!("mlx5 health: {ev}");
        self.comp.fire_all();
        lock_subs(&self.subs).retain(|s| s.send(ev.clone()).is_ok());
        let fatal = AsyncEvent {
            event_type: EventType::InternalError,
            sub_type: 0,
            data: [0; mlx5_hw::event::EQE_DATA_SIZE],
        };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|s| s.send(fatal).is_ok());
    }

    /// Runs the sensors now; a failure is declared and returned.
    pub(crate) fn check_now(&self) -> Result<()> {
        if let Some(ev) = self.cmd.health_event() {
            return Err(Error::Health(ev));
        }
        match self.sense() {
            Ok(_) => Ok(()),
            Err(ev) => {
                self.declare(ev);
                // The first declaration wins (the poller may have raced us).
                Err(Error::Health(self.cmd.health_event().unwrap_or_else(
                    || HealthSnapshot::default().event(HealthCause::Unreadable("unknown".into())),
                )))
            }
        }
    }
}

/// The running poller.
#[derive(Debug)]
pub(crate) struct HealthPoller {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Shared list of health subscribers.
pub(crate) type HealthSubscribers = Arc<Mutex<Vec<Sender<HealthEvent>>>>;

impl HealthPoller {
    pub(crate) fn start(watch: Watch, clock: SharedClock, interval: Duration) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mlx5-health".into())
            .spawn(move || poll_loop(&watch, &clock, interval, &stopped))
            .map_err(|e| Error::os("spawn health poller", e))?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                tracing::error!("health poller panicked");
            }
        }
    }
}

impl Drop for HealthPoller {
    fn drop(&mut self) {
        self.stop();
    }
}

fn poll_loop(watch: &Watch, clock: &SharedClock, interval: Duration, stop: &AtomicBool) {
    let mut live = Liveness::default();
    loop {
        // Park until the next poll on the clock or until told to stop
        // (`stop` unparks). The next poll is an interval after this one,
        // as the kernel re-arms its timer: a late poll is not followed by
        // a burst that would find the counter still.
        let next = Deadline::after(clock, interval, HEALTH_POLL_DEADLINE);
        while !next.passed() {
            if stop.load(Ordering::Acquire) {
                return;
            }
            next.pause(interval);
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        if watch.cmd.health_event().is_some() {
            // Declared by a caller's check: reported once already.
            return;
        }
        let ev = match watch.sense() {
            Err(ev) => Some(ev),
            Ok(s) => live
                .observe(s.counter())
                .map(|n| s.event(HealthCause::CounterStuck(n))),
        };
        if let Some(ev) = ev {
            watch.declare(ev);
            // Reported once; the device stays failed until recovered.
            return;
        }
    }
}

fn lock_subs(s: &HealthSubscribers) -> std::sync::MutexGuard<'_, Vec<Sender<HealthEvent>>> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_needs_three_misses() {
        let mut l = Liveness::default();
        assert_eq!(l.observe(5), None);
        assert_eq!(l.observe(5), None);
        assert_eq!(l.observe(5), None);
        assert_eq!(l.observe(5), Some(3));
        let mut l = Liveness::default();
        for i in 0..10 {
            assert_eq!(l.observe(i), None);
        }
    }

    #[test]
    fn sensors_in_kernel_order() {
        let mut s = HealthSnapshot::default();
        assert_eq!(s.fatal(), None);
        s.buffer.synd = 7;
        s.buffer.ext_synd.set(0x12);
        s.buffer.rfr_severity = 0x80;
        let c = s.fatal().unwrap();
        assert_eq!(
            c,
            HealthCause::Syndrome {
                synd: HealthSyndrome::DeadIrisc,
                ext_synd: 0x12,
                rfr: true
            }
        );
        assert!(s.event(c).to_string().contains("irisc not responding"));
        s.cmdq_l = 7 << 8;
        assert_eq!(s.fatal(), Some(HealthCause::NicSwReset));
        s.buffer.fw_ver.set(0xffff_ffff);
        assert_eq!(s.fatal(), Some(HealthCause::PciDead));
    }
}
