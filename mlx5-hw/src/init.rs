//! Bring-up numbers: the initialization segment at BAR0 offset 0 (struct
//! `mlx5_init_seg` of device.h, `mlx5_ifc_initial_seg_bits` of mlx5_ifc.h),
//! the command queue entry and mailbox constants (device.h, driver.h,
//! core/cmd.c), and the op_mods, capability types, register ids and port
//! states of the commands that bring an HCA up and down.
//!
//! Offsets are byte offsets from the start of BAR0; every register is a
//! big-endian dword unless noted.

use zerocopy::IntoBytes;

use crate::bits::BitField;
use crate::ifc::{
    cmd_layout, cmd_prot_block, health_buffer, init_seg, nop_in, nop_out, CmdLayout, CmdProtBlock,
};
use crate::macros::prm_enum;

/// The byte offset of a byte-aligned field of a `bytes` layout.
const fn byte(f: BitField) -> usize {
    f.off / 8
}

// ---------------------------------------------------------------------------
// Initialization segment offsets
// ---------------------------------------------------------------------------

/// Firmware revision: bits 31:16 minor, bits 15:0 major.
pub const ISEG_FW_REV: usize = byte(init_seg::FW_REV);
/// Command interface revision (bits 31:16) and firmware subminor (bits 15:0).
pub const ISEG_CMDIF_REV_FW_SUB: usize = byte(init_seg::CMDIF_REV_FW_SUB);
/// Command queue DMA address, bits 63:32.
pub const ISEG_CMDQ_ADDR_H: usize = byte(init_seg::CMDQ_ADDR_H);
/// Command queue address bits 31:12, nic_interface, log size and stride.
pub const ISEG_CMDQ_ADDR_L_SZ: usize = byte(init_seg::CMDQ_ADDR_L_SZ);
/// Command doorbell: writing bit i hands command slot i to firmware.
pub const ISEG_CMD_DBELL: usize = byte(init_seg::CMD_DBELL);
/// Bit 31: firmware still initializing; also nic_interface_supported and embedded_cpu.
pub const ISEG_INITIALIZING: usize = byte(init_seg::INITIALIZING);
/// Start of the 64-byte health buffer.
pub const ISEG_HEALTH: usize = byte(init_seg::HEALTH);
/// Health buffer `assert_exit_ptr`.
pub const ISEG_HEALTH_ASSERT_EXIT_PTR: usize = ISEG_HEALTH + byte(health_buffer::ASSERT_EXIT_PTR);
/// Health buffer `assert_callra`.
pub const ISEG_HEALTH_ASSERT_CALLRA: usize = ISEG_HEALTH + byte(health_buffer::ASSERT_CALLRA);
/// Health buffer `time`.
pub const ISEG_HEALTH_TIME: usize = ISEG_HEALTH + byte(health_buffer::TIME);
/// Health buffer `fw_ver` (all ones when the PCI link is dead).
pub const ISEG_HEALTH_FW_VER: usize = ISEG_HEALTH + byte(health_buffer::FW_VER);
/// Health buffer `hw_id`.
pub const ISEG_HEALTH_HW_ID: usize = ISEG_HEALTH + byte(health_buffer::HW_ID);
/// Health buffer `rfr_severity` byte.
pub const ISEG_HEALTH_RFR_SEVERITY: usize = ISEG_HEALTH + byte(health_buffer::RFR_SEVERITY);
/// Health buffer `irisc_index` byte.
pub const ISEG_HEALTH_IRISC_INDEX: usize = ISEG_HEALTH + byte(health_buffer::IRISC_INDEX);
/// Health buffer `synd` byte (health syndrome).
pub const ISEG_HEALTH_SYND: usize = ISEG_HEALTH + byte(health_buffer::SYND);
/// Health buffer `ext_synd` (big-endian 16 bits).
pub const ISEG_HEALTH_EXT_SYND: usize = ISEG_HEALTH + byte(health_buffer::EXT_SYND);
/// Size of the health buffer, in bytes.
pub const HEALTH_BUFFER_SIZE: usize = health_buffer::SIZE_BYTES;
/// `no_dram_nic_offset` (mlx5_ifc.h's initial_seg; a reserved word in device.h).
pub const ISEG_NO_DRAM_NIC_OFFSET: usize = ISEG_HEALTH + HEALTH_BUFFER_SIZE;
/// Firmware command execution timeout (see [`iseg_timeout_ms`]).
pub const ISEG_CMD_EXEC_TO: usize = byte(init_seg::CMD_EXEC_TO);
/// Firmware initialization timeout (see [`iseg_timeout_ms`]); 0 when not provided.
pub const ISEG_CMD_Q_INIT_TO: usize = byte(init_seg::CMD_Q_INIT_TO);
/// Free-running internal timer, bits 63:32.
pub const ISEG_INTERNAL_TIMER_H: usize = byte(init_seg::INTERNAL_TIMER_H);
/// Free-running internal timer, bits 31:0.
pub const ISEG_INTERNAL_TIMER_L: usize = byte(init_seg::INTERNAL_TIMER_L);
/// Health syndrome (bits 31:24) and a counter live firmware increments (bits 23:0).
pub const ISEG_HEALTH_COUNTER: usize = byte(init_seg::HEALTH_COUNTER);
/// Real-time clock, high dword.
pub const ISEG_REAL_TIME_H: usize = byte(init_seg::REAL_TIME_H);
/// Real-time clock, low dword.
pub const ISEG_REAL_TIME_L: usize = byte(init_seg::REAL_TIME_L);
/// IEEE 1588 clock (big-endian 64 bits).
pub const ISEG_IEEE1588_CLK: usize = byte(init_seg::IEEE1588_CLK);
/// IEEE 1588 clock type.
pub const ISEG_IEEE1588_CLK_TYPE: usize = byte(init_seg::IEEE1588_CLK_TYPE);
/// Bit 0 clears the legacy INTx interrupt.
pub const ISEG_CLR_INTX: usize = byte(init_seg::CLR_INTX);
/// Size of the initialization segment, in bytes.
pub const ISEG_SIZE: usize = init_seg::SIZE_BYTES;

// ---------------------------------------------------------------------------
// Initialization segment fields
// ---------------------------------------------------------------------------

/// Command interface revision this crate speaks (`CMD_IF_REV`).
pub const CMDIF_REV: u16 = 5;
/// Shift of the command interface revision in `cmdif_rev_fw_sub`.
pub const CMDIF_REV_SHIFT: u32 = 16;
/// Shift of the firmware minor revision in `fw_rev`.
pub const FW_REV_MINOR_SHIFT: u32 = 16;
/// Mask of the 16-bit firmware major revision in `fw_rev` and subminor in `cmdif_rev_fw_sub`.
pub const FW_REV_FIELD_MASK: u32 = 0xffff;

/// `initializing` bit 31: firmware has not finished initializing.
pub const INITIALIZING_BIT: u32 = 1 << 31;
/// `initializing` bit 30: firmware supports reset (`MLX5_FW_RESET_SUPPORTED_OFFSET`).
pub const FW_RESET_SUPPORTED_BIT: u32 = 1 << 30;
/// Shift of the 3-bit `nic_interface_supported` field in `initializing` (bits 26:24).
pub const NIC_INTERFACE_SUPPORTED_SHIFT: u32 = 24;
/// `initializing` bit 23: this function is the embedded CPU (ECPF).
pub const EMBEDDED_CPU_BIT: u32 = 1 << 23;

/// Address bits of `cmdq_addr_l_sz` (bits 31:12; the queue is 4 KiB aligned).
pub const CMDQ_ADDR_L_MASK: u32 = 0xffff_f000;
/// Shift of nic_interface in `cmdq_addr_l_sz` (`MLX5_NIC_IFC_OFFSET`).
pub const NIC_INTERFACE_SHIFT: u32 = 8;
/// Mask of nic_interface after shifting: Linux reads 3 bits (the ifc declares
/// 2 bits at 9:8, but the SW_RESET value is 7).
pub const NIC_INTERFACE_MASK: u32 = 0x7;
/// Shift of `log_cmdq_size` in `cmdq_addr_l_sz` (bits 7:4).
pub const LOG_CMDQ_SIZE_SHIFT: u32 = 4;
/// Mask of `log_cmdq_size` and `log_cmdq_stride` after shifting.
pub const LOG_CMDQ_FIELD_MASK: u32 = 0xf;

prm_enum! {
    /// NIC interface state: `cmdq_addr_l_sz` bits 10:8
    /// (`MLX5_INITIAL_SEG_NIC_INTERFACE_*`). The driver writes DISABLED to
    /// finish a fast teardown; firmware reports DISABLED or SW_RESET on errors.
    pub enum NicInterface: u8, unknown = "unknown nic_interface" {
        /// The full driver owns the NIC.
        FullDriver = 0x0 => "FULL_DRIVER",
        /// The NIC interface is disabled.
        Disabled = 0x1 => "DISABLED",
        /// NIC without DRAM.
        NoDramNic = 0x2 => "NO_DRAM_NIC",
        /// Firmware is going through a software reset.
        SwReset = 0x7 => "SW_RESET",
    }
}

/// The firmware major revision of a `fw_rev` read.
pub const fn fw_rev_major(fw_rev: u32) -> u16 {
    (fw_rev & FW_REV_FIELD_MASK) as u16
}

/// The firmware minor revision of a `fw_rev` read.
pub const fn fw_rev_minor(fw_rev: u32) -> u16 {
    (fw_rev >> FW_REV_MINOR_SHIFT) as u16
}

/// The firmware subminor revision of a `cmdif_rev_fw_sub` read.
pub const fn fw_rev_subminor(cmdif_rev_fw_sub: u32) -> u16 {
    (cmdif_rev_fw_sub & FW_REV_FIELD_MASK) as u16
}

/// The command interface revision of a `cmdif_rev_fw_sub` read (must be [`CMDIF_REV`]).
pub const fn cmdif_rev(cmdif_rev_fw_sub: u32) -> u16 {
    (cmdif_rev_fw_sub >> CMDIF_REV_SHIFT) as u16
}

/// Whether an `initializing` read says firmware is still initializing.
pub const fn fw_initializing(initializing: u32) -> bool {
    initializing & INITIALIZING_BIT != 0
}

/// The nic_interface state of a `cmdq_addr_l_sz` read.
pub const fn nic_interface(cmdq_addr_l_sz: u32) -> NicInterface {
    NicInterface::from_raw(((cmdq_addr_l_sz >> NIC_INTERFACE_SHIFT) & NIC_INTERFACE_MASK) as u8)
}

/// log2 of the number of command queue entries, from a `cmdq_addr_l_sz` read.
pub const fn log_cmdq_size(cmdq_addr_l_sz: u32) -> u8 {
    ((cmdq_addr_l_sz >> LOG_CMDQ_SIZE_SHIFT) & LOG_CMDQ_FIELD_MASK) as u8
}

/// log2 of the command queue entry stride in bytes, from a `cmdq_addr_l_sz` read.
pub const fn log_cmdq_stride(cmdq_addr_l_sz: u32) -> u8 {
    (cmdq_addr_l_sz & LOG_CMDQ_FIELD_MASK) as u8
}

/// The `cmdq_addr_l_sz` value to write: the queue address bits 31:12 with a
/// nic_interface state (`FullDriver` at bring-up, `Disabled` for fast teardown).
pub const fn cmdq_addr_l_sz(addr_low: u32, nic: NicInterface) -> u32 {
    (addr_low & CMDQ_ADDR_L_MASK)
        | ((nic.to_raw() as u32 & NIC_INTERFACE_MASK) << NIC_INTERFACE_SHIFT)
}

/// Decodes `cmd_exec_to` / `cmd_q_init_to` to milliseconds: bits 19:0 value,
/// bits 30:29 unit (0 ms, 1 s, 2 min, 3 h).
pub const fn iseg_timeout_ms(reg: u32) -> u64 {
    let value = (reg & 0x000f_ffff) as u64;
    match (reg >> 29) & 0x3 {
        0 => value,
        1 => value * 1000,
        2 => value * 60 * 1000,
        _ => value * 60 * 60 * 1000,
    }
}

// ---------------------------------------------------------------------------
// Timeouts Linux uses when firmware does not say (lib/tout.c), milliseconds
// ---------------------------------------------------------------------------

/// Wait for `initializing` to clear before the command queue is set up, in ms.
pub const FW_PRE_INIT_TIMEOUT_MS: u64 = 120_000;
/// Poll interval while waiting for `initializing`, in ms.
pub const FW_PRE_INIT_WAIT_MS: u64 = 2;
/// Wait for `initializing` after the command queue is set up, in ms.
pub const FW_INIT_TIMEOUT_MS: u64 = 2_000;
/// Command execution timeout, in ms.
pub const CMD_TIMEOUT_MS: u64 = 60_000;
/// Fast-teardown wait for nic_interface to read DISABLED, in ms.
pub const TEARDOWN_TIMEOUT_MS: u64 = 3_000;
/// Page reclaim timeout, in ms.
pub const RECLAIM_PAGES_TIMEOUT_MS: u64 = 5_000;

// ---------------------------------------------------------------------------
// Command queue entries
// ---------------------------------------------------------------------------

/// Most command queue slots a device has (`MLX5_MAX_COMMANDS`).
pub const MAX_COMMANDS: usize = 32;
/// Size of a command queue entry (`struct mlx5_cmd_layout`), in bytes.
pub const CMD_ENTRY_SIZE: usize = cmd_layout::SIZE_BYTES;
/// Command entry `type`: PCI command transport (`MLX5_PCI_CMD_XPORT`).
pub const PCI_CMD_XPORT: u8 = 7;
/// `status_own` ownership value: software owns the entry (`CMD_OWNER_SW`).
pub const CMD_OWNER_SW: u8 = 0x0;
/// `status_own` ownership value: firmware owns the entry (`CMD_OWNER_HW`).
pub const CMD_OWNER_HW: u8 = 0x1;
/// Ownership bit of `status_own`.
pub const CMD_OWNER_MASK: u8 = 0x1;
/// Shift of the delivery status in `status_own` (bits 7:1).
pub const CMD_DELIVERY_STATUS_SHIFT: u8 = 1;
/// Input bytes carried inline in the entry (`in[4]`).
pub const CMD_INLINE_IN_SIZE: usize = cmd_layout::IN.width / 8;
/// Output bytes carried inline in the entry (`out[4]`).
pub const CMD_INLINE_OUT_SIZE: usize = cmd_layout::OUT.width / 8;

// ---------------------------------------------------------------------------
// Command mailboxes
// ---------------------------------------------------------------------------

/// Data bytes per mailbox block (`MLX5_CMD_DATA_BLOCK_SIZE`).
pub const CMD_DATA_BLOCK_SIZE: usize = cmd_prot_block::DATA.width / 8;
/// Size of a mailbox block (`struct mlx5_cmd_prot_block`), in bytes.
pub const CMD_PROT_BLOCK_SIZE: usize = cmd_prot_block::SIZE_BYTES;
/// Alignment Linux gives mailbox blocks (576 rounded up to a power of two), in bytes.
pub const CMD_PROT_BLOCK_ALIGN: usize = 1024;
/// Offset of `next` (big-endian 64-bit DMA address) in a mailbox block.
pub const MBOX_NEXT: usize = byte(cmd_prot_block::NEXT);
/// Offset of `block_num` (big-endian 32 bits) in a mailbox block.
pub const MBOX_BLOCK_NUM: usize = byte(cmd_prot_block::BLOCK_NUM);
/// Offset of `token` in a mailbox block.
pub const MBOX_TOKEN: usize = byte(cmd_prot_block::TOKEN);
/// Offset of `ctrl_sig` in a mailbox block.
pub const MBOX_CTRL_SIG: usize = byte(cmd_prot_block::CTRL_SIG);
/// Offset of `sig` in a mailbox block.
pub const MBOX_SIG: usize = byte(cmd_prot_block::SIG);

/// Mailbox blocks needed for a command message of `len` bytes: everything
/// past the 16 inline bytes, 512 bytes per block.
pub const fn mailbox_blocks(len: usize) -> usize {
    len.saturating_sub(CMD_INLINE_IN_SIZE)
        .div_ceil(CMD_DATA_BLOCK_SIZE)
}

/// The opcode of a command input. Every input begins as core/cmd.c's
/// `mlx5_ifc_mbox_in_bits` (opcode, uid, op_mod), which is NOP's header;
/// a short buffer reads 0.
pub fn cmd_opcode(input: &[u8]) -> u16 {
    nop_in::OPCODE.get(input) as u16
}

/// The op_mod of a command input (see [`cmd_opcode`]).
pub fn cmd_op_mod(input: &[u8]) -> u16 {
    nop_in::OP_MOD.get(input) as u16
}

/// The status and syndrome of a command output. Every output begins as
/// core/cmd.c's `mlx5_ifc_mbox_out_bits` (status, syndrome), which is NOP's
/// header; a short buffer reads 0.
pub fn cmd_status_syndrome(output: &[u8]) -> (u8, u32) {
    (
        nop_out::STATUS.get(output) as u8,
        nop_out::SYNDROME.get(output) as u32,
    )
}

/// Writes a command output's status and syndrome.
///
/// # Panics
/// If `output` is shorter than the 8-byte header (the caller sized it).
pub fn set_cmd_status_syndrome(output: &mut [u8], status: u8, syndrome: u32) {
    nop_out::STATUS.set(output, status.into());
    nop_out::SYNDROME.set(output, syndrome.into());
}

/// XOR of all bytes (`xor8_buf` of core/cmd.c): the command interface's signature.
pub fn xor8(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0, |a, b| a ^ b)
}

impl CmdLayout {
    /// Whether the delivery owner bit of `status_own` says firmware owns the entry.
    pub const fn hw_owned(&self) -> bool {
        self.status_own & CMD_OWNER_MASK == CMD_OWNER_HW
    }

    /// Sets `sig` so that the XOR over the 64 bytes is 0xff (core/cmd.c
    /// `set_signature`; the kernel signs with `status_own` already set).
    pub fn sign(&mut self) {
        self.sig = 0;
        self.sig = !xor8(self.as_bytes());
    }

    /// Whether the entry's signature checks out (core/cmd.c `verify_signature`).
    pub fn sig_ok(&self) -> bool {
        xor8(self.as_bytes()) == 0xff
    }
}

/// The control range of a mailbox block's signatures: `rsvd0` up to `sig`.
const MBOX_CTRL_FROM: usize = core::mem::offset_of!(CmdProtBlock, rsvd0);

impl CmdProtBlock {
    /// Sets `ctrl_sig` (over `rsvd0 .. ctrl_sig`) and `sig` (over every byte
    /// but `sig`), as core/cmd.c `calc_block_sig` does.
    pub fn sign(&mut self) {
        self.ctrl_sig = 0;
        self.sig = 0;
        self.ctrl_sig = !xor8(&self.as_bytes()[MBOX_CTRL_FROM..MBOX_CTRL_SIG]);
        self.sig = !xor8(&self.as_bytes()[..MBOX_SIG]);
    }

    /// Whether the block's signatures check out (core/cmd.c
    /// `verify_block_sig`): `rsvd0 .. sig` and the whole block each XOR to 0xff.
    pub fn sig_ok(&self) -> bool {
        let b = self.as_bytes();
        xor8(&b[MBOX_CTRL_FROM..MBOX_SIG]) == 0xff && xor8(b) == 0xff
    }
}

// ---------------------------------------------------------------------------
// Firmware pages
// ---------------------------------------------------------------------------

/// Size of a page given to firmware with MANAGE_PAGES, in bytes (`MLX5_ADAPTER_PAGE_SIZE`).
pub const FW_PAGE_SIZE: usize = 4096;
/// log2 of [`FW_PAGE_SIZE`] (`MLX5_ADAPTER_PAGE_SHIFT`).
pub const FW_PAGE_SHIFT: u32 = 12;

/// log2 of the quanta of a queue context's `page_offset` (qpc, cqc, srqc,
/// xrc_srqc, wq): it counts 1/64ths of the queue's page, `page_size / 64`
/// bytes (64 with 4 KiB pages, 2 KiB with the 128 KiB pages Linux's
/// `mlx5_umem_find_best_quantized_pgoff(.., page_offset, 64, ..)` picks for
/// a contiguous user buffer).
pub const LOG_PAGE_OFFSET_QUANTA: u32 = 6;

/// The byte offset into its first page of a queue whose context has
/// `page_offset` `field` and pages of `1 << log_page` bytes.
pub const fn page_offset_bytes(field: u64, log_page: u32) -> u64 {
    (field << log_page) >> LOG_PAGE_OFFSET_QUANTA
}

/// The `page_offset` field for a queue `offset` bytes into its first page
/// of `1 << log_page` bytes (the part below one quantum is lost).
pub const fn page_offset_field(offset: u64, log_page: u32) -> u64 {
    (offset & ((1 << log_page) - 1)) >> (log_page - LOG_PAGE_OFFSET_QUANTA)
}

prm_enum! {
    /// QUERY_PAGES op_mod: which page demand to ask about (`MLX5_QUERY_PAGES_IN_OP_MOD_*`).
    pub enum QueryPagesOpMod: u16, unknown = "unknown QUERY_PAGES op_mod" {
        /// Pages needed before INIT_HCA's capabilities are set.
        BootPages = 0x1 => "BOOT_PAGES",
        /// Pages needed by INIT_HCA.
        InitPages = 0x2 => "INIT_PAGES",
        /// Pages needed at run time.
        RegularPages = 0x3 => "REGULAR_PAGES",
    }
}

prm_enum! {
    /// MANAGE_PAGES op_mod (`MLX5_MANAGE_PAGES_IN_OP_MOD_*`; Linux's
    /// `MLX5_PAGES_CANT_GIVE` / `GIVE` / `TAKE`).
    pub enum ManagePagesOpMod: u16, unknown = "unknown MANAGE_PAGES op_mod" {
        /// The driver cannot give the requested pages.
        AllocationFail = 0x0 => "ALLOCATION_FAIL",
        /// The driver gives the listed pages.
        AllocationSuccess = 0x1 => "ALLOCATION_SUCCESS",
        /// Firmware returns pages to the driver.
        HcaReturnPages = 0x2 => "HCA_RETURN_PAGES",
    }
}

// ---------------------------------------------------------------------------
// HCA capabilities
// ---------------------------------------------------------------------------

/// QUERY_HCA_CAP mode: the maximum the device supports (`HCA_CAP_OPMOD_GET_MAX`).
pub const HCA_CAP_OPMOD_GET_MAX: u16 = 0;
/// QUERY_HCA_CAP mode: the current setting (`HCA_CAP_OPMOD_GET_CUR`).
pub const HCA_CAP_OPMOD_GET_CUR: u16 = 1;

prm_enum! {
    /// Capability type (`enum mlx5_cap_type`), the upper bits of the
    /// QUERY_HCA_CAP / SET_HCA_CAP op_mod.
    pub enum CapType: u8, unknown = "unknown capability type" {
        /// General device capabilities (`cmd_hca_cap`).
        General = 0x00 => "GENERAL",
        /// Ethernet offloads.
        EthernetOffloads = 0x01 => "ETHERNET_OFFLOADS",
        /// On-demand paging.
        Odp = 0x02 => "ODP",
        /// Atomic operations.
        Atomic = 0x03 => "ATOMIC",
        /// RoCE.
        Roce = 0x04 => "ROCE",
        /// IPoIB offloads.
        IpoibOffloads = 0x05 => "IPOIB_OFFLOADS",
        /// IPoIB enhanced offloads.
        IpoibEnhancedOffloads = 0x06 => "IPOIB_ENHANCED_OFFLOADS",
        /// NIC flow table.
        FlowTable = 0x07 => "FLOW_TABLE",
        /// E-switch flow table.
        EswitchFlowTable = 0x08 => "ESWITCH_FLOW_TABLE",
        /// E-switch.
        Eswitch = 0x09 => "ESWITCH",
        /// QoS.
        Qos = 0x0c => "QOS",
        /// Debug.
        Debug = 0x0d => "DEBUG",
        /// Reserved (14).
        Reserved14 = 0x0e => "RESERVED_14",
        /// Device memory.
        DevMem = 0x0f => "DEV_MEM",
        /// Reserved (16).
        Reserved16 = 0x10 => "RESERVED_16",
        /// TLS offload.
        Tls = 0x11 => "TLS",
        /// virtio/vDPA emulation.
        VdpaEmulation = 0x13 => "VDPA_EMULATION",
        /// Device events.
        DevEvent = 0x14 => "DEV_EVENT",
        /// IPsec offload.
        Ipsec = 0x15 => "IPSEC",
        /// Crypto.
        Crypto = 0x1a => "CRYPTO",
        /// MACsec offload.
        Macsec = 0x1f => "MACSEC",
        /// General device capabilities, part 2 (`cmd_hca_cap_2`).
        General2 = 0x20 => "GENERAL_2",
        /// Port selection.
        PortSelection = 0x25 => "PORT_SELECTION",
        /// Advanced virtualization.
        AdvVirtualization = 0x26 => "ADV_VIRTUALIZATION",
    }
}

/// QUERY_HCA_CAP op_mod: `cap_type << 1 | mode` ([`HCA_CAP_OPMOD_GET_MAX`]
/// or [`HCA_CAP_OPMOD_GET_CUR`]).
pub const fn query_hca_cap_op_mod(cap_type: CapType, mode: u16) -> u16 {
    ((cap_type.to_raw() as u16) << 1) | (mode & 1)
}

/// SET_HCA_CAP op_mod: `cap_type << 1`.
pub const fn set_hca_cap_op_mod(cap_type: CapType) -> u16 {
    (cap_type.to_raw() as u16) << 1
}

// ---------------------------------------------------------------------------
// TEARDOWN_HCA
// ---------------------------------------------------------------------------

prm_enum! {
    /// TEARDOWN_HCA profile (`MLX5_TEARDOWN_HCA_IN_PROFILE_*`).
    pub enum TeardownProfile: u16, unknown = "unknown teardown profile" {
        /// Orderly teardown.
        GracefulClose = 0x0 => "GRACEFUL_CLOSE",
        /// Forced teardown, for error paths.
        ForceClose = 0x1 => "FORCE_CLOSE",
        /// Prepare a fast teardown, finished by writing nic_interface = DISABLED.
        PrepareFastTeardown = 0x2 => "PREPARE_FAST_TEARDOWN",
    }
}

/// TEARDOWN_HCA output `state`: the forced/fast teardown succeeded.
pub const TEARDOWN_HCA_OUT_FORCE_STATE_SUCCESS: u8 = 0x0;
/// TEARDOWN_HCA output `state`: the forced/fast teardown failed; fall back to graceful.
pub const TEARDOWN_HCA_OUT_FORCE_STATE_FAIL: u8 = 0x1;

// ---------------------------------------------------------------------------
// ACCESS_REG
// ---------------------------------------------------------------------------

/// ACCESS_REG op_mod: write the register (`MLX5_ACCESS_REGISTER_IN_OP_MOD_WRITE`).
pub const ACCESS_REG_OP_MOD_WRITE: u16 = 0x0;
/// ACCESS_REG op_mod: read the register (`MLX5_ACCESS_REGISTER_IN_OP_MOD_READ`).
pub const ACCESS_REG_OP_MOD_READ: u16 = 0x1;

// ---------------------------------------------------------------------------
// MODIFY_MEMIC (device-memory operations)
// ---------------------------------------------------------------------------

/// MODIFY_MEMIC op_mod: map an operation's address (`MLX5_MODIFY_MEMIC_OP_MOD_ALLOC`).
pub const MODIFY_MEMIC_OP_MOD_ALLOC: u16 = 0x0;
/// MODIFY_MEMIC op_mod: unmap it (`MLX5_MODIFY_MEMIC_OP_MOD_DEALLOC`).
pub const MODIFY_MEMIC_OP_MOD_DEALLOC: u16 = 0x1;
/// `memic_operation_type`: atomic increment, a store adds the stored value
/// (rdma-core's test names it `MEMIC_ATOMIC_INCREMENT`; bit 0 of
/// `memic_operations`).
pub const MEMIC_OP_ATOMIC_INCREMENT: u8 = 0x0;
/// `memic_operation_type`: atomic test-and-set, a load returns the value
/// and leaves 1 (`MEMIC_ATOMIC_TEST_AND_SET`; bit 1 of `memic_operations`).
pub const MEMIC_OP_ATOMIC_TEST_AND_SET: u8 = 0x1;

/// HOST_ENDIANNESS register byte 0 for a little-endian host (`MLX5_SET_HOST_ENDIANNESS`).
pub const HOST_ENDIANNESS_LITTLE: u8 = 0x00;
/// HOST_ENDIANNESS register byte 0 for a big-endian host.
pub const HOST_ENDIANNESS_BIG: u8 = 0x80;

/// `atomic_caps.atomic_req_8B_endianness_mode`: 8-byte atomics in network
/// byte order (`MLX5_ATOMIC_REQ_MODE_BE`).
pub const ATOMIC_REQ_MODE_BE: u8 = 0x0;
/// `atomic_caps.atomic_req_8B_endianness_mode`: 8-byte atomics in host byte
/// order (`MLX5_ATOMIC_REQ_MODE_HOST_ENDIANNESS`), offered where
/// `supported_atomic_req_8B_endianness_mode_1` is set.
pub const ATOMIC_REQ_MODE_HOST_ENDIANNESS: u8 = 0x1;

prm_enum! {
    /// Access register id: ACCESS_REG's `register_id` (`MLX5_REG_*` of driver.h).
    pub enum RegisterId: u16, unknown = "unknown register" {
        /// QoS priority trust state.
        Qpts = 0x4002 => "QPTS",
        /// QoS ETS configuration.
        Qetcr = 0x4005 => "QETCR",
        /// QoS switch priority to traffic class.
        Qtct = 0x400a => "QTCT",
        /// QoS DSCP to priority mapping.
        Qpdpm = 0x4013 => "QPDPM",
        /// QoS capabilities.
        Qcam = 0x4019 => "QCAM",
        /// DCBX parameters.
        DcbxParam = 0x4020 => "DCBX_PARAM",
        /// DCBX application table.
        DcbxApp = 0x4021 => "DCBX_APP",
        /// FPGA capabilities.
        FpgaCap = 0x4022 => "FPGA_CAP",
        /// FPGA control.
        FpgaCtrl = 0x4023 => "FPGA_CTRL",
        /// FPGA register access.
        FpgaAccessReg = 0x4024 => "FPGA_ACCESS_REG",
        /// Core dump.
        CoreDump = 0x402e => "CORE_DUMP",
        /// Port capabilities.
        Pcap = 0x5001 => "PCAP",
        /// Port module to local port mapping.
        Pmlp = 0x5002 => "PMLP",
        /// Port MTU.
        Pmtu = 0x5003 => "PMTU",
        /// Port type and speed.
        Ptys = 0x5004 => "PTYS",
        /// Port administrative and operational status.
        Paos = 0x5006 => "PAOS",
        /// Port flow control.
        Pfcc = 0x5007 => "PFCC",
        /// Port performance counters.
        Ppcnt = 0x5008 => "PPCNT",
        /// Port up/down events.
        Pude = 0x5009 => "PUDE",
        /// Port priority to buffer mapping.
        Pptb = 0x500b => "PPTB",
        /// Port buffer configuration.
        Pbmc = 0x500c => "PBMC",
        /// Port Ethernet loopback configuration.
        Pelc = 0x500e => "PELC",
        /// Port VL capability.
        Pvlc = 0x500f => "PVLC",
        /// Port module plug/unplug events.
        Pmpe = 0x5010 => "PMPE",
        /// Port module administrative and operational status.
        Pmaos = 0x5012 => "PMAOS",
        /// Port phy link mode.
        Pplm = 0x5023 => "PPLM",
        /// Port diagnostics database.
        Pddr = 0x5031 => "PDDR",
        /// Ports configuration.
        Pcmr = 0x5041 => "PCMR",
        /// Port enhanced capabilities.
        Pcam = 0x507f => "PCAM",
        /// Node description.
        NodeDesc = 0x6001 => "NODE_DESC",
        /// Host endianness.
        HostEndianness = 0x7004 => "HOST_ENDIANNESS",
        /// Temperature capabilities.
        Mtcap = 0x9009 => "MTCAP",
        /// Temperature sensor.
        Mtmp = 0x900a => "MTMP",
        /// Module EEPROM access.
        Mcia = 0x9014 => "MCIA",
        /// Firmware reset level.
        Mfrl = 0x9028 => "MFRL",
        /// LED control.
        Mlcr = 0x902b => "MLCR",
        /// Real-time clock.
        Mrtc = 0x902d => "MRTC",
        /// Firmware tracer capabilities.
        MtrcCap = 0x9040 => "MTRC_CAP",
        /// Firmware tracer configuration.
        MtrcConf = 0x9041 => "MTRC_CONF",
        /// Firmware tracer strings database.
        MtrcStdb = 0x9042 => "MTRC_STDB",
        /// Firmware tracer control.
        MtrcCtrl = 0x9043 => "MTRC_CTRL",
        /// PCIe information.
        Mpein = 0x9050 => "MPEIN",
        /// PCIe counters.
        Mpcnt = 0x9051 => "MPCNT",
        /// PPS pin configuration.
        Mtpps = 0x9053 => "MTPPS",
        /// PPS event configuration.
        Mtppse = 0x9054 => "MTPPSE",
        /// Time UTC adjustment.
        Mtutc = 0x9055 => "MTUTC",
        /// PCIe general configuration.
        Mpegc = 0x9056 => "MPEGC",
        /// PCIe information by function.
        Mpir = 0x9059 => "MPIR",
        /// Component query status (firmware flash).
        Mcqs = 0x9060 => "MCQS",
        /// Component query information (firmware flash).
        Mcqi = 0x9061 => "MCQI",
        /// Component control (firmware flash).
        Mcc = 0x9062 => "MCC",
        /// Component data access (firmware flash).
        Mcda = 0x9063 => "MCDA",
        /// Management enhanced capabilities.
        Mcam = 0x907f => "MCAM",
        /// Synchronous Ethernet clock quality.
        Msecq = 0x9155 => "MSECQ",
        /// Synchronous Ethernet source settings.
        Msees = 0x9156 => "MSEES",
        /// Management image re-activation control.
        Mirc = 0x9162 => "MIRC",
        /// PTM capabilities.
        Mtptm = 0x9180 => "MTPTM",
        /// Cross-timestamp (PTM) capture.
        Mtctr = 0x9181 => "MTCTR",
        /// Shared buffer pool.
        Sbpr = 0xb001 => "SBPR",
        /// Shared buffer class management.
        Sbcm = 0xb002 => "SBCM",
        /// Shared buffer enhanced capabilities.
        Sbcam = 0xb01f => "SBCAM",
        /// Resource dump.
        ResourceDump = 0xc000 => "RESOURCE_DUMP",
        /// Default timeouts (DTOR).
        Dtor = 0xc00e => "DTOR",
    }
}

// ---------------------------------------------------------------------------
// Port and vport states
// ---------------------------------------------------------------------------

prm_enum! {
    /// Port status: PAOS `admin_status` / `oper_status` (`enum mlx5_port_status`).
    pub enum PortStatus: u8, unknown = "unknown port status" {
        /// The port is (or should be) up.
        Up = 1 => "UP",
        /// The port is (or should be) down.
        Down = 2 => "DOWN",
    }
}

/// QUERY_VPORT_STATE state: down (`VPORT_STATE_DOWN`).
pub const VPORT_STATE_DOWN: u8 = 0x0;
/// QUERY_VPORT_STATE state: up (`VPORT_STATE_UP`).
pub const VPORT_STATE_UP: u8 = 0x1;
/// Vport admin state: down (`MLX5_VPORT_ADMIN_STATE_DOWN`).
pub const VPORT_ADMIN_STATE_DOWN: u8 = 0x0;
/// Vport admin state: up (`MLX5_VPORT_ADMIN_STATE_UP`).
pub const VPORT_ADMIN_STATE_UP: u8 = 0x1;
/// Vport admin state: follow the uplink (`MLX5_VPORT_ADMIN_STATE_AUTO`).
pub const VPORT_ADMIN_STATE_AUTO: u8 = 0x2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iseg_offsets_match_device_h() {
        assert_eq!(ISEG_CMDQ_ADDR_L_SZ, 0x14);
        assert_eq!(ISEG_INITIALIZING, 0x1fc);
        assert_eq!(ISEG_HEALTH_SYND, 0x23d);
        assert_eq!(ISEG_HEALTH + HEALTH_BUFFER_SIZE, ISEG_NO_DRAM_NIC_OFFSET);
        assert_eq!(ISEG_CMD_EXEC_TO, 0xff8);
        assert_eq!(ISEG_HEALTH_COUNTER, 0x1010);
        assert_eq!(ISEG_CLR_INTX + 4, ISEG_SIZE);
    }

    #[test]
    fn iseg_field_decoding() {
        assert_eq!(fw_rev_major(0x0023_0016), 0x16);
        assert_eq!(fw_rev_minor(0x0023_0016), 0x23);
        assert_eq!(cmdif_rev(0x0005_1234), CMDIF_REV);
        assert_eq!(fw_rev_subminor(0x0005_1234), 0x1234);
        assert!(fw_initializing(0x8000_0000));
        assert!(!fw_initializing(0x4000_0000));
        // 32 entries of 64 bytes, nic_interface DISABLED.
        let l_sz = 0x1234_5000 | (1 << 8) | 0x56;
        assert_eq!(log_cmdq_size(l_sz), 5);
        assert_eq!(log_cmdq_stride(l_sz), 6);
        assert_eq!(nic_interface(l_sz), NicInterface::Disabled);
        assert_eq!(nic_interface(7 << 8), NicInterface::SwReset);
        assert_eq!(nic_interface(3 << 8), NicInterface::Unknown(3));
        assert_eq!(
            cmdq_addr_l_sz(0x1234_5fff, NicInterface::Disabled),
            0x1234_5100
        );
        assert_eq!(NicInterface::SwReset.to_string(), "SW_RESET(0x7)");
    }

    #[test]
    fn timeouts_and_mailboxes() {
        assert_eq!(iseg_timeout_ms(1500), 1500);
        assert_eq!(iseg_timeout_ms((1 << 29) | 60), 60_000);
        assert_eq!(iseg_timeout_ms((2 << 29) | 2), 120_000);
        assert_eq!(iseg_timeout_ms((3 << 29) | 1), 3_600_000);
        assert_eq!(mailbox_blocks(0), 0);
        assert_eq!(mailbox_blocks(16), 0);
        assert_eq!(mailbox_blocks(17), 1);
        assert_eq!(mailbox_blocks(16 + 512), 1);
        assert_eq!(mailbox_blocks(16 + 513), 2);
        assert_eq!(MBOX_NEXT, CMD_DATA_BLOCK_SIZE + 48);
        assert_eq!(MBOX_SIG + 1, CMD_PROT_BLOCK_SIZE);
    }

    #[test]
    fn signatures_as_the_kernel_computes_them() {
        use zerocopy::FromZeros;
        // The kernel's ENABLE_HCA entry from a real trace (trace.rs docs):
        // `030: 00000000 00000000 00000010 01fd0001`.
        let mut e = CmdLayout::new_zeroed();
        e.r#type = PCI_CMD_XPORT;
        e.r#in[0] = 0x0104_0000.into();
        e.inlen = 0x10.into();
        e.outlen = 0x10.into();
        e.token = 1;
        e.status_own = CMD_OWNER_HW;
        e.sign();
        assert_eq!(e.sig, 0xfd);
        assert!(e.sig_ok() && e.hw_owned());
        e.token = 2;
        assert!(!e.sig_ok());

        let mut b = CmdProtBlock::new_zeroed();
        b.data[7] = 0x5a;
        b.next = 0x1234_0400.into();
        b.block_num = 3.into();
        b.token = 0x42;
        b.sign();
        assert!(b.sig_ok());
        // A non-zero ctrl_sig is part of the whole-block signature.
        assert_ne!(b.ctrl_sig, 0);
        b.block_num = 4.into();
        assert!(!b.sig_ok());
    }

    #[test]
    fn op_mods_and_caps() {
        assert_eq!(
            query_hca_cap_op_mod(CapType::General, HCA_CAP_OPMOD_GET_CUR),
            1
        );
        assert_eq!(
            query_hca_cap_op_mod(CapType::Roce, HCA_CAP_OPMOD_GET_MAX),
            8
        );
        assert_eq!(set_hca_cap_op_mod(CapType::Roce), 0x8);
        assert_eq!(set_hca_cap_op_mod(CapType::General2), 0x40);
        assert_eq!(CapType::DevMem.to_raw(), 0x0f);
        assert_eq!(CapType::AdvVirtualization.to_raw(), 0x26);
        assert_eq!(QueryPagesOpMod::BootPages.to_raw(), 1);
        assert_eq!(QueryPagesOpMod::RegularPages.to_raw(), 3);
        assert_eq!(ManagePagesOpMod::AllocationSuccess.to_raw(), 1);
        assert_eq!(ManagePagesOpMod::HcaReturnPages.to_raw(), 2);
        assert_eq!(TeardownProfile::PrepareFastTeardown.to_raw(), 2);
        assert_eq!(
            CapType::from(0x0bu8).to_string(),
            "unknown capability type(0xb)"
        );
    }

    #[test]
    fn registers_and_ports() {
        assert_eq!(RegisterId::Paos.to_raw(), 0x5006);
        assert_eq!(RegisterId::Pmtu.to_raw(), 0x5003);
        assert_eq!(RegisterId::Ptys.to_raw(), 0x5004);
        assert_eq!(RegisterId::HostEndianness.to_raw(), 0x7004);
        assert_eq!(RegisterId::Dtor.to_raw(), 0xc00e);
        assert_eq!(RegisterId::from(0x5006u16).to_string(), "PAOS(0x5006)");
        assert_eq!(RegisterId::from(0x1u16), RegisterId::Unknown(1));
        for r in RegisterId::ALL {
            assert_eq!(RegisterId::from(u16::from(*r)), *r);
        }
        assert_eq!(PortStatus::from(2u8), PortStatus::Down);
    }
}
