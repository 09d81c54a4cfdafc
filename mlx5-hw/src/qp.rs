//! Queue pair numbers that are not a layout: the values of the QP context
//! (`qpc`) fields of `mlx5_ifc.h` (`MLX5_QPC_*`: service type, state, path
//! migration state, atomic mode), the receive queue types of
//! `include/linux/mlx5/qp.h`, and the `opt_param_mask` bits a QP state
//! transition carries.
//!
//! A transition command (`init2rtr_qp_in`, `rtr2rts_qp_in`, ...) applies the
//! QPC fields its transition requires plus those optional ones whose bit is
//! set in `opt_param_mask`; firmware ignores the other optional fields.

/// `arm_rq_in.op_mod`: arm an SRQ's limit (`MLX5_ARM_RQ_IN_OP_MOD_SRQ`).
pub const ARM_RQ_IN_OP_MOD_SRQ: u16 = 0x1;
/// `arm_xrc_srq_in.op_mod`: arm an XRC SRQ's limit
/// (`MLX5_ARM_XRC_SRQ_IN_OP_MOD_XRC_SRQ`).
pub const ARM_XRC_SRQ_IN_OP_MOD_XRC_SRQ: u16 = 0x1;
/// `xrc_srqc.state`: good (`MLX5_XRC_SRQC_STATE_GOOD`).
pub const XRC_SRQC_STATE_GOOD: u8 = 0x0;
/// `xrc_srqc.state`: in error (`MLX5_XRC_SRQC_STATE_ERROR`).
pub const XRC_SRQC_STATE_ERROR: u8 = 0x1;

/// The destination QP number of a UD packet to a multicast group (IBA
/// 10.5.2.3, Linux's `IB_MULTICAST_QPN`): each port hands a copy to the QPs
/// ATTACH_TO_MCG put in the group of its destination GID.
pub const MULTICAST_QPN: u32 = 0xff_ffff;

/// Whether a GID names a multicast group, as Linux's
/// `rdma_is_multicast_addr` reads it: IPv6 multicast (`ff00::/8`), or an
/// IPv4-mapped IPv4 multicast address (`::ffff:224.0.0.0/4`, RoCE v2 over
/// IPv4).
pub fn is_multicast_gid(gid: &[u8; 16]) -> bool {
    let v4_mapped = gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    gid[0] == 0xff || (v4_mapped && gid[12] & 0xf0 == 0xe0)
}

/// `qpc.st`: reliable connection (`MLX5_QPC_ST_RC`).
pub const QPC_ST_RC: u8 = 0x0;
/// `qpc.st`: unreliable connection (`MLX5_QPC_ST_UC`).
pub const QPC_ST_UC: u8 = 0x1;
/// `qpc.st`: unreliable datagram (`MLX5_QPC_ST_UD`).
pub const QPC_ST_UD: u8 = 0x2;
/// `qpc.st`: XRC (`MLX5_QPC_ST_XRC`).
pub const QPC_ST_XRC: u8 = 0x3;
/// `qpc.st`: DC initiator (`MLX5_QPC_ST_DCI`).
pub const QPC_ST_DCI: u8 = 0x5;
/// `qpc.st`: the SMI QP (`MLX5_QPC_ST_QP0`).
pub const QPC_ST_QP0: u8 = 0x7;
/// `qpc.st`: the GSI QP (`MLX5_QPC_ST_QP1`).
pub const QPC_ST_QP1: u8 = 0x8;
/// `qpc.st`: raw datagram (`MLX5_QPC_ST_RAW_DATAGRAM`).
pub const QPC_ST_RAW_DATAGRAM: u8 = 0x9;
/// `qpc.st`: the UMR QP (`MLX5_QPC_ST_REG_UMR`).
pub const QPC_ST_REG_UMR: u8 = 0xc;

/// `qpc.state`: reset (`MLX5_QPC_STATE_RST`).
pub const QPC_STATE_RST: u8 = 0x0;
/// `qpc.state`: initialized (`MLX5_QPC_STATE_INIT`).
pub const QPC_STATE_INIT: u8 = 0x1;
/// `qpc.state`: ready to receive (`MLX5_QPC_STATE_RTR`).
pub const QPC_STATE_RTR: u8 = 0x2;
/// `qpc.state`: ready to send (`MLX5_QPC_STATE_RTS`).
pub const QPC_STATE_RTS: u8 = 0x3;
/// `qpc.state`: send queue error (`MLX5_QPC_STATE_SQER`).
pub const QPC_STATE_SQER: u8 = 0x4;
/// `qpc.state`: error (`MLX5_QPC_STATE_ERR`).
pub const QPC_STATE_ERR: u8 = 0x6;
/// `qpc.state`: send queue drained (`MLX5_QPC_STATE_SQD`). `enum
/// mlx5_qp_state` of `qp.h` calls 7 `SQ_DRAINING` and 5 `SQD`; mlx5_ib's
/// `to_ib_qp_state` reads both as IB_QPS_SQD.
pub const QPC_STATE_SQD: u8 = 0x7;
/// `qpc.state`: suspended (`MLX5_QPC_STATE_SUSPENDED`).
pub const QPC_STATE_SUSPENDED: u8 = 0x9;

/// `qpc.pm_state`: armed (`MLX5_QPC_PM_STATE_ARMED`).
pub const QPC_PM_STATE_ARMED: u8 = 0x0;
/// `qpc.pm_state`: rearm (`MLX5_QPC_PM_STATE_REARM`).
pub const QPC_PM_STATE_REARM: u8 = 0x1;
/// `qpc.pm_state`: migrated, the state a QP without an alternate path is
/// created in (`MLX5_QPC_PM_STATE_MIGRATED`).
pub const QPC_PM_STATE_MIGRATED: u8 = 0x3;

/// `qpc.atomic_mode`: IB-spec 8-byte atomics (`MLX5_QPC_ATOMIC_MODE_IB_SPEC`).
pub const QPC_ATOMIC_MODE_IB_SPEC: u8 = 0x1;
/// `qpc.atomic_mode`: only 8-byte atomics (`MLX5_QPC_ATOMIC_MODE_ONLY_8B`).
pub const QPC_ATOMIC_MODE_ONLY_8B: u8 = 0x2;
/// `qpc.atomic_mode`: atomics up to 8 bytes (`MLX5_QPC_ATOMIC_MODE_UP_TO_8B`).
pub const QPC_ATOMIC_MODE_UP_TO_8B: u8 = 0x3;
/// `qpc.atomic_mode`: atomics up to 16 bytes (`MLX5_QPC_ATOMIC_MODE_UP_TO_16B`).
pub const QPC_ATOMIC_MODE_UP_TO_16B: u8 = 0x4;

/// `qpc.rq_type`: a receive queue of the QP's own (`MLX5_NON_ZERO_RQ`).
pub const NON_ZERO_RQ: u8 = 0x0;
/// `qpc.rq_type`: receives come from the SRQ in `srqn_rmpn_xrqn` (`MLX5_SRQ_RQ`).
pub const SRQ_RQ: u8 = 0x1;
/// `qpc.rq_type`: a cross-channel receive queue (`MLX5_CRQ_RQ`).
pub const CRQ_RQ: u8 = 0x2;
/// `qpc.rq_type`: no receive queue (`MLX5_ZERO_LEN_RQ`).
pub const ZERO_LEN_RQ: u8 = 0x3;

/// `opt_param_mask`: alternate address path (`MLX5_QP_OPTPAR_ALT_ADDR_PATH`).
pub const QP_OPTPAR_ALT_ADDR_PATH: u32 = 1 << 0;
/// `opt_param_mask`: `rre`, remote read enable (`MLX5_QP_OPTPAR_RRE`).
pub const QP_OPTPAR_RRE: u32 = 1 << 1;
/// `opt_param_mask`: `rae`, remote atomic enable (`MLX5_QP_OPTPAR_RAE`).
pub const QP_OPTPAR_RAE: u32 = 1 << 2;
/// `opt_param_mask`: `rwe`, remote write enable (`MLX5_QP_OPTPAR_RWE`).
pub const QP_OPTPAR_RWE: u32 = 1 << 3;
/// `opt_param_mask`: primary path `pkey_index` (`MLX5_QP_OPTPAR_PKEY_INDEX`).
pub const QP_OPTPAR_PKEY_INDEX: u32 = 1 << 4;
/// `opt_param_mask`: `q_key` (`MLX5_QP_OPTPAR_Q_KEY`).
pub const QP_OPTPAR_Q_KEY: u32 = 1 << 5;
/// `opt_param_mask`: `min_rnr_nak` (`MLX5_QP_OPTPAR_RNR_TIMEOUT`).
pub const QP_OPTPAR_RNR_TIMEOUT: u32 = 1 << 6;
/// `opt_param_mask`: the primary address path (`MLX5_QP_OPTPAR_PRIMARY_ADDR_PATH`).
pub const QP_OPTPAR_PRIMARY_ADDR_PATH: u32 = 1 << 7;
/// `opt_param_mask`: `log_sra_max` (`MLX5_QP_OPTPAR_SRA_MAX`).
pub const QP_OPTPAR_SRA_MAX: u32 = 1 << 8;
/// `opt_param_mask`: `log_rra_max` (`MLX5_QP_OPTPAR_RRA_MAX`).
pub const QP_OPTPAR_RRA_MAX: u32 = 1 << 9;
/// `opt_param_mask`: `pm_state` (`MLX5_QP_OPTPAR_PM_STATE`).
pub const QP_OPTPAR_PM_STATE: u32 = 1 << 10;
/// `opt_param_mask`: `retry_count` (`MLX5_QP_OPTPAR_RETRY_COUNT`).
pub const QP_OPTPAR_RETRY_COUNT: u32 = 1 << 12;
/// `opt_param_mask`: `rnr_retry` (`MLX5_QP_OPTPAR_RNR_RETRY`).
pub const QP_OPTPAR_RNR_RETRY: u32 = 1 << 13;
/// `opt_param_mask`: primary path `ack_timeout` (`MLX5_QP_OPTPAR_ACK_TIMEOUT`).
pub const QP_OPTPAR_ACK_TIMEOUT: u32 = 1 << 14;
/// `opt_param_mask`: `lag_tx_port_affinity` (`MLX5_QP_OPTPAR_LAG_TX_AFF`).
pub const QP_OPTPAR_LAG_TX_AFF: u32 = 1 << 15;
/// `opt_param_mask`: primary path `vhca_port_num` (`MLX5_QP_OPTPAR_PRI_PORT`).
pub const QP_OPTPAR_PRI_PORT: u32 = 1 << 16;
/// `opt_param_mask`: `srqn_rmpn_xrqn` (`MLX5_QP_OPTPAR_SRQN`).
pub const QP_OPTPAR_SRQN: u32 = 1 << 18;
/// `opt_param_mask`: `cqn_rcv` (`MLX5_QP_OPTPAR_CQN_RCV`).
pub const QP_OPTPAR_CQN_RCV: u32 = 1 << 19;
/// `opt_param_mask`: DC handshake (`MLX5_QP_OPTPAR_DC_HS`).
pub const QP_OPTPAR_DC_HS: u32 = 1 << 20;
/// `opt_param_mask`: DC access key (`MLX5_QP_OPTPAR_DC_KEY`).
pub const QP_OPTPAR_DC_KEY: u32 = 1 << 21;
/// `opt_param_mask`: `counter_set_id` (`MLX5_QP_OPTPAR_COUNTER_SET_ID`).
pub const QP_OPTPAR_COUNTER_SET_ID: u32 = 1 << 25;
/// `dctc.state`: the DCT takes connections (`MLX5_DCTC_STATE_ACTIVE`).
pub const DCTC_STATE_ACTIVE: u8 = 0x0;
/// `dctc.state`: DRAIN_DCT given, connections still open (`MLX5_DCTC_STATE_DRAINING`).
pub const DCTC_STATE_DRAINING: u8 = 0x1;
/// `dctc.state`: every connection closed after DRAIN_DCT (`MLX5_DCTC_STATE_DRAINED`).
pub const DCTC_STATE_DRAINED: u8 = 0x2;
/// `opt_param_mask_95_32`: `qpc_ext.dci_stream_channel_id`, the DCI stream
/// a RTS2RTS resets (rdma-core `MLX5_QPC_OPT_MASK_32_DCI_STREAM_CHANNEL_ID`).
pub const QPC_OPT_MASK_32_DCI_STREAM_CHANNEL_ID: u64 = 1 << 0;

/// `qpc.cs_res`: received SENDs up to 32 bytes land in the CQE
/// (`MLX5_RES_SCAT_DATA32_CQE`, mlx5_ib.h).
pub const RES_SCAT_DATA32_CQE: u8 = 0x1;
/// `qpc.cs_res`: received SENDs up to 64 bytes land in the 128-byte CQE
/// (`MLX5_RES_SCAT_DATA64_CQE`).
pub const RES_SCAT_DATA64_CQE: u8 = 0x2;
/// `qpc.cs_req`: READ responses and atomic results up to 32 bytes land
/// in the CQE (`MLX5_REQ_SCAT_DATA32_CQE`).
pub const REQ_SCAT_DATA32_CQE: u8 = 0x11;
/// `qpc.cs_req`: up to 64 bytes, in the 128-byte CQE
/// (`MLX5_REQ_SCAT_DATA64_CQE`).
pub const REQ_SCAT_DATA64_CQE: u8 = 0x22;

/// Bytes of a message that scatter to a CQE under `cs_res` (a
/// `RES_SCAT_*` value) on a CQ of `cqe_bytes` (64 or 128) entries: 32
/// in a 64-byte CQE, 64 in a 128-byte one only with DATA64; 0 for none.
pub const fn res_scatter_limit(cs_res: u8, cqe_bytes: u64) -> u64 {
    match cs_res {
        RES_SCAT_DATA32_CQE => 32,
        RES_SCAT_DATA64_CQE if cqe_bytes >= 128 => 64,
        RES_SCAT_DATA64_CQE => 32,
        _ => 0,
    }
}

/// Bytes of a READ response or atomic result that scatter to the
/// requester's CQE under `cs_req` (a `REQ_SCAT_*` value) on a send CQ of
/// `cqe_bytes` (64 or 128) entries: 32, or 64 in a 128-byte CQE with
/// DATA64; 0 for none.
pub const fn req_scatter_limit(cs_req: u8, cqe_bytes: u64) -> u64 {
    match cs_req {
        REQ_SCAT_DATA32_CQE => 32,
        REQ_SCAT_DATA64_CQE if cqe_bytes >= 128 => 64,
        REQ_SCAT_DATA64_CQE => 32,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qpc_values_match_headers() {
        assert_eq!(
            [QPC_ST_RC, QPC_ST_UC, QPC_ST_UD, QPC_ST_QP1, QPC_ST_REG_UMR],
            [0, 1, 2, 8, 0xc]
        );
        assert_eq!(
            [
                QPC_STATE_RST,
                QPC_STATE_RTS,
                QPC_STATE_SQER,
                QPC_STATE_ERR,
                QPC_STATE_SQD
            ],
            [0, 3, 4, 6, 7]
        );
        assert_eq!(QPC_PM_STATE_MIGRATED, 3);
        assert_eq!(QPC_ATOMIC_MODE_IB_SPEC, 1);
        assert_eq!([NON_ZERO_RQ, SRQ_RQ, ZERO_LEN_RQ], [0, 1, 3]);
    }

    #[test]
    fn optpar_bits_are_distinct_single_bits() {
        let all = [
            QP_OPTPAR_ALT_ADDR_PATH,
            QP_OPTPAR_RRE,
            QP_OPTPAR_RAE,
            QP_OPTPAR_RWE,
            QP_OPTPAR_PKEY_INDEX,
            QP_OPTPAR_Q_KEY,
            QP_OPTPAR_RNR_TIMEOUT,
            QP_OPTPAR_PRIMARY_ADDR_PATH,
            QP_OPTPAR_SRA_MAX,
            QP_OPTPAR_RRA_MAX,
            QP_OPTPAR_PM_STATE,
            QP_OPTPAR_RETRY_COUNT,
            QP_OPTPAR_RNR_RETRY,
            QP_OPTPAR_ACK_TIMEOUT,
            QP_OPTPAR_LAG_TX_AFF,
            QP_OPTPAR_PRI_PORT,
            QP_OPTPAR_SRQN,
            QP_OPTPAR_CQN_RCV,
            QP_OPTPAR_DC_HS,
            QP_OPTPAR_DC_KEY,
            QP_OPTPAR_COUNTER_SET_ID,
        ];
        let mut seen = 0u32;
        for b in all {
            assert_eq!(b.count_ones(), 1);
            assert_eq!(seen & b, 0);
            seen |= b;
        }
        // qp.h leaves bits 11, 17 and 22-24 unnamed.
        assert_eq!(seen, 0x023d_f7ff);
    }
}
