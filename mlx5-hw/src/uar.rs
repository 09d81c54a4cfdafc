//! UAR pages: the doorbell registers the driver writes (offsets inside one
//! 4 KiB UAR page of BAR0) and the values it writes to them
//! (`MLX5_CQ_DOORBELL`, `MLX5_BF_OFFSET` of doorbell.h,
//! `MLX5_EQ_DOORBELL_OFFSET` of core/eq.c, `MLX5_CQ_DB_REQ_*` of cq.h).
//!
//! UAR page `n` sits at BAR0 + `n * UAR_PAGE_SIZE` (with 4 KiB UARs, i.e.
//! `uar_4k` set or 4 KiB host pages).

/// Size of one UAR page in BAR0, in bytes (`MLX5_ADAPTER_PAGE_SIZE`).
pub const UAR_PAGE_SIZE: usize = 4096;
/// log2 of [`UAR_PAGE_SIZE`] (`MLX5_ADAPTER_PAGE_SHIFT`).
pub const UAR_PAGE_SHIFT: u32 = 12;

/// CQ doorbell: 64-bit write of `[arm word, cqn]` (`MLX5_CQ_DOORBELL`).
pub const CQ_DOORBELL: usize = 0x20;
/// EQ doorbell that updates the consumer index and arms the EQ (`MLX5_EQ_DOORBELL_OFFSET`).
pub const EQ_DOORBELL_ARM: usize = 0x40;
/// EQ doorbell that updates the consumer index only (arm doorbell + 8).
pub const EQ_DOORBELL_UPDATE_CI: usize = 0x48;
/// First BlueFlame register / send doorbell of the page (`MLX5_BF_OFFSET`).
pub const BF_OFFSET: usize = 0x800;
/// Second (alternate) buffer of the first BlueFlame register.
pub const BF_OFFSET_ALT: usize = BF_OFFSET + BF_BUF_SIZE;
/// Size of one BlueFlame buffer: half a BlueFlame register, in bytes.
pub const BF_BUF_SIZE: usize = 0x100;
/// BlueFlame register size for the usual `log_bf_reg_size` = 9, in bytes.
pub const BF_REG_SIZE_DEFAULT: usize = 0x200;
/// BlueFlame registers per UAR page (`MLX5_BFREGS_PER_UAR`).
pub const BFREGS_PER_UAR: usize = 4;
/// BlueFlame registers per UAR page that Linux treats as non-fast-path (`MLX5_NON_FP_BFREGS_PER_UAR`).
pub const NON_FP_BFREGS_PER_UAR: usize = 2;

/// CQ arm command: next completion of any kind (`MLX5_CQ_DB_REQ_NOT`).
pub const CQ_DB_REQ_NOT: u32 = 0 << 24;
/// CQ arm command: next solicited completion only (`MLX5_CQ_DB_REQ_NOT_SOL`).
pub const CQ_DB_REQ_NOT_SOL: u32 = 1 << 24;
/// Shift of the 2-bit arm sequence number (`cmd_sn`) in the CQ arm word.
pub const CQ_DB_SN_SHIFT: u32 = 28;
/// Mask of the arm sequence number before shifting.
pub const CQ_DB_SN_MASK: u32 = 0x3;
/// Mask of a 24-bit consumer index in CQ and EQ doorbells.
pub const DB_CI_MASK: u32 = 0x00ff_ffff;
/// Shift of the EQ number in the EQ doorbell value.
pub const EQ_DB_EQN_SHIFT: u32 = 24;

/// CQ doorbell record dword holding the consumer index (`MLX5_CQ_SET_CI`, rdma-core).
pub const CQ_SET_CI: usize = 0;
/// CQ doorbell record dword holding the last arm word (`MLX5_CQ_ARM_DB`, rdma-core).
pub const CQ_ARM_DB: usize = 1;

/// The CQ arm word: `sn << 28 | cmd | (ci & 0xffffff)`. It goes into the
/// CQ doorbell record's arm dword and is the first dword of the CQ doorbell.
pub const fn cq_arm_word(arm_sn: u32, cmd: u32, ci: u32) -> u32 {
    ((arm_sn & CQ_DB_SN_MASK) << CQ_DB_SN_SHIFT) | cmd | (ci & DB_CI_MASK)
}

/// The 64-bit value for [`CQ_DOORBELL`]: arm word in the high (first) dword,
/// CQ number in the low one; write it big-endian as one 64-bit store.
pub const fn cq_doorbell(arm_sn: u32, cmd: u32, ci: u32, cqn: u32) -> u64 {
    ((cq_arm_word(arm_sn, cmd, ci) as u64) << 32) | cqn as u64
}

/// The EQ doorbell value: `(ci & 0xffffff) | eqn << 24`, written big-endian
/// to [`EQ_DOORBELL_ARM`] or [`EQ_DOORBELL_UPDATE_CI`].
pub const fn eq_doorbell(ci: u32, eqn: u8) -> u32 {
    (ci & DB_CI_MASK) | ((eqn as u32) << EQ_DB_EQN_SHIFT)
}

/// Offset from the first UAR page to BlueFlame register `bfreg` (four per
/// page), for a device reporting `log_bf_reg_size` (Linux `map_offset`).
pub const fn bfreg_offset(bfreg: usize, log_bf_reg_size: u32) -> usize {
    (bfreg / BFREGS_PER_UAR) * UAR_PAGE_SIZE
        + (bfreg % BFREGS_PER_UAR) * (1 << log_bf_reg_size)
        + BF_OFFSET
}

/// Offset of UAR page `index` from the start of BAR0 (4 KiB UAR pages).
pub const fn uar_page_offset(index: u32) -> u64 {
    (index as u64) << UAR_PAGE_SHIFT
}

#[cfg(test)]
mod tests {
    use crate::ifc::{uar_page, UarPage};

    #[test]
    fn uar_page_layout_agrees_with_the_offsets() {
        let at = |f: &str| uar_page::INFO.field(f).map(|f| f.bit_off / 8);
        assert_eq!(at("cq_doorbell"), Some(CQ_DOORBELL));
        assert_eq!(at("eq_arm"), Some(EQ_DOORBELL_ARM));
        assert_eq!(at("eq_update_ci"), Some(EQ_DOORBELL_UPDATE_CI));
        assert_eq!(at("bf_reg_0"), Some(BF_OFFSET));
        assert_eq!(at("bf_reg_1"), Some(BF_OFFSET_ALT));
        assert_eq!(std::mem::size_of::<UarPage>(), UAR_PAGE_SIZE);
    }

    use super::*;

    #[test]
    fn offsets_match_headers() {
        assert_eq!(CQ_DOORBELL, 0x20);
        assert_eq!(EQ_DOORBELL_ARM, 0x40);
        assert_eq!(EQ_DOORBELL_UPDATE_CI, EQ_DOORBELL_ARM + 8);
        assert_eq!(BF_OFFSET, 0x800);
        assert_eq!(BF_OFFSET_ALT, 0x900);
        assert_eq!(BF_REG_SIZE_DEFAULT, 2 * BF_BUF_SIZE);
        assert_eq!(1 << UAR_PAGE_SHIFT, UAR_PAGE_SIZE);
    }

    #[test]
    fn doorbell_values() {
        assert_eq!(eq_doorbell(0x0123_4567, 0x89), 0x8923_4567);
        assert_eq!(cq_arm_word(1, CQ_DB_REQ_NOT_SOL, 0x10), 0x1100_0010);
        assert_eq!(cq_arm_word(5, CQ_DB_REQ_NOT, 0x0100_0000), 0x1000_0000);
        assert_eq!(
            cq_doorbell(3, CQ_DB_REQ_NOT, 7, 0x42),
            0x3000_0007_0000_0042
        );
        assert_eq!(bfreg_offset(0, 9), 0x800);
        assert_eq!(bfreg_offset(1, 9), 0xa00);
        assert_eq!(bfreg_offset(5, 9), 0x1a00);
        assert_eq!(uar_page_offset(3), 0x3000);
    }
}
