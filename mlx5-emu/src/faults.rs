//! Fault injection: what tests make the device do wrong.
//!
//! Every fault is set through [`Faults`] (shared by [`crate::Device::faults`])
//! and read by the worker at the point where real hardware would fail.
//! Per-opcode faults fire `count` times (`u32::MAX`: forever).

use std::collections::BTreeMap;
use std::sync::Mutex;

use mlx5_hw::health::HealthSyndrome;
use mlx5_hw::status::{CmdStatus, DeliveryStatus};

use crate::lock;

/// A per-opcode fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdFault {
    /// The command is taken (ownership stays HW) and never completes.
    NeverComplete,
    /// The entry comes back with this delivery status, unexecuted.
    Delivery(DeliveryStatus),
    /// The command fails with this status and syndrome, unexecuted.
    Status(CmdStatus, u32),
}

#[derive(Debug, Default)]
struct State {
    stuck_initializing: bool,
    by_opcode: BTreeMap<u16, (CmdFault, u32)>,
    health: Option<(HealthSyndrome, u16)>,
    page_storm: u32,
}

/// The fault-injection handle.
#[derive(Debug, Default)]
pub struct Faults {
    state: Mutex<State>,
}

impl Faults {
    /// Firmware never leaves `initializing` (until [`clear`](Self::clear) and an FLR).
    pub fn stuck_initializing(&self, on: bool) {
        lock(&self.state).stuck_initializing = on;
    }

    /// Commands with `opcode` never complete (forever).
    pub fn never_complete(&self, opcode: u16) {
        self.on_opcode(opcode, CmdFault::NeverComplete, u32::MAX);
    }

    /// The next `count` commands with `opcode` come back with delivery status `d`.
    pub fn delivery_error(&self, opcode: u16, d: DeliveryStatus, count: u32) {
        self.on_opcode(opcode, CmdFault::Delivery(d), count);
    }

    /// The next `count` commands with `opcode` fail with `status` and `syndrome`.
    pub fn command_status(&self, opcode: u16, status: CmdStatus, syndrome: u32, count: u32) {
        self.on_opcode(opcode, CmdFault::Status(status, syndrome), count);
    }

    /// Any per-opcode fault, `count` times.
    pub fn on_opcode(&self, opcode: u16, fault: CmdFault, count: u32) {
        lock(&self.state).by_opcode.insert(opcode, (fault, count));
    }

    /// Firmware dies: the health counter stops, the health buffer reports
    /// `synd` (and `ext_synd`) with `rfr` set, `fw_ver` reads all ones, and
    /// no command completes any more. An FLR brings it back.
    pub fn health_failure(&self, synd: HealthSyndrome, ext_synd: u16) {
        lock(&self.state).health = Some((synd, ext_synd));
    }

    /// Firmware sends `count` PAGE_REQUEST events of one page each, as fast
    /// as the page-request EQ takes them.
    pub fn page_request_storm(&self, count: u32) {
        lock(&self.state).page_storm += count;
    }

    /// Removes every fault.
    pub fn clear(&self) {
        *lock(&self.state) = State::default();
    }

    pub(crate) fn is_stuck_initializing(&self) -> bool {
        lock(&self.state).stuck_initializing
    }

    pub(crate) fn health(&self) -> Option<(HealthSyndrome, u16)> {
        lock(&self.state).health
    }

    pub(crate) fn take_page_storm(&self) -> u32 {
        std::mem::take(&mut lock(&self.state).page_storm)
    }

    /// The fault to apply to this command, if any (consumes one count).
    pub(crate) fn take(&self, opcode: u16) -> Option<CmdFault> {
        let mut s = lock(&self.state);
        let (fault, count) = s.by_opcode.get_mut(&opcode)?;
        let f = *fault;
        if *count != u32::MAX {
            *count -= 1;
        }
        if *count == 0 {
            s.by_opcode.remove(&opcode);
        }
        Some(f)
    }
}
