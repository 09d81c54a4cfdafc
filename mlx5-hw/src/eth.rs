//! Numbers of the Ethernet objects (SQ, RQ, TIR, RQT, TIS): queue states,
//! work-queue types, dispatch and hash kinds, MODIFY bitmasks, as Linux 6.12's
//! `include/linux/mlx5/mlx5_ifc.h` names them (`MLX5_SQC_STATE_*`,
//! `MLX5_WQ_TYPE_*`, `MLX5_TIRC_DISP_TYPE_*`, ...). The layouts are in
//! [`crate::ifc`] (`sqc`, `rqc`, `wq`, `tirc`, `rqtc`, `tisc`).

/// `rmpc.state`: ready (`MLX5_RMPC_STATE_RDY`).
pub const RMPC_STATE_RDY: u64 = 0x1;
/// `rmpc.state`: error (`MLX5_RMPC_STATE_ERR`).
pub const RMPC_STATE_ERR: u64 = 0x3;

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

/// `tirc.self_lb_block`: the TIR takes no unicast its own transport
/// domain's SQs send (`MLX5_TIRC_SELF_LB_BLOCK_BLOCK_UNICAST`).
pub const TIRC_SELF_LB_BLOCK_BLOCK_UNICAST: u64 = 0x1;
/// `tirc.self_lb_block`: nor multicast and broadcast
/// (`MLX5_TIRC_SELF_LB_BLOCK_BLOCK_MULTICAST`).
pub const TIRC_SELF_LB_BLOCK_BLOCK_MULTICAST: u64 = 0x2;
/// `tirc.lro_enable_mask` (`packet_merge_mask`): merge TCP over IPv4
/// (`MLX5_TIRC_PACKET_MERGE_MASK_IPV4_LRO`).
pub const TIRC_PACKET_MERGE_MASK_IPV4_LRO: u64 = 0x1;
/// `tirc.lro_enable_mask`: merge TCP over IPv6
/// (`MLX5_TIRC_PACKET_MERGE_MASK_IPV6_LRO`).
pub const TIRC_PACKET_MERGE_MASK_IPV6_LRO: u64 = 0x2;

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

/// Flow table type of the NIC receive pipeline (`FS_FT_NIC_RX`).
pub const FS_FT_NIC_RX: u8 = 0x0;
/// Flow table type of the NIC transmit pipeline (`FS_FT_NIC_TX`).
pub const FS_FT_NIC_TX: u8 = 0x1;
/// Flow table type of the receive sniffer (`FS_FT_SNIFFER_RX`): a copy
/// of every frame the port takes in.
pub const FS_FT_SNIFFER_RX: u8 = 0x5;
/// Flow table type of the transmit sniffer (`FS_FT_SNIFFER_TX`): a copy
/// of every frame the function sends.
pub const FS_FT_SNIFFER_TX: u8 = 0x6;

/// `match_criteria_enable`: the outer L2-L4 headers (`MLX5_MATCH_OUTER_HEADERS`).
pub const MATCH_OUTER_HEADERS: u8 = 1 << 0;
/// `match_criteria_enable`: misc parameters (`MLX5_MATCH_MISC_PARAMETERS`).
pub const MATCH_MISC_PARAMETERS: u8 = 1 << 1;
/// `match_criteria_enable`: the inner (tunnelled) headers (`MLX5_MATCH_INNER_HEADERS`).
pub const MATCH_INNER_HEADERS: u8 = 1 << 2;

/// `flow_context.action`: allow (`MLX5_FLOW_CONTEXT_ACTION_ALLOW`).
pub const FLOW_CONTEXT_ACTION_ALLOW: u64 = 0x1;
/// `flow_context.action`: drop (`MLX5_FLOW_CONTEXT_ACTION_DROP`).
pub const FLOW_CONTEXT_ACTION_DROP: u64 = 0x2;
/// `flow_context.action`: forward to the destination list (`MLX5_FLOW_CONTEXT_ACTION_FWD_DEST`).
pub const FLOW_CONTEXT_ACTION_FWD_DEST: u64 = 0x4;
/// `flow_context.action`: count into the counter list (`MLX5_FLOW_CONTEXT_ACTION_COUNT`).
pub const FLOW_CONTEXT_ACTION_COUNT: u64 = 0x8;

/// `rx_hash_field_select.l3_prot_type`: IPv4 (`MLX5_L3_PROT_TYPE_IPV4`).
pub const L3_PROT_TYPE_IPV4: u64 = 0;
/// `rx_hash_field_select.l3_prot_type`: IPv6 (`MLX5_L3_PROT_TYPE_IPV6`).
pub const L3_PROT_TYPE_IPV6: u64 = 1;
/// `rx_hash_field_select.l4_prot_type`: TCP (`MLX5_L4_PROT_TYPE_TCP`).
pub const L4_PROT_TYPE_TCP: u64 = 0;
/// `rx_hash_field_select.l4_prot_type`: UDP (`MLX5_L4_PROT_TYPE_UDP`).
pub const L4_PROT_TYPE_UDP: u64 = 1;
/// `rx_hash_field_select.selected_fields`: source IP (`MLX5_HASH_FIELD_SEL_SRC_IP`).
pub const HASH_FIELD_SEL_SRC_IP: u64 = 1 << 0;
/// `selected_fields`: destination IP (`MLX5_HASH_FIELD_SEL_DST_IP`).
pub const HASH_FIELD_SEL_DST_IP: u64 = 1 << 1;
/// `selected_fields`: L4 source port (`MLX5_HASH_FIELD_SEL_L4_SPORT`).
pub const HASH_FIELD_SEL_L4_SPORT: u64 = 1 << 2;
/// `selected_fields`: L4 destination port (`MLX5_HASH_FIELD_SEL_L4_DPORT`).
pub const HASH_FIELD_SEL_L4_DPORT: u64 = 1 << 3;
/// `selected_fields`: IPsec SPI (`MLX5_HASH_FIELD_SEL_IPSEC_SPI`).
pub const HASH_FIELD_SEL_IPSEC_SPI: u64 = 1 << 4;
/// Bytes of `tirc.rx_hash_toeplitz_key`.
pub const TOEPLITZ_KEY_LEN: usize = 40;

/// `cqe64.hds_ip_ext`: the L2 header is good (`CQE_L2_OK`).
pub const CQE_L2_OK: u8 = 1 << 0;
/// `cqe64.hds_ip_ext`: the IP header checksum is good (`CQE_L3_OK`).
pub const CQE_L3_OK: u8 = 1 << 1;
/// `cqe64.hds_ip_ext`: the TCP/UDP checksum is good (`CQE_L4_OK`).
pub const CQE_L4_OK: u8 = 1 << 2;
/// `cqe64.tls_outer_l3_tunneled` bit 0: a tunnelled packet whose inner
/// headers the CQE's header types and checksum bits describe, for a TIR
/// with `tunneled_offload_en` (Linux's `cqe_is_tunneled`, DPDK's
/// `MLX5_CQE_RX_TUNNEL_PACKET`).
pub const CQE_RX_TUNNEL_PACKET: u8 = 1 << 0;
/// `cqe64.tls_outer_l3_tunneled` bit 1: a tunnelled packet's outer L3
/// header is IPv6 (0: IPv4; DPDK's `MLX5_CQE_RX_OUTER_PACKET`).
pub const CQE_RX_OUTER_IPV6: u8 = 1 << 1;
/// `cqe64.l4_l3_hdr_type` bit 0: the frame had a VLAN tag (`cqe_has_vlan`).
pub const CQE_VLAN_PRESENT: u8 = 1 << 0;
/// Shift of the L3 header type in `cqe64.l4_l3_hdr_type` (bits 3:2, `get_cqe_l3_hdr_type`).
pub const CQE_L3_HDR_TYPE_SHIFT: u8 = 2;
/// Shift of the L4 header type in `cqe64.l4_l3_hdr_type` (bits 6:4, `get_cqe_l4_hdr_type`).
pub const CQE_L4_HDR_TYPE_SHIFT: u8 = 4;
/// L3 header type: none (`CQE_L3_HDR_TYPE_NONE`).
pub const CQE_L3_HDR_TYPE_NONE: u8 = 0x0;
/// L3 header type: IPv6 (`CQE_L3_HDR_TYPE_IPV6`).
pub const CQE_L3_HDR_TYPE_IPV6: u8 = 0x1;
/// L3 header type: IPv4 (`CQE_L3_HDR_TYPE_IPV4`).
pub const CQE_L3_HDR_TYPE_IPV4: u8 = 0x2;
/// L4 header type: none (`CQE_L4_HDR_TYPE_NONE`).
pub const CQE_L4_HDR_TYPE_NONE: u8 = 0x0;
/// L4 header type: TCP without ACK (`CQE_L4_HDR_TYPE_TCP_NO_ACK`).
pub const CQE_L4_HDR_TYPE_TCP_NO_ACK: u8 = 0x1;
/// L4 header type: UDP (`CQE_L4_HDR_TYPE_UDP`).
pub const CQE_L4_HDR_TYPE_UDP: u8 = 0x2;
/// L4 header type: TCP carrying an ACK and data (`CQE_L4_HDR_TYPE_TCP_ACK_AND_DATA`).
pub const CQE_L4_HDR_TYPE_TCP_ACK_AND_DATA: u8 = 0x4;
/// `cqe64.rss_hash_type`: the IP type bits 3:2 (`CQE_RSS_HTYPE_IP`; 1 IPv4, 2 IPv6).
pub const CQE_RSS_HTYPE_IP: u8 = 0x0c;
/// `cqe64.rss_hash_type`: the L4 type bits 7:6 (`CQE_RSS_HTYPE_L4`; 1 TCP, 2 UDP).
pub const CQE_RSS_HTYPE_L4: u8 = 0xc0;
/// `cqe64.rss_hash_type`: IPv4 in `CQE_RSS_HTYPE_IP`.
pub const CQE_RSS_IPV4: u8 = 1 << 2;
/// `cqe64.rss_hash_type`: IPv6 in `CQE_RSS_HTYPE_IP`.
pub const CQE_RSS_IPV6: u8 = 2 << 2;
/// `cqe64.rss_hash_type`: TCP in `CQE_RSS_HTYPE_L4`.
pub const CQE_RSS_TCP: u8 = 1 << 6;
/// `cqe64.rss_hash_type`: UDP in `CQE_RSS_HTYPE_L4`.
pub const CQE_RSS_UDP: u8 = 2 << 6;

/// `wqe_eth_seg.cs_flags`: compute the IPv4 header checksum (`MLX5_ETH_WQE_L3_CSUM`).
pub const ETH_WQE_L3_CSUM: u8 = 1 << 6;
/// `wqe_eth_seg.cs_flags`: compute the TCP/UDP checksum (`MLX5_ETH_WQE_L4_CSUM`).
pub const ETH_WQE_L4_CSUM: u8 = 1 << 7;
/// `wqe_eth_seg.cs_flags`: compute the inner (tunnelled) IPv4 header
/// checksum (`MLX5_ETH_WQE_L3_INNER_CSUM`).
pub const ETH_WQE_L3_INNER_CSUM: u8 = 1 << 4;
/// `wqe_eth_seg.cs_flags`: compute the inner TCP/UDP checksum
/// (`MLX5_ETH_WQE_L4_INNER_CSUM`).
pub const ETH_WQE_L4_INNER_CSUM: u8 = 1 << 5;

/// Bytes of the two MAC addresses an Ethernet header starts with (a VLAN
/// tag is inserted, or stripped, after them).
pub const ETH_ADDRS_LEN: usize = 12;
/// Bytes of a VLAN tag: its protocol identifier and TCI.
pub const VLAN_HLEN: usize = 4;
/// Tag protocol identifier of an 802.1Q C-VLAN tag (`ETH_P_8021Q`).
pub const ETH_P_8021Q: u16 = 0x8100;
/// Tag protocol identifier of an 802.1ad S-VLAN tag (`ETH_P_8021AD`).
pub const ETH_P_8021AD: u16 = 0x88a8;
/// Ethernet's minimum frame, FCS excluded (Linux's `ETH_ZLEN`): the port
/// pads a shorter one with zeros (`pad_tx_eth_packet`).
pub const ETH_ZLEN: usize = 60;

/// `wqe_eth_seg.insert.type` (the place of `inline_hdr.sz`, a union in
/// `mlx5_wqe_eth_seg`): the device inserts the VLAN tag of
/// `insert.vlan_tci` (the place of `inline_hdr.start`) after the MAC
/// addresses; the WQE then carries no inline headers
/// (`MLX5_ETH_WQE_INSERT_VLAN`; offered as `wqe_vlan_insert`).
pub const ETH_WQE_INSERT_VLAN: u16 = 1 << 15;
/// `wqe_eth_seg.insert.type`: the inserted tag is an S-VLAN (802.1ad)
/// rather than a C-VLAN (802.1Q) (`MLX5_ETH_WQE_SVLAN`).
pub const ETH_WQE_SVLAN: u16 = 1 << 0;

/// Ethernet offload caps' `wqe_inline_mode`: every send WQE inlines its
/// L2 headers (`MLX5_CAP_INLINE_MODE_L2`, Linux's `vport.h`).
pub const CAP_INLINE_MODE_L2: u8 = 0;
/// `wqe_inline_mode`: the NIC vport context's `min_wqe_inline_mode` says
/// what (`MLX5_CAP_INLINE_MODE_VPORT_CONTEXT`).
pub const CAP_INLINE_MODE_VPORT_CONTEXT: u8 = 1;
/// `wqe_inline_mode`: nothing need be inline
/// (`MLX5_CAP_INLINE_MODE_NOT_REQUIRED`).
pub const CAP_INLINE_MODE_NOT_REQUIRED: u8 = 2;
/// `nic_vport_context.min_wqe_inline_mode`: no headers need be inline
/// (`MLX5_INLINE_MODE_NONE`, Linux's `device.h`).
pub const INLINE_MODE_NONE: u8 = 0;

/// Striding RQs: `wq.log_wqe_num_of_strides` v in 0..=9 means 2^(9 + v)
/// strides a WQE (`MLX5_MPWQE_LOG_NUM_STRIDES_BASE`, Linux's `device.h`);
/// 10..=15 mean 2^(v - 7), 8 down to 3 (`MLX5_MPWQE_LOG_NUM_STRIDES_EXT_BASE`,
/// where the caps' `ext_stride_num_range` allows; mlx5_ib's `fw_map`).
pub const MPWQE_LOG_NUM_STRIDES_BASE: u8 = 9;
/// The least log2 of strides a WQE with `ext_stride_num_range`.
pub const MPWQE_LOG_NUM_STRIDES_EXT_BASE: u8 = 3;
/// `wq.log_wqe_stride_size` v: strides of 2^(6 + v) bytes
/// (`MLX5_MPWQE_LOG_STRIDE_SZ_BASE`).
pub const MPWQE_LOG_STRIDE_SZ_BASE: u8 = 6;
/// A striding RQ's CQE `byte_cnt`: a filler CQE (the WQE's remaining
/// strides skipped, no packet: `mpwrq_is_filler_cqe`).
pub const MPWRQ_CQE_FILLER: u32 = 1 << 31;
/// The strides a striding RQ's CQE consumed: `byte_cnt >> 16`, 15 bits
/// (`mpwrq_get_cqe_consumed_strides`); the packet's bytes the low 16.
pub const MPWRQ_CQE_STRIDES_SHIFT: u32 = 16;

/// Inline header bytes an Ethernet send carries at least under the L2
/// inline mode: the Ethernet header (`MLX5E_MIN_INLINE`, `ETH_HLEN`).
pub const MIN_INLINE: usize = 14;

/// `dest_format_struct.destination_type`: a TIR (`MLX5_IFC_FLOW_DESTINATION_TYPE_TIR`).
pub const FLOW_DESTINATION_TYPE_TIR: u64 = 0x2;
