//! Numbers of the Ethernet objects (SQ, RQ, TIR, RQT, TIS): queue states,
//! work-queue types, dispatch and hash kinds, MODIFY bitmasks, as Linux 6.12's
//! `include/linux/mlx5/mlx5_ifc.h` names them (`MLX5_SQC_STATE_*`,
//! `MLX5_WQ_TYPE_*`, `MLX5_TIRC_DISP_TYPE_*`, ...). The layouts are in
//! [`crate::ifc`] (`sqc`, `rqc`, `wq`, `tirc`, `rqtc`, `tisc`).

/// `wq.wq_type`: a linked list of WQEs (`MLX5_WQ_TYPE_LINKED_LIST`).
pub const WQ_TYPE_LINKED_LIST: u64 = 0x0;
/// `wq.wq_type`: a cyclic ring (`MLX5_WQ_TYPE_CYCLIC`).
pub const WQ_TYPE_CYCLIC: u64 = 0x1;
/// `wq.wq_type`: a linked list of multi-packet WQEs
/// (`MLX5_WQ_TYPE_LINKED_LIST_STRIDING_RQ`).
pub const WQ_TYPE_LINKED_LIST_STRIDING_RQ: u64 = 0x2;
/// `wq.wq_type`: a cyclic ring of multi-packet WQEs
/// (`MLX5_WQ_TYPE_CYCLIC_STRIDING_RQ`).
pub const WQ_TYPE_CYCLIC_STRIDING_RQ: u64 = 0x3;

/// `sqc.state` / `rqc.state`: reset (`MLX5_SQC_STATE_RST`, `MLX5_RQC_STATE_RST`).
pub const QUEUE_STATE_RST: u64 = 0x0;
/// `sqc.state` / `rqc.state`: ready (`MLX5_SQC_STATE_RDY`, `MLX5_RQC_STATE_RDY`).
pub const QUEUE_STATE_RDY: u64 = 0x1;
/// `sqc.state` / `rqc.state`: error (`MLX5_SQC_STATE_ERR`, `MLX5_RQC_STATE_ERR`).
pub const QUEUE_STATE_ERR: u64 = 0x3;

/// `rqc.mem_rq_type`: the RQ has its own ring (`MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE`).
pub const RQC_MEM_RQ_TYPE_INLINE: u64 = 0x0;
/// `rqc.mem_rq_type`: the RQ takes buffers from an RMP (`MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_RMP`).
pub const RQC_MEM_RQ_TYPE_RMP: u64 = 0x1;

/// MODIFY_RQ `modify_bitmask`: `vsd` (`MLX5_MODIFY_RQ_IN_MODIFY_BITMASK_VSD`).
pub const MODIFY_RQ_BITMASK_VSD: u64 = 1 << 1;
/// MODIFY_RQ `modify_bitmask`: `scatter_fcs`.
pub const MODIFY_RQ_BITMASK_SCATTER_FCS: u64 = 1 << 2;
/// MODIFY_RQ `modify_bitmask`: `counter_set_id`.
pub const MODIFY_RQ_BITMASK_RQ_COUNTER_SET_ID: u64 = 1 << 3;

/// MODIFY_SQ `modify_bitmask`: `packet_pacing_rate_limit_index` (bit 0;
/// Linux names no constant, en_main.c's `mlx5e_modify_sq` sets `1`).
pub const MODIFY_SQ_BITMASK_PACKET_PACING_RATE_LIMIT_INDEX: u64 = 1 << 0;
/// MODIFY_SQ `modify_bitmask`: `qos_queue_group_id` (bit 2, `1 << 2` there).
pub const MODIFY_SQ_BITMASK_QOS_QUEUE_GROUP_ID: u64 = 1 << 2;

/// `tirc.disp_type`: deliver to `inline_rqn` (`MLX5_TIRC_DISP_TYPE_DIRECT`).
pub const TIRC_DISP_TYPE_DIRECT: u64 = 0x0;
/// `tirc.disp_type`: hash over the RQT `indirect_table` (`MLX5_TIRC_DISP_TYPE_INDIRECT`).
pub const TIRC_DISP_TYPE_INDIRECT: u64 = 0x1;

/// `tirc.rx_hash_fn`: none (`MLX5_RX_HASH_FN_NONE`).
pub const RX_HASH_FN_NONE: u64 = 0x0;
/// `tirc.rx_hash_fn`: inverted XOR8 (`MLX5_RX_HASH_FN_INVERTED_XOR8`).
pub const RX_HASH_FN_INVERTED_XOR8: u64 = 0x1;
/// `tirc.rx_hash_fn`: Toeplitz (`MLX5_RX_HASH_FN_TOEPLITZ`).
pub const RX_HASH_FN_TOEPLITZ: u64 = 0x2;

/// `ppcnt_reg.grp`: IEEE 802.3 counters (`MLX5_IEEE_802_3_COUNTERS_GROUP`).
pub const PPCNT_GRP_IEEE_802_3: u64 = 0x0;
/// `ppcnt_reg.grp`: RFC 2863 counters (`MLX5_RFC_2863_COUNTERS_GROUP`).
pub const PPCNT_GRP_RFC_2863: u64 = 0x1;
/// `ppcnt_reg.grp`: RFC 2819 counters (`MLX5_RFC_2819_COUNTERS_GROUP`).
pub const PPCNT_GRP_RFC_2819: u64 = 0x2;
/// `ppcnt_reg.grp`: RFC 3635 counters (`MLX5_RFC_3635_COUNTERS_GROUP`).
pub const PPCNT_GRP_RFC_3635: u64 = 0x3;
/// `ppcnt_reg.grp`: extended Ethernet counters (`MLX5_ETHERNET_EXTENDED_COUNTERS_GROUP`).
pub const PPCNT_GRP_ETHERNET_EXTENDED: u64 = 0x5;
/// `ppcnt_reg.grp`: per-priority counters (`MLX5_PER_PRIORITY_COUNTERS_GROUP`).
pub const PPCNT_GRP_PER_PRIORITY: u64 = 0x10;
/// `ppcnt_reg.grp`: per-traffic-class counters (`MLX5_PER_TRAFFIC_CLASS_COUNTERS_GROUP`).
pub const PPCNT_GRP_PER_TRAFFIC_CLASS: u64 = 0x11;
/// `ppcnt_reg.grp`: physical layer counters (`MLX5_PHYSICAL_LAYER_COUNTERS_GROUP`).
pub const PPCNT_GRP_PHYSICAL_LAYER: u64 = 0x12;
/// `ppcnt_reg.grp`: physical layer statistical counters
/// (`MLX5_PHYSICAL_LAYER_STATISTICAL_GROUP`).
pub const PPCNT_GRP_PHYSICAL_LAYER_STATISTICAL: u64 = 0x16;
