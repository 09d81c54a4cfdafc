//! Completion queue entries: the opcode, syndrome and `op_own` bits the
//! device writes into a CQE (`MLX5_CQE_*` of cq.h and device.h), and the CQ
//! numbers the driver sends in the CQ context.

use crate::macros::prm_enum;

/// Size of a basic CQE, in bytes.
pub const CQE_SIZE: usize = crate::ifc::cqe64::SIZE_BYTES;
/// Byte offset of `op_own` in a 64-byte CQE.
pub const CQE_OP_OWN_OFFSET: usize = crate::ifc::cqe64::OP_OWN.off / 8;

/// `op_own` bit 0: the ownership bit; it flips on every pass over the CQ.
pub const CQE_OWNER_MASK: u8 = 0x1;
/// `op_own` bit 1: the completed WQE was solicited (`se`).
pub const CQE_SE_MASK: u8 = 0x2;
/// Shift of the 2-bit CQE format in `op_own` (bits 3:2).
pub const CQE_FORMAT_SHIFT: u8 = 2;
/// Mask of the CQE format after shifting.
pub const CQE_FORMAT_MASK: u8 = 0x3;
/// Shift of the 4-bit CQE opcode in `op_own` (bits 7:4).
pub const CQE_OPCODE_SHIFT: u8 = 4;

/// CQE format: no inline data (`MLX5_NO_INLINE_DATA`).
pub const CQE_FORMAT_NO_INLINE_DATA: u8 = 0;
/// CQE format: up to 32 bytes of data inline in the CQE (`MLX5_INLINE_DATA32_SEG`).
pub const CQE_FORMAT_INLINE_DATA32_SEG: u8 = 1;
/// CQE format: up to 64 bytes of data inline in a 128-byte CQE (`MLX5_INLINE_DATA64_SEG`).
pub const CQE_FORMAT_INLINE_DATA64_SEG: u8 = 2;
/// CQE format: a compressed CQE session (`MLX5_COMPRESSED`).
pub const CQE_FORMAT_COMPRESSED: u8 = 3;

/// Mask of the QP number in `sop_drop_qpn` / `s_wqe_opcode_qpn` (24 bits).
pub const CQE_QPN_MASK: u32 = 0x00ff_ffff;
/// Shift of the send WQE opcode in `s_wqe_opcode_qpn` / `sop_drop_qpn` (bits 31:24).
pub const CQE_S_WQE_OPCODE_SHIFT: u32 = 24;
/// Where a responder CQE's `flags_rqpn` says a GRH is present (bits 29:28;
/// mlx5_ib's `handle_responder` reads any of them as `IB_WC_GRH`).
pub const CQE_GRH_SHIFT: u32 = 28;
/// Where a responder CQE's `flags_rqpn` names the RoCE packet's network
/// header (bits 25:24, `MLX5_CQE_ROCE_L3_HEADER_TYPE_*`: mlx5_ib's
/// `wc->network_hdr_type`, which ib_core reads the GRH buffer by).
pub const CQE_ROCE_L3_HEADER_TYPE_SHIFT: u32 = 24;
/// `MLX5_CQE_ROCE_L3_HEADER_TYPE_GRH`: RoCE v1 (an IB GRH).
pub const CQE_ROCE_L3_HEADER_TYPE_GRH: u32 = 0x0;
/// `MLX5_CQE_ROCE_L3_HEADER_TYPE_IPV6`: RoCE v2 over IPv6.
pub const CQE_ROCE_L3_HEADER_TYPE_IPV6: u32 = 0x1;
/// `MLX5_CQE_ROCE_L3_HEADER_TYPE_IPV4`: RoCE v2 over IPv4 (the IPv4 header
/// in the last 20 bytes of the 40-byte GRH buffer).
pub const CQE_ROCE_L3_HEADER_TYPE_IPV4: u32 = 0x2;

/// An LRO CQE's segment count: the top byte of `srqn` (mlx5e's
/// `mlx5e_build_rx_skb`: `lro_num_seg = be32_to_cpu(cqe->srqn) >> 24`).
pub const CQE_LRO_NUM_SEG_SHIFT: u32 = 24;
/// An LRO CQE's PSH flag: bit 6 of `tcppsh_abort_dupack`
/// (`get_cqe_lro_tcppsh`).
pub const CQE_LRO_TCPPSH_SHIFT: u8 = 6;

/// CQ context `cqe_sz`: 64-byte CQEs (`CQE_STRIDE_64`).
pub const CQE_STRIDE_64: u8 = 0;
/// CQ context `cqe_sz`: 128-byte CQEs (`CQE_STRIDE_128`).
pub const CQE_STRIDE_128: u8 = 1;
/// CQ context `cqe_sz`: 64-byte CQEs padded to 128 bytes (`CQE_STRIDE_128_PAD`).
pub const CQE_STRIDE_128_PAD: u8 = 2;

/// CQ context `mini_cqe_res_format`: a mini CQE carries the RSS hash
/// result and the byte count (`MLX5_CQE_RES_FORMAT_HASH` of mlx5_ib).
pub const MINI_CQE_RES_FORMAT_HASH: u8 = 0;
/// `mini_cqe_res_format`: the checksum and the byte count
/// (`MLX5_CQE_FORMAT_CSUM`).
pub const MINI_CQE_RES_FORMAT_CSUM: u8 = 1;
/// `mini_cqe_res_format`: the flow tag and the stride index (DPDK's
/// `MLX5_CQE_RESP_FORMAT_FTAG_STRIDX`; cap `mini_cqe_resp_flow_tag`).
pub const MINI_CQE_RES_FORMAT_FTAG_STRIDX: u8 = 2;
/// `mini_cqe_res_format`: the checksum, the stride index and the byte
/// count (`MLX5_CQE_FORMAT_CSUM_STRIDX`; cap `mini_cqe_resp_stride_index`).
pub const MINI_CQE_RES_FORMAT_CSUM_STRIDX: u8 = 3;
/// CQ context `cqe_compression_layout`: a title CQE counting the session
/// in `byte_cnt`, then arrays of eight mini CQEs
/// (`MLX5_CQE_COMPRESS_LAYOUT_BASIC`).
pub const CQE_COMPRESS_LAYOUT_BASIC: u8 = 0;
/// `cqe_compression_layout`: mini CQE arrays that carry their own count
/// and validity iteration (`MLX5_CQE_COMPRESS_LAYOUT_ENHANCED`; cap
/// `enhanced_cqe_compression`).
pub const CQE_COMPRESS_LAYOUT_ENHANCED: u8 = 1;
/// Mini CQEs in one CQE slot (`MLX5_MINI_CQE_ARRAY_SIZE`).
pub const MINI_CQE_ARRAY_SIZE: usize = CQE_SIZE / crate::ifc::mini_cqe8::SIZE_BYTES;

/// `modify_cq_in.op_mod`: resize the CQ (`MLX5_CQ_OPMOD_RESIZE`); 0
/// modifies moderation.
pub const CQ_OPMOD_RESIZE: u16 = 1;
/// `modify_cq_in.resize_field_select` of a resize: `log_cq_size`
/// (`MLX5_MODIFY_CQ_MASK_LOG_SIZE`).
pub const MODIFY_CQ_MASK_LOG_SIZE: u32 = 1 << 0;
/// ... `page_offset` (`MLX5_MODIFY_CQ_MASK_PG_OFFSET`).
pub const MODIFY_CQ_MASK_PG_OFFSET: u32 = 1 << 1;
/// ... `log_page_size` (`MLX5_MODIFY_CQ_MASK_PG_SIZE`).
pub const MODIFY_CQ_MASK_PG_SIZE: u32 = 1 << 2;
/// `modify_cq_in.modify_field_select` of a moderation change: `cq_period`
/// (`MLX5_CQ_MODIFY_PERIOD`).
pub const CQ_MODIFY_PERIOD: u32 = 1 << 0;
/// ... `cq_max_count` (`MLX5_CQ_MODIFY_COUNT`).
pub const CQ_MODIFY_COUNT: u32 = 1 << 1;

/// CQ context `cq_period_mode`: the moderation period runs from the last
/// completion event (`MLX5_CQ_PERIOD_MODE_START_FROM_EQE`).
pub const CQ_PERIOD_MODE_START_FROM_EQE: u8 = 0;
/// CQ context `cq_period_mode`: the moderation period runs from the first
/// CQE after the last event (`MLX5_CQ_PERIOD_MODE_START_FROM_CQE`).
pub const CQ_PERIOD_MODE_START_FROM_CQE: u8 = 1;

/// CQ context state: armed (`MLX5_CQ_STATE_ARMED`).
pub const CQ_STATE_ARMED: u8 = 0x9;
/// CQ context state: fired, needs re-arming (`MLX5_CQ_STATE_FIRED`).
pub const CQ_STATE_FIRED: u8 = 0xa;
/// CQ context state: always armed (`MLX5_CQ_STATE_ALWAYS_ARMED`).
pub const CQ_STATE_ALWAYS_ARMED: u8 = 0xb;

/// `MLX5_CQE_SYND_FLUSHED_IN_ERROR`: the syndrome of WQEs flushed when the
/// QP entered the error state (same value as [`CqeSyndrome::WrFlushErr`]).
pub const CQE_SYND_FLUSHED_IN_ERROR: u8 = 5;

prm_enum! {
    /// CQE opcode: `op_own >> 4`.
    pub enum CqeOpcode: u8, unknown = "unknown CQE opcode" {
        /// Requester completion (send queue).
        Req = 0 => "REQ",
        /// Responder completion of an RDMA write with immediate.
        RespWrImm = 1 => "RESP_WR_IMM",
        /// Responder completion of a send.
        RespSend = 2 => "RESP_SEND",
        /// Responder completion of a send with immediate.
        RespSendImm = 3 => "RESP_SEND_IMM",
        /// Responder completion of a send with invalidate.
        RespSendInv = 4 => "RESP_SEND_INV",
        /// A CQ resize completed.
        ResizeCq = 5 => "RESIZE_CQ",
        /// Signature error.
        SigErr = 12 => "SIG_ERR",
        /// Requester error (the CQE is an `err_cqe`).
        ReqErr = 13 => "REQ_ERR",
        /// Responder error (the CQE is an `err_cqe`).
        RespErr = 14 => "RESP_ERR",
        /// Invalid CQE: software's initial value, never written by hardware.
        Invalid = 15 => "INVALID",
    }
}

prm_enum! {
    /// Error CQE syndrome: `err_cqe.syndrome`.
    pub enum CqeSyndrome: u8, unknown = "unknown CQE syndrome" {
        /// Local length error.
        LocalLengthErr = 0x01 => "LOCAL_LENGTH_ERR",
        /// Local QP operation error.
        LocalQpOpErr = 0x02 => "LOCAL_QP_OP_ERR",
        /// Local protection error.
        LocalProtErr = 0x04 => "LOCAL_PROT_ERR",
        /// Work request flushed in error.
        WrFlushErr = 0x05 => "WR_FLUSH_ERR",
        /// Memory window bind error.
        MwBindErr = 0x06 => "MW_BIND_ERR",
        /// Bad response.
        BadRespErr = 0x10 => "BAD_RESP_ERR",
        /// Local access error.
        LocalAccessErr = 0x11 => "LOCAL_ACCESS_ERR",
        /// Remote invalid request error.
        RemoteInvalReqErr = 0x12 => "REMOTE_INVAL_REQ_ERR",
        /// Remote access error.
        RemoteAccessErr = 0x13 => "REMOTE_ACCESS_ERR",
        /// Remote operation error.
        RemoteOpErr = 0x14 => "REMOTE_OP_ERR",
        /// Transport retry counter exceeded.
        TransportRetryExcErr = 0x15 => "TRANSPORT_RETRY_EXC_ERR",
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 0x16 => "RNR_RETRY_EXC_ERR",
        /// Remote aborted.
        RemoteAbortedErr = 0x22 => "REMOTE_ABORTED_ERR",
    }
}

/// The CQE opcode of an `op_own` byte.
pub const fn cqe_opcode(op_own: u8) -> CqeOpcode {
    CqeOpcode::from_raw(op_own >> CQE_OPCODE_SHIFT)
}

/// The ownership bit (0 or 1) of an `op_own` byte.
pub const fn cqe_owner(op_own: u8) -> u8 {
    op_own & CQE_OWNER_MASK
}

/// The CQE format (`CQE_FORMAT_*`) of an `op_own` byte.
pub const fn cqe_format(op_own: u8) -> u8 {
    (op_own >> CQE_FORMAT_SHIFT) & CQE_FORMAT_MASK
}

/// Whether the CQE at consumer index `ci` of a CQ with `2^log_cq_size`
/// entries belongs to software: its owner bit equals the pass parity of `ci`
/// and its opcode is not `INVALID`.
pub const fn cqe_is_sw_owned(op_own: u8, ci: u32, log_cq_size: u8) -> bool {
    let parity = ((ci >> log_cq_size) & 1) as u8;
    cqe_owner(op_own) == parity && op_own >> CQE_OPCODE_SHIFT != CqeOpcode::Invalid.to_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_cq_h() {
        assert_eq!(CqeOpcode::Req.to_raw(), 0);
        assert_eq!(CqeOpcode::RespSendInv.to_raw(), 4);
        assert_eq!(CqeOpcode::ReqErr.to_raw(), 13);
        assert_eq!(CqeOpcode::Invalid.to_raw(), 15);
        assert_eq!(CqeSyndrome::WrFlushErr.to_raw(), CQE_SYND_FLUSHED_IN_ERROR);
        assert_eq!(CqeSyndrome::RemoteAbortedErr.to_raw(), 0x22);
        assert_eq!(
            CqeSyndrome::from(0x15u8).to_string(),
            "TRANSPORT_RETRY_EXC_ERR(0x15)"
        );
        assert_eq!(CqeOpcode::from(7u8), CqeOpcode::Unknown(7));
        assert_eq!(u8::from(CqeOpcode::Unknown(7)), 7);
    }

    #[test]
    fn op_own_decoding() {
        // opcode 13 (REQ_ERR), format 0, se 1, owner 1.
        let op_own = 0xd3;
        assert_eq!(cqe_opcode(op_own), CqeOpcode::ReqErr);
        assert_eq!(cqe_owner(op_own), 1);
        assert_eq!(cqe_format(op_own), CQE_FORMAT_NO_INLINE_DATA);
        assert_eq!(op_own & CQE_SE_MASK, CQE_SE_MASK);
        assert_eq!(cqe_format(0x0c), CQE_FORMAT_COMPRESSED);
        // Initial CQE (INVALID, owner 1) is never software-owned.
        assert!(!cqe_is_sw_owned(0xf1, 0, 4));
        assert!(cqe_is_sw_owned(0x00, 3, 4));
        assert!(!cqe_is_sw_owned(0x00, 16, 4));
        assert!(cqe_is_sw_owned(0x01, 16, 4));
    }
}
