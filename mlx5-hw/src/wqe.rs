//! Work queue elements: the send opcodes, control-segment bits and sizes
//! the driver writes into send and receive WQEs (`MLX5_OPCODE_*` of
//! device.h, `MLX5_WQE_CTRL_*`, `MLX5_SEND_WQE_*` and friends of qp.h), and
//! the UMR / memory key bits that go with them.

use crate::macros::prm_enum;

/// Send WQE basic block size, in bytes (`MLX5_SEND_WQE_BB`).
pub const SEND_WQE_BB: usize = 64;
/// log2 of [`SEND_WQE_BB`].
pub const SEND_WQE_SHIFT: u32 = 6;
/// WQE data segment unit ("DS"), in bytes (`MLX5_SEND_WQE_DS`).
pub const SEND_WQE_DS: usize = 16;
/// Data segment units per basic block (`MLX5_SEND_WQEBB_NUM_DS`).
pub const SEND_WQEBB_NUM_DS: usize = SEND_WQE_BB / SEND_WQE_DS;
/// Most basic blocks one send WQE may span (`MLX5_SEND_WQE_MAX_WQEBBS`).
pub const SEND_WQE_MAX_WQEBBS: usize = 16;
/// Largest send WQE, in bytes (`MLX5_SEND_WQE_MAX_SIZE`).
pub const SEND_WQE_MAX_SIZE: usize = SEND_WQE_MAX_WQEBBS * SEND_WQE_BB;

/// Doorbell record index of the receive queue counter (`MLX5_RCV_DBR`).
pub const RCV_DBR: usize = 0;
/// Doorbell record index of the send queue counter (`MLX5_SND_DBR`).
pub const SND_DBR: usize = 1;

/// `fm_ce_se`: request a CQE for this WQE (`MLX5_WQE_CTRL_CQ_UPDATE`, CE = 2).
pub const WQE_CTRL_CQ_UPDATE: u8 = 2 << 2;
/// `fm_ce_se`: request a CQE and an EQE (`MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE`, CE = 3).
pub const WQE_CTRL_CQ_UPDATE_AND_EQE: u8 = 3 << 2;
/// `fm_ce_se`: solicited event (`MLX5_WQE_CTRL_SOLICITED`).
pub const WQE_CTRL_SOLICITED: u8 = 1 << 1;
/// `fm_ce_se`: initiator small fence (`MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE`).
pub const WQE_CTRL_INITIATOR_SMALL_FENCE: u8 = 1 << 5;
/// `fm_ce_se`: the fence rdma-core uses for `IBV_SEND_FENCE`
/// (`MLX5_WQE_CTRL_FENCE` of rdma-core = fence mode 4, small-and-fence).
pub const WQE_CTRL_FENCE: u8 = 4 << 5;

/// Fence mode (`fm_ce_se` bits 7:5): no fence (`MLX5_FENCE_MODE_NONE`).
pub const FENCE_MODE_NONE: u8 = 0 << 5;
/// Fence mode: initiator small fence (`MLX5_FENCE_MODE_INITIATOR_SMALL`).
pub const FENCE_MODE_INITIATOR_SMALL: u8 = 1 << 5;
/// Fence mode: fence (`MLX5_FENCE_MODE_FENCE`).
pub const FENCE_MODE_FENCE: u8 = 2 << 5;
/// Fence mode: strong ordering (`MLX5_FENCE_MODE_STRONG_ORDERING`).
pub const FENCE_MODE_STRONG_ORDERING: u8 = 3 << 5;
/// Fence mode: small fence and fence (`MLX5_FENCE_MODE_SMALL_AND_FENCE`).
pub const FENCE_MODE_SMALL_AND_FENCE: u8 = 4 << 5;

/// Mask of the DS count in `qpn_ds` (`MLX5_WQE_CTRL_DS_MASK`).
pub const WQE_CTRL_DS_MASK: u32 = 0x3f;
/// Shift of the QP number in `qpn_ds` (`MLX5_WQE_CTRL_QPN_SHIFT`).
pub const WQE_CTRL_QPN_SHIFT: u32 = 8;
/// Mask of the QP number in `qpn_ds` (`MLX5_WQE_CTRL_QPN_MASK`).
pub const WQE_CTRL_QPN_MASK: u32 = 0xffff_ff00;
/// Mask of the opcode in `opmod_idx_opcode` (`MLX5_WQE_CTRL_OPCODE_MASK`).
pub const WQE_CTRL_OPCODE_MASK: u32 = 0xff;
/// Shift of the WQE index in `opmod_idx_opcode` (`MLX5_WQE_CTRL_WQE_INDEX_SHIFT`).
pub const WQE_CTRL_WQE_INDEX_SHIFT: u32 = 8;
/// Mask of the WQE index in `opmod_idx_opcode` (`MLX5_WQE_CTRL_WQE_INDEX_MASK`).
pub const WQE_CTRL_WQE_INDEX_MASK: u32 = 0x00ff_ff00;
/// Shift of the opcode modifier in `opmod_idx_opcode` (bits 31:24).
pub const WQE_CTRL_OPMOD_SHIFT: u32 = 24;

/// The LSO opcode's modifier for a legacy multi-packet send WQE
/// (ConnectX-4 Lx's MPW, `multi_pkt_send_wqe`; `MLX5_OPC_MOD_MPW` of DPDK's
/// `mlx5_prm.h`): the Ethernet segment's `mss` is every packet's length.
pub const OPC_MOD_MPW: u8 = 0x01;
/// Packets a legacy MPW WQE carries at most (`MLX5_MPW_DSEG_MAX`).
pub const MPW_DSEG_MAX: usize = 5;
/// Inline segment `byte_count` flag: the data follows inline (`MLX5_INLINE_SEG`).
pub const INLINE_SEG: u32 = 0x8000_0000;
/// Mask of the inline byte count (`MLX5_WQE_INLINE_SEG_BYTE_COUNT_MASK`).
pub const WQE_INLINE_SEG_BYTE_COUNT_MASK: u32 = 0x3ff;
/// lkey that terminates a receive scatter list early (`MLX5_TERMINATE_SCATTER_LIST_LKEY`, rdma-core `MLX5_INVALID_LKEY`).
pub const TERMINATE_SCATTER_LIST_LKEY: u32 = 0x100;
/// `av.dqp_dct` bit 31: the address vector is the extended (48-byte) form (`MLX5_EXTENDED_UD_AV`).
pub const EXTENDED_UD_AV: u32 = 0x8000_0000;
/// Bytes of the base address vector (`struct mlx5_base_av`: the key, `dqp_dct`,
/// `stat_rate_sl`, `fl_mlid`, `rlid`), the form a datagram segment takes without
/// [`EXTENDED_UD_AV`].
pub const BASE_AV_BYTES: usize = 16;
/// Most scatter entries an RDMA read WQE of 512 bytes can hold (`MLX5_MAX_SGE_RD`).
pub const MAX_SGE_RD: usize = (512 - 16 - 16) / 16;

/// UMR control `flags`: translation offset is valid (`MLX5_UMR_TRANSLATION_OFFSET_EN`).
pub const UMR_TRANSLATION_OFFSET_EN: u8 = 1 << 4;
/// UMR control `flags`: check for a key in use, and fail if it is not free
/// (`MLX5_UMR_CHECK_NOT_FREE`; Linux sets it to enable a free cache key,
/// libmlx5 names it `MLX5_WQE_UMR_CTRL_FLAG_CHECK_FREE` for type-2 binds).
pub const UMR_CHECK_NOT_FREE: u8 = 1 << 5;
/// UMR control `flags`: check for a free key, and fail if it is free
/// (`MLX5_UMR_CHECK_FREE`; Linux's rereg of a live key).
pub const UMR_CHECK_FREE: u8 = 2 << 5;
/// UMR control `flags`: fail unless the mkey is bound to the posting QP
/// (rdma-core `MLX5_WQE_UMR_CTRL_FLAG_CHECK_QPN`, local invalidation of a
/// type-2 window).
pub const UMR_CHECK_QPN: u8 = 1 << 3;
/// UMR control `flags`: the translation entries are inline (`MLX5_UMR_INLINE`).
pub const UMR_INLINE: u8 = 1 << 7;
/// `wqe_umr_repeat_block_seg.op` of a repeat block: what tells the device
/// the translation of a KLM-mode key is a repeat block, not a KLM list
/// (rdma-core's `umr_strided_seg_create`).
pub const UMR_REPEAT_BLOCK_OP: u32 = 0x400;
/// UMR translation entries are aligned to this many bytes (`MLX5_UMR_FLEX_ALIGNMENT`).
pub const UMR_FLEX_ALIGNMENT: usize = 0x40;
/// The unit of a UMR's translation offset (`xlt_offset` and
/// `xlt_offset_47_16` of the UMR control segment) and of its
/// `xlt_octowords`: 16 bytes (`MLX5_IB_UMR_OCTOWORD`). Linux writes entry
/// `idx` at `idx * entry bytes / 16` (`mlx5r_umr_update_offset`): MTT
/// entry `2n` is at offset `n`, KLM/KSM entry `n` at `n`.
pub const UMR_OCTOWORD: u64 = 16;
/// Bytes of one MTT entry (`struct mlx5_mtt`: the page address with
/// `rd_en`/`wr_en` in bits 1:0).
pub const MTT_ENTRY_BYTES: u64 = 8;

/// UMR `mkey_mask`: length (`MLX5_MKEY_MASK_LEN`).
pub const MKEY_MASK_LEN: u64 = 1 << 0;
/// UMR `mkey_mask`: page size (`MLX5_MKEY_MASK_PAGE_SIZE`).
pub const MKEY_MASK_PAGE_SIZE: u64 = 1 << 1;
/// UMR `mkey_mask`: start address (`MLX5_MKEY_MASK_START_ADDR`).
pub const MKEY_MASK_START_ADDR: u64 = 1 << 6;
/// UMR `mkey_mask`: protection domain (`MLX5_MKEY_MASK_PD`).
pub const MKEY_MASK_PD: u64 = 1 << 7;
/// UMR `mkey_mask`: remote invalidate enable (`MLX5_MKEY_MASK_EN_RINVAL`).
pub const MKEY_MASK_EN_RINVAL: u64 = 1 << 8;
/// UMR `mkey_mask`: signature error enable (`MLX5_MKEY_MASK_EN_SIGERR`).
pub const MKEY_MASK_EN_SIGERR: u64 = 1 << 9;
/// UMR `mkey_mask`: BSF enable (`MLX5_MKEY_MASK_BSF_EN`).
pub const MKEY_MASK_BSF_EN: u64 = 1 << 12;
/// UMR `mkey_mask`: key byte (`MLX5_MKEY_MASK_KEY`).
pub const MKEY_MASK_KEY: u64 = 1 << 13;
/// UMR `mkey_mask`: QP number (`MLX5_MKEY_MASK_QPN`).
pub const MKEY_MASK_QPN: u64 = 1 << 14;
/// UMR `mkey_mask`: local read access (`MLX5_MKEY_MASK_LR`).
pub const MKEY_MASK_LR: u64 = 1 << 17;
/// UMR `mkey_mask`: local write access (`MLX5_MKEY_MASK_LW`).
pub const MKEY_MASK_LW: u64 = 1 << 18;
/// UMR `mkey_mask`: remote read access (`MLX5_MKEY_MASK_RR`).
pub const MKEY_MASK_RR: u64 = 1 << 19;
/// UMR `mkey_mask`: remote write access (`MLX5_MKEY_MASK_RW`).
pub const MKEY_MASK_RW: u64 = 1 << 20;
/// UMR `mkey_mask`: atomic access (`MLX5_MKEY_MASK_A`).
pub const MKEY_MASK_A: u64 = 1 << 21;
/// UMR `mkey_mask`: small fence (`MLX5_MKEY_MASK_SMALL_FENCE`).
pub const MKEY_MASK_SMALL_FENCE: u64 = 1 << 23;
/// UMR `mkey_mask`: relaxed ordering for writes (`MLX5_MKEY_MASK_RELAXED_ORDERING_WRITE`).
pub const MKEY_MASK_RELAXED_ORDERING_WRITE: u64 = 1 << 25;
/// UMR `mkey_mask`: free bit (`MLX5_MKEY_MASK_FREE`).
pub const MKEY_MASK_FREE: u64 = 1 << 29;
/// UMR `mkey_mask`: upper page-size bits (`MLX5_MKEY_MASK_PAGE_SIZE_5`).
pub const MKEY_MASK_PAGE_SIZE_5: u64 = 1 << 42;
/// UMR `mkey_mask`: relaxed ordering for reads (`MLX5_MKEY_MASK_RELAXED_ORDERING_READ`).
pub const MKEY_MASK_RELAXED_ORDERING_READ: u64 = 1 << 47;

/// `mkey_seg.flags` access: local read (`MLX5_PERM_LOCAL_READ`).
pub const PERM_LOCAL_READ: u8 = 1 << 2;
/// `mkey_seg.flags` access: local write (`MLX5_PERM_LOCAL_WRITE`).
pub const PERM_LOCAL_WRITE: u8 = 1 << 3;
/// `mkey_seg.flags` access: remote read (`MLX5_PERM_REMOTE_READ`).
pub const PERM_REMOTE_READ: u8 = 1 << 4;
/// `mkey_seg.flags` access: remote write (`MLX5_PERM_REMOTE_WRITE`).
pub const PERM_REMOTE_WRITE: u8 = 1 << 5;
/// `mkey_seg.flags` access: atomic (`MLX5_PERM_ATOMIC`).
pub const PERM_ATOMIC: u8 = 1 << 6;
/// mkc `access_mode` (`access_mode_4_2 << 2 | access_mode_1_0`): physical
/// addresses, the key covers the IOVA space (`MLX5_MKC_ACCESS_MODE_PA`).
pub const MKC_ACCESS_MODE_PA: u8 = 0x0;
/// mkc `access_mode`: a translation table of pages (`MLX5_MKC_ACCESS_MODE_MTT`).
pub const MKC_ACCESS_MODE_MTT: u8 = 0x1;
/// mkc `access_mode`: a list of (key, address, length) entries (`MLX5_MKC_ACCESS_MODE_KLMS`).
pub const MKC_ACCESS_MODE_KLMS: u8 = 0x2;
/// mkc `access_mode`: fixed-size (key, address) entries (`MLX5_MKC_ACCESS_MODE_KSM`).
pub const MKC_ACCESS_MODE_KSM: u8 = 0x3;
/// mkc `access_mode`: software-owned ICM (`MLX5_MKC_ACCESS_MODE_SW_ICM`).
pub const MKC_ACCESS_MODE_SW_ICM: u8 = 0x4;
/// mkc `access_mode`: device memory (`MLX5_MKC_ACCESS_MODE_MEMIC`).
pub const MKC_ACCESS_MODE_MEMIC: u8 = 0x5;
/// mkc `access_mode`: crossing vhca (`MLX5_MKC_ACCESS_MODE_CROSSING`).
pub const MKC_ACCESS_MODE_CROSSING: u8 = 0x6;
/// MTT entry bit: the page may be read (`mlx5_ifc_mtt_bits.rd_en`,
/// Linux's `MLX5_IB_MTT_READ`). An entry with neither bit is not present:
/// an access raises a page fault (ODP).
pub const MTT_RD_EN: u64 = 1 << (63 - crate::ifc::mtt::RD_EN.off);
/// MTT entry bit: the page may be written (`mtt.wr_en`, `MLX5_IB_MTT_WRITE`).
pub const MTT_WR_EN: u64 = 1 << (63 - crate::ifc::mtt::WR_EN.off);
/// Both: a present, writable page (`MLX5_IB_MTT_PRESENT`).
pub const MTT_PRESENT: u64 = MTT_RD_EN | MTT_WR_EN;
/// log2 of the smallest page an mkey's MTT may use: 4 KiB, whatever the
/// 6-bit mkc `log_page_size` could say (`MLX5_ADAPTER_PAGE_SHIFT`).
pub const MKC_MIN_LOG_PAGE_SIZE: u32 = 12;
/// How many bits of mkc `log_page_size` the device honours: 5 (pages up to
/// 2^31 bytes), or all 6 where `cmd_hca_cap_2.umr_log_entity_size_5` is set
/// (Linux's `mlx5_umem_mkc_find_best_pgsz`).
pub const fn mkc_log_page_size_bits(umr_log_entity_size_5: bool) -> u32 {
    if umr_log_entity_size_5 {
        6
    } else {
        5
    }
}
/// The largest mkc `log_page_size` the device takes (see
/// [`mkc_log_page_size_bits`]): 31, or 63 with `umr_log_entity_size_5`.
pub const fn mkc_max_log_page_size(umr_log_entity_size_5: bool) -> u32 {
    (1 << mkc_log_page_size_bits(umr_log_entity_size_5)) - 1
}
/// `mkey_seg.flags`: UMR may modify this mkey (`MLX5_PERM_UMR_EN`).
pub const PERM_UMR_EN: u8 = 1 << 7;
/// `mkey_seg.status`: the mkey is free (`MLX5_MKEY_STATUS_FREE`).
pub const MKEY_STATUS_FREE: u8 = 1 << 6;
/// `mkey_seg.flags_pd` bit: remote invalidate allowed (`MLX5_MKEY_REMOTE_INVAL`).
pub const MKEY_REMOTE_INVAL: u32 = 1 << 24;
/// `mkey_seg.flags_pd` bit: BSF enabled (`MLX5_MKEY_BSF_EN`).
pub const MKEY_BSF_EN: u32 = 1 << 30;

prm_enum! {
    /// Send WQE opcode: `wqe_ctrl_seg.opmod_idx_opcodebits 7:0`.
    pub enum WqeOpcode: u8, unknown = "unknown WQE opcode" {
        /// No operation.
        Nop = 0x00 => "NOP",
        /// Send with invalidate (the rkey to invalidate goes in `imm`).
        SendInval = 0x01 => "SEND_INVAL",
        /// RDMA write.
        RdmaWrite = 0x08 => "RDMA_WRITE",
        /// RDMA write with immediate.
        RdmaWriteImm = 0x09 => "RDMA_WRITE_IMM",
        /// Send.
        Send = 0x0a => "SEND",
        /// Send with immediate.
        SendImm = 0x0b => "SEND_IMM",
        /// Large send offload (TSO).
        Lso = 0x0e => "LSO",
        /// RDMA read.
        RdmaRead = 0x10 => "RDMA_READ",
        /// Atomic compare and swap.
        AtomicCs = 0x11 => "ATOMIC_CS",
        /// Atomic fetch and add.
        AtomicFa = 0x12 => "ATOMIC_FA",
        /// Masked atomic compare and swap.
        AtomicMaskedCs = 0x14 => "ATOMIC_MASKED_CS",
        /// Masked atomic fetch and add.
        AtomicMaskedFa = 0x15 => "ATOMIC_MASKED_FA",
        /// Bind a memory window.
        BindMw = 0x18 => "BIND_MW",
        /// Configuration command.
        ConfigCmd = 0x1f => "CONFIG_CMD",
        /// Set a protection signature value.
        SetPsv = 0x20 => "SET_PSV",
        /// Get a protection signature value.
        GetPsv = 0x21 => "GET_PSV",
        /// Check a protection signature value.
        CheckPsv = 0x22 => "CHECK_PSV",
        /// Dump.
        Dump = 0x23 => "DUMP",
        /// User-mode memory registration (also local invalidate).
        Umr = 0x25 => "UMR",
        /// Remote get PSV.
        RgetPsv = 0x26 => "RGET_PSV",
        /// Remote check PSV.
        RcheckPsv = 0x27 => "RCHECK_PSV",
        /// Enhanced multi-packet send.
        EnhancedMpsw = 0x29 => "ENHANCED_MPSW",
        /// Flow table access.
        FlowTblAccess = 0x2c => "FLOW_TBL_ACCESS",
        /// Advanced steering operation (ASO) access.
        AccessAso = 0x2d => "ACCESS_ASO",
    }
}

/// `wqe_ctrl_seg.opmod_idx_opcode`: opcode modifier, 16-bit WQE index
/// (the producer counter) and opcode.
pub const fn opmod_idx_opcode(opmod: u8, wqe_index: u16, opcode: WqeOpcode) -> u32 {
    ((opmod as u32) << WQE_CTRL_OPMOD_SHIFT)
        | ((wqe_index as u32) << WQE_CTRL_WQE_INDEX_SHIFT)
        | opcode.to_raw() as u32
}

/// `wqe_ctrl_seg.qpn_ds`: 24-bit QP number and the WQE size in 16-byte units.
pub const fn qpn_ds(qpn: u32, ds: u8) -> u32 {
    ((qpn << WQE_CTRL_QPN_SHIFT) & WQE_CTRL_QPN_MASK) | (ds as u32 & WQE_CTRL_DS_MASK)
}

/// Number of 64-byte basic blocks a WQE of `ds` 16-byte units occupies.
pub const fn wqebbs_for_ds(ds: usize) -> usize {
    ds.div_ceil(SEND_WQEBB_NUM_DS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_headers() {
        assert_eq!(WqeOpcode::RdmaWrite.to_raw(), 0x08);
        assert_eq!(WqeOpcode::Send.to_raw(), 0x0a);
        assert_eq!(WqeOpcode::AtomicCs.to_raw(), 0x11);
        assert_eq!(WqeOpcode::AtomicMaskedFa.to_raw(), 0x15);
        assert_eq!(WqeOpcode::Umr.to_raw(), 0x25);
        assert_eq!(WQE_CTRL_CQ_UPDATE, 0x08);
        assert_eq!(WQE_CTRL_SOLICITED, 0x02);
        assert_eq!(WQE_CTRL_FENCE, FENCE_MODE_SMALL_AND_FENCE);
        assert_eq!(SEND_WQE_BB, 1 << SEND_WQE_SHIFT);
        assert_eq!(INLINE_SEG, 0x8000_0000);
        assert_eq!(MAX_SGE_RD, 30);
        assert_eq!(WqeOpcode::from(0x0bu8).to_string(), "SEND_IMM(0xb)");
        assert_eq!(WqeOpcode::from(0x30u8), WqeOpcode::Unknown(0x30));
    }

    #[test]
    fn ctrl_segment_words() {
        assert_eq!(opmod_idx_opcode(0, 0x1234, WqeOpcode::Send), 0x0012_340a);
        assert_eq!(opmod_idx_opcode(1, 0xffff, WqeOpcode::Umr), 0x01ff_ff25);
        assert_eq!(qpn_ds(0xabcdef, 3), 0xabcd_ef03);
        assert_eq!(qpn_ds(0x1ab_cdef, 0x43), 0xabcd_ef03);
        assert_eq!(wqebbs_for_ds(4), 1);
        assert_eq!(wqebbs_for_ds(5), 2);
    }
}
