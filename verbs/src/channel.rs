//! Completion channels (`ibv_create_comp_channel`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`): an eventfd that becomes readable when an armed CQ
//! fires, so a program can wait for completions with epoll.
//!
//! A completion EQE (type COMP, naming the CQ) reaches the event thread;
//! the CQ's handler queues the CQ number here and bumps the eventfd. The
//! channel is `Send + Sync`.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::{Error, Result};

#[derive(Debug)]
pub(crate) struct ChannelInner {
    fd: EventFd,
    queue: Mutex<VecDeque<u32>>,
}

impl ChannelInner {
    /// A CQ of this channel fired.
    pub(crate) fn notify(&self, cqn: u32) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(cqn);
        if let Err(e) = self.fd.write(1) {
            tracing::warn!("completion channel eventfd: {e}");
        }
    }
}

/// A completion channel (`struct ibv_comp_channel`).
#[derive(Debug, Clone)]
pub struct CompChannel {
    pub(crate) inner: Arc<ChannelInner>,
}

impl CompChannel {
    pub(crate) fn new() -> Result<Self> {
        let fd = EventFd::new(EFD_NONBLOCK).map_err(|e| Error::os("eventfd", e))?;
        Ok(Self {
            inner: Arc::new(ChannelInner {
                fd,
                queue: Mutex::default(),
            }),
        })
    }

    /// The file descriptor to wait on (readable when an event is queued).
    pub fn fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }

    /// `ibv_get_cq_event`: the number of the CQ that fired, waiting up to
    /// `timeout` (`None`: no event in that time).
    pub fn get_cq_event(&self, timeout: Duration) -> Result<Option<u32>> {
        if let Some(c) = self.pop() {
            return Ok(Some(c));
        }
        let ep = Epoll::new().map_err(|e| Error::os("epoll_create", e))?;
        ep.ctl(
            ControlOperation::Add,
            self.fd(),
            EpollEvent::new(EventSet::IN, 0),
        )
        .map_err(|e| Error::os("epoll_ctl", e))?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(c) = self.pop() {
                return Ok(Some(c));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut ev = [EpollEvent::default()];
            match ep.wait(left.as_millis().clamp(1, i32::MAX as u128) as i32, &mut ev) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::os("epoll_wait", e)),
            }
        }
    }

    fn pop(&self) -> Option<u32> {
        let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
        let c = q.pop_front();
        if q.is_empty() {
            // Drain the counter so the fd reads "nothing" until the next event.
            let _ = self.inner.fd.read();
        }
        c
    }
}
