//! DevX asynchronous commands and object events, named as rdma-core's
//! `mlx5dv_devx_*`:
//!
//! - [`DevxCtx::create_cmd_comp`] is `mlx5dv_devx_create_cmd_comp`: a
//!   completion queue for commands issued with [`DevxObj::query_async`]
//!   (`mlx5dv_devx_obj_query_async`) or [`DevxCtx::general_cmd_async`];
//!   the caller goes on at once and later takes each command's output,
//!   tagged with its `wr_id`, from [`DevxCmdComp::get_async_cmd_comp`].
//!   Each command runs on the command interface in its own thread (the
//!   interface waits for its completion event, or polls before event
//!   mode), so several are in flight together; at most one per command
//!   slot (more is [`Error::Busy`], as the kernel bounds a completion
//!   queue's outstanding commands).
//! - [`DevxCtx::create_event_channel`] is
//!   `mlx5dv_devx_create_event_channel`: a channel fed by the function's
//!   asynchronous event queue. [`DevxEventChannel::subscribe_devx_event`]
//!   (`mlx5dv_devx_subscribe_devx_event`) names an object of the context
//!   (a QP, CQ or SRQ it created) or none (unaffiliated events: port
//!   changes...), the event types and a cookie; the object's events come
//!   back from [`DevxEventChannel::get_event`] with that cookie and the
//!   EQE's data. Event types that cannot happen to the object are refused,
//!   as Linux's DevX refuses them (`is_valid_events`). A DevX CQ's
//!   completion events (type 0, after [`super::DevxCq::arm`]) come the
//!   same way: the subscription routes the CQ's events from the completion
//!   EQ to the channel, until the channel is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mlx5_hw::event::{EventType, EQE_RESOURCE_NUMBER_MASK};
use mlx5_hw::ifc::{create_cq_out, create_qp_out, create_srq_out, EqeComp, EqeCqErr, EqeQpSrq};
use mlx5_hw::opcode::Opcode;

use super::{with_uid, DevxCtx, DevxObj};
use crate::eq::AsyncEvent;
use crate::{Error, Result};

/// One completed asynchronous command (`struct mlx5dv_devx_async_cmd_hdr`
/// and the output that follows it).
#[derive(Debug)]
pub struct DevxAsyncCmd {
    /// The `wr_id` the command was issued with.
    pub wr_id: u64,
    /// The command's output, or how it failed (PRM status and syndrome).
    pub result: Result<Vec<u8>>,
}

/// A completion queue of asynchronous DevX commands
/// (`struct mlx5dv_devx_cmd_comp`).
#[derive(Debug)]
pub struct DevxCmdComp {
    tx: Sender<DevxAsyncCmd>,
    rx: Receiver<DevxAsyncCmd>,
    in_flight: Arc<AtomicUsize>,
    limit: usize,
}

/// An object event taken from a channel (`struct
/// mlx5dv_devx_async_event_hdr`: the subscription's cookie, then the EQE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevxEvent {
    /// The cookie the subscription was made with.
    pub cookie: u64,
    /// The event, with the EQE's type, sub-type and data.
    pub event: AsyncEvent,
}

/// What an event subscription names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Events of no object.
    Unaffiliated,
    /// A QP's events, by number.
    Qp(u32),
    /// A CQ's events.
    Cq(u32),
    /// An SRQ's events.
    Srq(u32),
}

#[derive(Debug)]
struct Subscription {
    target: Target,
    types: Vec<EventType>,
    cookie: u64,
}

/// An event channel (`struct mlx5dv_devx_event_channel`).
#[derive(Debug)]
pub struct DevxEventChannel {
    ctx: crate::device::Context,
    tx: Sender<AsyncEvent>,
    rx: Receiver<AsyncEvent>,
    subs: Mutex<Vec<Subscription>>,
    /// The CQs whose completion events the channel routes.
    comp_cqs: Mutex<Vec<u32>>,
}

impl DevxCtx {
    /// `mlx5dv_devx_create_cmd_comp`.
    pub fn create_cmd_comp(&self) -> DevxCmdComp {
        let (tx, rx) = mpsc::channel();
        DevxCmdComp {
            tx,
            rx,
            in_flight: Arc::default(),
            limit: self.ctx.hca().cmd().slots().max(1),
        }
    }

    /// Any command under the context's uid, completed on `comp` with
    /// `wr_id`.
    pub fn general_cmd_async(
        &self,
        input: &[u8],
        outlen: usize,
        wr_id: u64,
        comp: &DevxCmdComp,
    ) -> Result<()> {
        comp.issue(&self.ctx, with_uid(input, self.uid)?, outlen, wr_id)
    }

    /// `mlx5dv_devx_create_event_channel`.
    pub fn create_event_channel(&self) -> DevxEventChannel {
        let (tx, rx) = mpsc::channel();
        self.ctx.hca().add_event_subscriber(tx.clone());
        DevxEventChannel {
            ctx: self.ctx.clone(),
            tx,
            rx,
            subs: Mutex::default(),
            comp_cqs: Mutex::default(),
        }
    }
}

impl DevxObj {
    /// `mlx5dv_devx_obj_query_async`: a raw query command on the object,
    /// its output later taken from `comp` with `wr_id`.
    pub fn query_async(
        &self,
        input: &[u8],
        outlen: usize,
        wr_id: u64,
        comp: &DevxCmdComp,
    ) -> Result<()> {
        comp.issue(&self.ctx, with_uid(input, self.uid)?, outlen, wr_id)
    }

    /// What the object is to the event queue: its kind and number.
    fn target(&self) -> Option<Target> {
        Some(match self.destroy_opcode()? {
            Opcode::DestroyQp => Target::Qp(create_qp_out::QPN.get(&self.out) as u32),
            Opcode::DestroyCq => Target::Cq(create_cq_out::CQN.get(&self.out) as u32),
            Opcode::DestroySrq => Target::Srq(create_srq_out::SRQN.get(&self.out) as u32),
            _ => return None,
        })
    }
}

impl DevxCmdComp {
    fn issue(
        &self,
        ctx: &crate::device::Context,
        input: Vec<u8>,
        outlen: usize,
        wr_id: u64,
    ) -> Result<()> {
        let n = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if n >= self.limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Busy(
                "every command slot has an asynchronous command",
            ));
        }
        let (ctx, tx, in_flight) = (ctx.clone(), self.tx.clone(), self.in_flight.clone());
        let spawned = std::thread::Builder::new()
            .name("devx-async-cmd".into())
            .spawn(move || {
                let result = ctx.hca().cmd().exec(&input, outlen);
                in_flight.fetch_sub(1, Ordering::AcqRel);
                // The queue may be gone: nobody waits for the answer then.
                let _ = tx.send(DevxAsyncCmd { wr_id, result });
            });
        if let Err(e) = spawned {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Os {
                op: "spawning an asynchronous command",
                source: e,
            });
        }
        Ok(())
    }

    /// `mlx5dv_devx_get_async_cmd_comp`: the next completed command,
    /// waiting up to `timeout` (None when none completed by then).
    pub fn get_async_cmd_comp(&self, timeout: Duration) -> Option<DevxAsyncCmd> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// A completed command if one is there, without waiting.
    pub fn try_get(&self) -> Option<DevxAsyncCmd> {
        self.rx.try_recv().ok()
    }

    /// Commands issued and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// The event types that can happen to a target (Linux devx.c
/// `is_valid_events`: QP, CQ and SRQ events; unaffiliated ones for none).
fn valid_for(target: Target, t: EventType) -> bool {
    use EventType as E;
    match target {
        Target::Qp(_) => matches!(
            t,
            E::PathMig
                | E::CommEst
                | E::SqDrained
                | E::SrqLastWqe
                | E::WqCatasError
                | E::PathMigFailed
                | E::WqInvalReqError
                | E::WqAccessError
        ),
        Target::Cq(_) => matches!(t, E::CqError | E::Comp),
        Target::Srq(_) => matches!(t, E::SrqCatasError | E::SrqRqLimit),
        Target::Unaffiliated => matches!(
            t,
            E::InternalError
                | E::PortChange
                | E::GpioEvent
                | E::PortModuleEvent
                | E::TempWarnEvent
                | E::NicVportChange
        ),
    }
}

/// The object an event is about (None for an unaffiliated one).
fn target_of(e: &AsyncEvent) -> Target {
    use EventType as E;
    let qp_srq = || {
        let d: &EqeQpSrq = zerocopy::transmute_ref!(&e.data);
        d.qp_srq_n.get() & EQE_RESOURCE_NUMBER_MASK
    };
    match e.event_type {
        E::Comp => {
            let d: &EqeComp = zerocopy::transmute_ref!(&e.data);
            Target::Cq(d.cqn.get() & EQE_RESOURCE_NUMBER_MASK)
        }
        E::CqError => {
            let d: &EqeCqErr = zerocopy::transmute_ref!(&e.data);
            Target::Cq(d.cqn.get() & EQE_RESOURCE_NUMBER_MASK)
        }
        E::SrqCatasError | E::SrqRqLimit => Target::Srq(qp_srq()),
        E::PathMig
        | E::CommEst
        | E::SqDrained
        | E::SrqLastWqe
        | E::WqCatasError
        | E::PathMigFailed
        | E::WqInvalReqError
        | E::WqAccessError => Target::Qp(qp_srq()),
        _ => Target::Unaffiliated,
    }
}

impl DevxEventChannel {
    /// `mlx5dv_devx_subscribe_devx_event`: deliver `events` of `obj` (or,
    /// with None, the unaffiliated events) on this channel with `cookie`.
    pub fn subscribe_devx_event(
        &self,
        obj: Option<&DevxObj>,
        events: &[EventType],
        cookie: u64,
    ) -> Result<()> {
        let target = match obj {
            None => Target::Unaffiliated,
            Some(o) => o
                .target()
                .ok_or(Error::Invalid("events come only from QPs, CQs and SRQs"))?,
        };
        if events.is_empty() || !events.iter().all(|&t| valid_for(target, t)) {
            return Err(Error::Invalid(
                "an event type that cannot happen to the object",
            ));
        }
        if let (Target::Cq(cqn), true) = (target, events.contains(&EventType::Comp)) {
            self.route_completions(cqn);
        }
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.push(Subscription {
            target,
            types: events.to_vec(),
            cookie,
        });
        Ok(())
    }

    /// Completion events of CQ `cqn` come to this channel (as the kernel
    /// hands a DevX CQ's completions to its subscribers).
    fn route_completions(&self, cqn: u32) {
        let tx = self.tx.clone();
        let fire: crate::eq::CompHandler = Arc::new(move || {
            let mut data = [0u8; mlx5_hw::event::EQE_DATA_SIZE];
            let d: &mut EqeComp = zerocopy::transmute_mut!(&mut data);
            d.cqn.set(cqn);
            let ev = AsyncEvent {
                event_type: EventType::Comp,
                sub_type: 0,
                data,
            };
            // A dropped channel stops listening; its drop unroutes.
            let _ = tx.send(ev);
        });
        self.ctx.hca().comp_table().insert(cqn, fire);
        self.comp_cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cqn);
    }

    /// `mlx5dv_devx_get_event`: the next event a subscription asked for,
    /// waiting up to `timeout`; other events are dropped.
    pub fn get_event(&self, timeout: Duration) -> Option<DevxEvent> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let e = match self.rx.recv_timeout(left) {
                Ok(e) => e,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            };
            let target = target_of(&e);
            let subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
            let hit = subs
                .iter()
                .find(|s| s.target == target && s.types.contains(&e.event_type));
            if let Some(s) = hit {
                return Some(DevxEvent {
                    cookie: s.cookie,
                    event: e,
                });
            }
        }
    }
}

impl Drop for DevxEventChannel {
    fn drop(&mut self) {
        let cqs = self.comp_cqs.lock().unwrap_or_else(|p| p.into_inner());
        for &cqn in cqs.iter() {
            self.ctx.hca().comp_table().remove(cqn);
        }
    }
}
