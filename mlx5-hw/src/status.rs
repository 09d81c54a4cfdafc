//! Command results: the outbox status byte (`MLX5_CMD_STAT_*`, device.h)
//! and the delivery status of the command queue entry
//! (`MLX5_CMD_DELIVERY_STAT_*`, core/cmd.c), with Linux's texts and errno
//! mappings (`cmd_status_str`/`cmd_status_to_err`,
//! `deliv_status_to_str`/`deliv_status_to_err`).
//!
//! Errno values are positive, as `std::io::Error::from_raw_os_error` takes
//! them (Linux returns their negation); 0 means success.

use crate::macros::prm_enum;

/// Linux errno: I/O error.
pub const EIO: i32 = 5;
/// Linux errno: try again.
pub const EAGAIN: i32 = 11;
/// Linux errno: out of memory.
pub const ENOMEM: i32 = 12;
/// Linux errno: bad address.
pub const EFAULT: i32 = 14;
/// Linux errno: device or resource busy.
pub const EBUSY: i32 = 16;
/// Linux errno: invalid argument.
pub const EINVAL: i32 = 22;
/// Linux errno: no space left on device.
pub const ENOSPC: i32 = 28;
/// Linux errno: no message of the desired type.
pub const ENOMSG: i32 = 42;
/// Linux errno: invalid request descriptor.
pub const EBADR: i32 = 53;
/// Linux errno: operation not supported.
pub const EOPNOTSUPP: i32 = 95;
/// Linux errno: connection timed out.
pub const ETIMEDOUT: i32 = 110;
/// Linux errno: remote I/O error (DevX: the outbox holds a failed status).
pub const EREMOTEIO: i32 = 121;

prm_enum! {
    /// Command completion status: byte 0 of every command outbox.
    pub enum CmdStatus: u8, unknown = "unknown status" {
        /// The command completed successfully (`MLX5_CMD_STAT_OK`).
        Ok = 0x00 => "OK",
        /// Internal firmware error (`MLX5_CMD_STAT_INT_ERR`).
        InternalError = 0x01 => "internal error",
        /// Unsupported or unknown opcode (`MLX5_CMD_STAT_BAD_OP_ERR`).
        BadOperation = 0x02 => "bad operation",
        /// A parameter is out of range (`MLX5_CMD_STAT_BAD_PARAM_ERR`).
        BadParameter = 0x03 => "bad parameter",
        /// The HCA is in the wrong state for the command (`MLX5_CMD_STAT_BAD_SYS_STATE_ERR`).
        BadSystemState = 0x04 => "bad system state",
        /// A referenced resource does not exist (`MLX5_CMD_STAT_BAD_RES_ERR`).
        BadResource = 0x05 => "bad resource",
        /// The resource is in use (`MLX5_CMD_STAT_RES_BUSY`).
        ResourceBusy = 0x06 => "resource busy",
        /// Firmware is not ready yet (`MLX5_CMD_STAT_NOT_READY`).
        NotReady = 0x07 => "FW not ready",
        /// A device limit would be exceeded (`MLX5_CMD_STAT_LIM_ERR`).
        LimitsExceeded = 0x08 => "limits exceeded",
        /// The resource is in the wrong state (`MLX5_CMD_STAT_BAD_RES_STATE_ERR`).
        BadResourceState = 0x09 => "bad resource state",
        /// An index is out of range (`MLX5_CMD_STAT_IX_ERR`).
        BadIndex = 0x0a => "bad index",
        /// No free resources (`MLX5_CMD_STAT_NO_RES_ERR`).
        NoResources = 0x0f => "no resources",
        /// The QP is in the wrong state (`MLX5_CMD_STAT_BAD_QP_STATE_ERR`).
        BadQpState = 0x10 => "bad QP state",
        /// A packet was malformed and discarded (`MLX5_CMD_STAT_BAD_PKT_ERR`).
        BadPacket = 0x30 => "bad packet (discarded)",
        /// The queue is too small for the outstanding CQEs (`MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES_ERR`).
        BadSizeOutstandingCqes = 0x40 => "bad size too many outstanding CQEs",
        /// The inbox length is wrong for the command (`MLX5_CMD_STAT_BAD_INP_LEN_ERR`).
        BadInputLength = 0x50 => "bad input length",
        /// The outbox length is wrong for the command (`MLX5_CMD_STAT_BAD_OUTP_LEN_ERR`).
        BadOutputLength = 0x51 => "bad output length",
    }
}

impl CmdStatus {
    /// Whether the command succeeded.
    pub const fn is_ok(&self) -> bool {
        self.to_raw() == 0
    }

    /// The errno Linux maps this status to (positive; 0 for `Ok`; `EIO` for
    /// unknown values).
    pub const fn errno(&self) -> i32 {
        match Self::from_raw(self.to_raw()) {
            Self::Ok => 0,
            Self::InternalError => EIO,
            Self::BadOperation => EINVAL,
            Self::BadParameter => EINVAL,
            Self::BadSystemState => EIO,
            Self::BadResource => EINVAL,
            Self::ResourceBusy => EBUSY,
            Self::NotReady => EAGAIN,
            Self::LimitsExceeded => ENOMEM,
            Self::BadResourceState => EINVAL,
            Self::BadIndex => EINVAL,
            Self::NoResources => EAGAIN,
            Self::BadQpState => EINVAL,
            Self::BadPacket => EINVAL,
            Self::BadSizeOutstandingCqes => EINVAL,
            Self::BadInputLength => EIO,
            Self::BadOutputLength => EIO,
            Self::Unknown(_) => EIO,
        }
    }
}

prm_enum! {
    /// Delivery status of a command queue entry: `status_own >> 1`, written
    /// by firmware when it returns the entry.
    pub enum DeliveryStatus: u8, unknown = "unknown status code" {
        /// The command was delivered (`MLX5_CMD_DELIVERY_STAT_OK`).
        Ok = 0x0 => "no errors",
        /// Entry or mailbox signature mismatch (`MLX5_CMD_DELIVERY_STAT_SIGNAT_ERR`).
        SignatureError = 0x1 => "signature error",
        /// Mailbox token differs from the entry's (`MLX5_CMD_DELIVERY_STAT_TOK_ERR`).
        TokenError = 0x2 => "token error",
        /// A mailbox block number is out of sequence (`MLX5_CMD_DELIVERY_STAT_BAD_BLK_NUM_ERR`).
        BadBlockNumber = 0x3 => "bad block number",
        /// `out_ptr` is misaligned (`MLX5_CMD_DELIVERY_STAT_OUT_PTR_ALIGN_ERR`).
        OutPtrAlignment = 0x4 => "output pointer not aligned to block size",
        /// `in_ptr` is misaligned (`MLX5_CMD_DELIVERY_STAT_IN_PTR_ALIGN_ERR`).
        InPtrAlignment = 0x5 => "input pointer not aligned to block size",
        /// Firmware failed internally (`MLX5_CMD_DELIVERY_STAT_FW_ERR`).
        FirmwareError = 0x6 => "firmware internal error",
        /// `inlen` is invalid (`MLX5_CMD_DELIVERY_STAT_IN_LENGTH_ERR`).
        InputLength = 0x7 => "command input length error",
        /// `outlen` is invalid (`MLX5_CMD_DELIVERY_STAT_OUT_LENGTH_ERR`).
        OutputLength = 0x8 => "command output length error",
        /// A reserved field was not zero (`MLX5_CMD_DELIVERY_STAT_RES_FLD_NOT_CLR_ERR`).
        ReservedNotCleared = 0x9 => "reserved fields not cleared",
        /// The entry's `type` is not a supported transport (`MLX5_CMD_DELIVERY_STAT_CMD_DESCR_ERR`).
        BadDescriptor = 0x10 => "bad command descriptor type",
    }
}

impl DeliveryStatus {
    /// Decodes the delivery status from a command entry's `status_own` byte.
    pub const fn from_status_own(status_own: u8) -> Self {
        Self::from_raw(status_own >> 1)
    }

    /// Whether the command was delivered.
    pub const fn is_ok(&self) -> bool {
        self.to_raw() == 0
    }

    /// The errno Linux maps this status to (positive; 0 for `Ok`; `EINVAL`
    /// for unknown values).
    pub const fn errno(&self) -> i32 {
        match Self::from_raw(self.to_raw()) {
            Self::Ok => 0,
            Self::SignatureError | Self::TokenError => EBADR,
            Self::BadBlockNumber | Self::OutPtrAlignment | Self::InPtrAlignment => EFAULT,
            Self::InputLength
            | Self::OutputLength
            | Self::BadDescriptor
            | Self::ReservedNotCleared => ENOMSG,
            Self::FirmwareError => EIO,
            Self::Unknown(_) => EINVAL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmd_status_values_names_and_errno() {
        assert_eq!(CmdStatus::from(0x03u8), CmdStatus::BadParameter);
        assert_eq!(CmdStatus::BadParameter.name(), "bad parameter");
        assert_eq!(CmdStatus::BadParameter.to_string(), "bad parameter(0x3)");
        assert_eq!(CmdStatus::NotReady.errno(), EAGAIN);
        assert_eq!(CmdStatus::ResourceBusy.errno(), EBUSY);
        assert_eq!(CmdStatus::LimitsExceeded.errno(), ENOMEM);
        assert_eq!(CmdStatus::BadInputLength.to_raw(), 0x50);
        assert_eq!(CmdStatus::BadSizeOutstandingCqes.to_raw(), 0x40);
        assert_eq!(CmdStatus::Ok.errno(), 0);
        assert!(CmdStatus::Ok.is_ok());
    }

    #[test]
    fn unknown_cmd_status() {
        let s = CmdStatus::from(0x77u8);
        assert_eq!(s, CmdStatus::Unknown(0x77));
        assert_eq!(u8::from(s), 0x77);
        assert_eq!(s.errno(), EIO);
        assert_eq!(s.to_string(), "unknown status(0x77)");
    }

    #[test]
    fn delivery_status() {
        // status_own 0x21: delivery status 0x10, owner bit set.
        let d = DeliveryStatus::from_status_own(0x21);
        assert_eq!(d, DeliveryStatus::BadDescriptor);
        assert_eq!(d.errno(), ENOMSG);
        assert_eq!(DeliveryStatus::SignatureError.errno(), EBADR);
        assert_eq!(DeliveryStatus::InPtrAlignment.errno(), EFAULT);
        assert_eq!(DeliveryStatus::FirmwareError.errno(), EIO);
        assert_eq!(DeliveryStatus::from_status_own(0x00), DeliveryStatus::Ok);
        let u = DeliveryStatus::from(0x33u8);
        assert_eq!(u.errno(), EINVAL);
        assert_eq!(u.to_string(), "unknown status code(0x33)");
        for v in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::from(u8::from(*v)), *v);
        }
    }
}
