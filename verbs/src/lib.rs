//! The user-space mlx5 driver: the HCA layer that takes a ConnectX function
//! from reset to ready and back, the way Linux's `mlx5_core` does.
//!
//! # How an mlx5 function comes up
//!
//! A ConnectX function exposes an **initialization segment** at BAR0 offset 0
//! (firmware version, the command-queue address registers, the command
//! doorbell, the `initializing` flag, the health buffer and counter). The
//! driver talks to firmware through a **command queue**: one 4 KiB page of
//! 64-byte entries in host memory whose IOVA it writes to the segment. Each
//! command carries its first 16 input/output bytes inline and the rest in a
//! chain of 576-byte **mailbox blocks**; the driver hands an entry to
//! firmware by setting its ownership bit and ringing the doorbell bit of
//! that slot, and firmware hands it back by clearing the bit, with a
//! delivery status in the entry and a command status and syndrome in the
//! output. Until an event queue exists, the driver polls the ownership bit;
//! afterwards firmware also posts a CMD event, and the waiter sleeps.
//!
//! Firmware needs host memory of its own: it asks for **pages** at boot, at
//! init and at run time (PAGE_REQUEST events), and gives them back on
//! request and at teardown. Firmware liveness is watched through the
//! **health** counter and buffer.
//!
//! The modules mirror Linux's files, one mechanism each:
//!
//! - [`cmd`]: the command queue (slots, mailboxes, tokens, signatures,
//!   polling and event completion, status decoding, tracing);
//! - [`pagealloc`]: the firmware page supply (2 MiB DMA blocks, 4 KiB pages);
//! - [`buf`]: queue memory (WQE, CQE, SRQ and EQ rings, doorbell records
//!   packed in pages) carved out of a few large DMA chunks;
//! - [`eq`]: UARs, event queues, the event thread and event dispatch;
//! - [`health`]: the health poller;
//! - [`caps`]: QUERY_HCA_CAP / SET_HCA_CAP with the kernel's choices;
//! - [`uar`]: UAR pages inside BAR0;
//! - [`bringup`] (re-exported as [`hca`]): the whole sequence, [`hca::Hca`].
//!
//! On top, the verbs objects, named as libibverbs names them: [`device`]
//! (device list, [`device::Context`], queries, GIDs, async events), [`pd`],
//! [`mr`] (CREATE_MKEY over caller or DMA memory), [`cq`] (polling, arming),
//! [`channel`] (completion channels), [`qp`] (RC/UC/UD, modify, post),
//! [`srq`], [`ah`], and [`wr`] (the `ibv_wr_*` batch API).
//!
//! # Threads
//!
//! Every object is `Send + Sync`, and the types say what may run at once:
//! what takes `&self` (commands, queries, `Srq::post_recv`) from any
//! number of threads; what takes `&mut self` (posting to a [`qp::Qp`],
//! polling and arming a [`cq::Cq`]) from one owner at a time, with no lock
//! on that path. A QP's poster and its CQ's poller may be different
//! threads. For several threads on one queue, [`qp::Qp::into_shared`] and
//! [`cq::Cq::into_shared`] give [`shared::SharedQp`] and
//! [`shared::SharedCq`], the data path on `&self` under a lock, as
//! libibverbs' mlx5 provider locks; [`shared`] has the table and why.
//!
//! Every wait has a deadline, every barrier is named, and nothing the device
//! writes can make the driver panic: it becomes an [`Error`].
#![deny(unsafe_code)]
#![deny(missing_docs)]
#![warn(clippy::too_many_lines)] // at most 120 lines: clippy.toml

pub mod ah;
pub mod bringup;
pub mod buf;
pub mod caps;
pub mod channel;
pub mod clock;
pub mod cmd;
pub mod cq;
mod dbrec;
pub mod dc;
pub mod device;
pub mod devx;
pub mod dm;
mod dma;
pub mod dmabuf;
pub mod eq;
mod error;
pub mod flow;
pub mod health;
pub mod mcast;
pub mod mkey;
pub mod mkey_cache;
pub mod mkey_query;
pub mod mr;
pub mod mw;
pub mod odp;
pub mod ordering;
pub mod pagealloc;
pub mod pd;
pub mod qp;
pub mod raw_eth;
mod rq;
pub mod rss;
pub mod scatter_cqe;
pub mod shared;
pub mod srq;
pub mod uar;
pub mod uffd;
mod uidx;
pub mod umr;
pub mod vma;
pub mod wq;
pub mod wqe;
pub mod wr;

pub use error::{Error, Result};

/// The HCA: bring-up, teardown and identity (an alias of [`bringup`]).
pub mod hca {
    pub use crate::bringup::*;
}
