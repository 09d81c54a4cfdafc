//! The driver's error type: failures named as the PRM names them.

use std::time::Duration;

use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::{self, CmdStatus, DeliveryStatus};

use crate::health::HealthEvent;

/// Everything the HCA layer can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Firmware executed the command and returned a failing status.
    #[error(
        "{} ({:#x}) op_mod {op_mod}: {} ({:#x}), syndrome {syndrome:#x}",
        opcode.name(),
        opcode.to_raw(),
        status.name(),
        status.to_raw()
    )]
    Cmd {
        /// The command's opcode.
        opcode: Opcode,
        /// The command's op_mod.
        op_mod: u16,
        /// Outbox status (byte 0).
        status: CmdStatus,
        /// Outbox syndrome (bytes 4..8), firmware specific.
        syndrome: u32,
    },
    /// Firmware could not take the command from the queue entry.
    #[error(
        "{} ({:#x}) op_mod {op_mod}: delivery failed: {} ({:#x})",
        opcode.name(),
        opcode.to_raw(),
        status.name(),
        status.to_raw()
    )]
    Delivery {
        /// The command's opcode.
        opcode: Opcode,
        /// The command's op_mod.
        op_mod: u16,
        /// Delivery status (`status_own >> 1`).
        status: DeliveryStatus,
    },
    /// A wait ran past its deadline.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: &'static str,
        /// How long the wait lasted.
        after: Duration,
    },
    /// A work request the driver posted for itself (a UMR on its UMR QP)
    /// completed in error.
    #[error("{what} completed with {status:?} (vendor syndrome {vendor_err:#x})")]
    WorkCompletion {
        /// What was posted.
        what: &'static str,
        /// The completion's status.
        status: crate::cq::WcStatus,
        /// Its vendor syndrome ([`crate::cq::Wc::vendor_err`]).
        vendor_err: u32,
    },
    /// The device reported (or showed) a fatal health state.
    #[error("device health failure: {0}")]
    Health(HealthEvent),
    /// The device speaks a command interface revision this driver does not.
    #[error("command interface revision {0} (this driver speaks 5)")]
    CmdifRevision(u16),
    /// The device's output is malformed.
    #[error("{opcode}: malformed output: {what}")]
    BadOutput {
        /// The command.
        opcode: Opcode,
        /// What is wrong.
        what: &'static str,
    },
    /// Firmware reported a capability no device can have.
    #[error("capability {field} = {value} is out of range (at most {max})")]
    BadCap {
        /// The PRM name of the capability field.
        field: &'static str,
        /// What firmware reported.
        value: u64,
        /// The largest value that makes sense.
        max: u64,
    },
    /// Firmware asked for more pages than the budget lets it hold
    /// (`HcaOptions::max_fw_pages`).
    #[error("firmware asked for {requested} pages; it holds {held} and may hold {budget}")]
    PageBudget {
        /// Pages asked for.
        requested: u64,
        /// Pages firmware held then.
        held: u64,
        /// The budget.
        budget: u64,
    },
    /// A capability or feature the driver needs is missing.
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// The caller passed something unusable.
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// A CQ was asked for a completion vector the context does not have
    /// (`ibv_create_cq`'s EINVAL).
    #[error("completion vector {vector} out of range: the context has {count} (num_comp_vectors)")]
    CompVector {
        /// The vector asked for.
        vector: usize,
        /// The context's `num_comp_vectors`.
        count: usize,
    },
    /// No object has that key or number (verbs' ENOENT, as
    /// `ibv_advise_mr` of an lkey that is no ODP region).
    #[error("not found: {0}")]
    NotFound(&'static str),
    /// The object may not be used so (verbs' EPERM, as `ibv_advise_mr`
    /// of another PD's region).
    #[error("not permitted: {0}")]
    Denied(&'static str),
    /// An access outside the object's memory (verbs' EFAULT, as
    /// `ibv_memcpy_to_dm` past the device memory).
    #[error("outside the memory: {0}")]
    Fault(&'static str),
    /// The object is still in use by others (verbs' EBUSY).
    #[error("busy: {0}")]
    Busy(&'static str),
    /// A queue has no room for what was posted (verbs' ENOMEM).
    #[error("queue full: {0}")]
    QueueFull(&'static str),
    /// The HCA (or the command queue) was closed.
    #[error("the HCA is closed")]
    Closed,
    /// A `DEV` could not be opened (said by the program's `Provider`).
    #[error("cannot open the device: {0}")]
    Open(String),
    /// The PCI function backend failed.
    #[error(transparent)]
    Vfio(#[from] vfio::Error),
    /// An operating-system call failed (threads, eventfds, epoll).
    #[error("{op}: {source}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The positive Linux errno this error maps to, as `mlx5_core` maps it
    /// (`cmd_status_to_err`, `deliv_status_to_err`).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Cmd { status, .. } => status.errno(),
            Error::Delivery { status, .. } => status.errno(),
            Error::Timeout { .. } => status::ETIMEDOUT,
            // mlx5_ib's `mlx5r_umr_post_send_wait` on a failed completion.
            Error::WorkCompletion { .. } => 14, // EFAULT
            Error::Health(_) => status::EIO,
            Error::CmdifRevision(_) => status::EOPNOTSUPP,
            Error::BadOutput { .. } | Error::BadCap { .. } => status::EIO,
            Error::NotSupported(_) => status::EOPNOTSUPP,
            Error::Invalid(_) | Error::CompVector { .. } => status::EINVAL,
            Error::Busy(_) => status::EBUSY,
            Error::Fault(_) => 14,   // EFAULT
            Error::NotFound(_) => 2, // ENOENT
            Error::Denied(_) => 1,   // EPERM
            Error::QueueFull(_) | Error::PageBudget { .. } => status::ENOMEM,
            Error::Closed => status::EIO,
            Error::Open(_) => 19, // ENODEV
            Error::Vfio(vfio::Error::IovaExhausted { .. }) => status::ENOSPC,
            Error::Vfio(vfio::Error::Os { source, .. }) | Error::Os { source, .. } => {
                source.raw_os_error().unwrap_or(status::EIO)
            }
            Error::Vfio(_) => status::EIO,
        }
    }

    pub(crate) fn os(op: &'static str, source: std::io::Error) -> Self {
        Error::Os { op, source }
    }
}

/// Result of this crate.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmd_error_display_and_errno() {
        let e = Error::Cmd {
            opcode: Opcode::CreateEq,
            op_mod: 0,
            status: CmdStatus::BadParameter,
            syndrome: 0x1a2b_3c4d,
        };
        assert_eq!(
            e.to_string(),
            "CREATE_EQ (0x301) op_mod 0: bad parameter (0x3), syndrome 0x1a2b3c4d"
        );
        assert_eq!(e.errno(), status::EINVAL);
        let d = Error::Delivery {
            opcode: Opcode::EnableHca,
            op_mod: 0,
            status: DeliveryStatus::TokenError,
        };
        assert_eq!(d.errno(), status::EBADR);
        assert!(d.to_string().contains("token error"));
        let t = Error::Timeout {
            what: "x",
            after: Duration::from_secs(1),
        };
        assert_eq!(t.errno(), status::ETIMEDOUT);
    }
}
