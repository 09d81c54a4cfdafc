//! Queue pair numbers of Linux's `include/linux/mlx5/qp.h` that are not a
//! layout: the `opt_param_mask` bits a QP state transition carries, and the
//! QP states `qpc.state` reports.
//!
//! A transition command (`init2rtr_qp_in`, `rtr2rts_qp_in`, ...) applies the
//! QPC fields its transition requires plus those optional ones whose bit is
//! set in `opt_param_mask`; firmware ignores the other optional fields.

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

/// `qpc.state`: reset (`MLX5_QP_STATE_RST`, `enum mlx5_qp_state`).
pub const QP_STATE_RST: u8 = 0;
/// `qpc.state`: initialized (`MLX5_QP_STATE_INIT`).
pub const QP_STATE_INIT: u8 = 1;
/// `qpc.state`: ready to receive (`MLX5_QP_STATE_RTR`).
pub const QP_STATE_RTR: u8 = 2;
/// `qpc.state`: ready to send (`MLX5_QP_STATE_RTS`).
pub const QP_STATE_RTS: u8 = 3;
/// `qpc.state`: send queue error (`MLX5_QP_STATE_SQER`).
pub const QP_STATE_SQER: u8 = 4;
/// `qpc.state`: send queue drained (`MLX5_QP_STATE_SQD`). Not 7: that is
/// `MLX5_QP_STATE_SQ_DRAINING`, which `mlx5_ifc.h` calls
/// `MLX5_QPC_STATE_SQD`; mlx5_ib's `to_ib_qp_state` reads both as
/// IB_QPS_SQD.
pub const QP_STATE_SQD: u8 = 5;
/// `qpc.state`: error (`MLX5_QP_STATE_ERR`).
pub const QP_STATE_ERR: u8 = 6;
/// `qpc.state`: the send queue is draining (`MLX5_QP_STATE_SQ_DRAINING`).
pub const QP_STATE_SQ_DRAINING: u8 = 7;
/// `qpc.state`: suspended (`MLX5_QP_STATE_SUSPENDED`).
pub const QP_STATE_SUSPENDED: u8 = 9;

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn qp_states_are_linuxs_enum_mlx5_qp_state() {
        // include/linux/mlx5/qp.h, enum mlx5_qp_state (8 is unnamed).
        let states = [
            QP_STATE_RST,
            QP_STATE_INIT,
            QP_STATE_RTR,
            QP_STATE_RTS,
            QP_STATE_SQER,
            QP_STATE_SQD,
            QP_STATE_ERR,
            QP_STATE_SQ_DRAINING,
            QP_STATE_SUSPENDED,
        ];
        assert_eq!(states, [0, 1, 2, 3, 4, 5, 6, 7, 9]);
    }
}
