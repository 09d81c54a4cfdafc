//! The command engine: one command-queue entry from doorbell to completion.
//!
//! The entry (64 bytes at `cmdq_base + slot << log_stride`) is read by DMA
//! and checked before anything runs, in the order real firmware reports the
//! errors through the delivery status (`status_own` bits [7:1]):
//!
//! - `type` must be 7 (PCI transport), else bad command descriptor (0x10);
//! - signatures, only once the driver enabled checksums (`cmdif_checksum`
//!   through SET_HCA_CAP): entry XOR and each block's `ctrl_sig`/`sig`, else
//!   signature error (0x1);
//! - `inlen` at least 8 bytes (opcode and op_mod) and at most
//!   [`MAX_MSG`], else input length error (0x7); `outlen` at least 8 bytes
//!   (status and syndrome), else output length error (0x8);
//! - each mailbox chain (`in_ptr`, `out_ptr`, every `next`) must be 1 KiB
//!   aligned, as the blocks of the kernel's pool are (576-byte blocks
//!   rounded up to a power of two), else in_ptr (0x5) / out_ptr (0x4)
//!   alignment; a chain that ends before the length needs it is an input
//!   (0x7) / output (0x8) length error;
//! - `block_num` counts 0, 1, 2, ... else bad block number (0x3);
//! - every block carries the entry's token, else token error (0x2).
//!
//! Then the input (16 inline bytes + 512 per block) runs, the
//! [`crate::OutputOverride`] hook (if configured) may replace the output,
//! the output is written (16 inline bytes + 512 per block) and
//! `status_own` is written last with ownership cleared. Once an EQ subscribed to CMD events exists,
//! a completion EQE (slot bit in `eqe_cmd.vector`) goes to it.

use mlx5_hw::ifc::{CmdLayout, CmdProtBlock};
use mlx5_hw::init::{self as hw, mailbox_blocks};
use mlx5_hw::status::DeliveryStatus;
use zerocopy::{FromZeros, IntoBytes};

use crate::faults::CmdFault;
use crate::fw::Firmware;
use crate::{lock, CmdLogEntry, Inner, CMD_LOG_CAPACITY};

/// Largest message the model accepts (1 MiB), in bytes.
pub const MAX_MSG: usize = 1 << 20;
/// Bytes of the message inline in the entry.
const INLINE: usize = hw::CMD_INLINE_OUT_SIZE;
/// Data bytes per mailbox block.
const BLOCK_DATA: usize = hw::CMD_DATA_BLOCK_SIZE;
/// Required mailbox alignment: the kernel's 1 KiB pool blocks.
const BLOCK_ALIGN: u64 = hw::CMD_PROT_BLOCK_ALIGN as u64;
/// Where the output's inline bytes sit in the entry.
const OUT_AT: u64 = core::mem::offset_of!(CmdLayout, out) as u64;
/// Where `status_own` sits in the entry.
const STATUS_OWN_AT: u64 = core::mem::offset_of!(CmdLayout, status_own) as u64;

struct Chain {
    addrs: Vec<u64>,
    data: Vec<u8>,
}

/// The opcode and op_mod of a command input.
fn opcode_op_mod(input: &[u8]) -> (u16, u16) {
    (hw::cmd_opcode(input), hw::cmd_op_mod(input))
}

/// Walks a mailbox chain of `n` blocks from `ptr`.
fn walk(
    inner: &Inner,
    mut ptr: u64,
    n: usize,
    token: u8,
    check_sig: bool,
    input: bool,
) -> Result<Chain, DeliveryStatus> {
    let (align_err, len_err) = if input {
        (DeliveryStatus::InPtrAlignment, DeliveryStatus::InputLength)
    } else {
        (
            DeliveryStatus::OutPtrAlignment,
            DeliveryStatus::OutputLength,
        )
    };
    let mut c = Chain {
        addrs: Vec::with_capacity(n),
        data: Vec::with_capacity(if input { n * BLOCK_DATA } else { 0 }),
    };
    let mut b = CmdProtBlock::new_zeroed();
    for i in 0..n {
        if ptr == 0 {
            return Err(len_err);
        }
        if ptr % BLOCK_ALIGN != 0 {
            return Err(align_err);
        }
        if inner.bus.dma.read(ptr, b.as_mut_bytes()).is_err() {
            inner.stats().dma_faults += 1;
            tracing::warn!(iova = format_args!("{ptr:#x}"), "mailbox read faulted");
            return Err(DeliveryStatus::FirmwareError);
        }
        if b.block_num.get() != i as u32 {
            return Err(DeliveryStatus::BadBlockNumber);
        }
        if b.token != token {
            return Err(DeliveryStatus::TokenError);
        }
        if check_sig && input && !b.sig_ok() {
            return Err(DeliveryStatus::SignatureError);
        }
        c.addrs.push(ptr);
        if input {
            c.data.extend_from_slice(&b.data);
        }
        ptr = b.next.get();
    }
    Ok(c)
}

/// Executes the command in `slot` and completes it.
pub(crate) fn run_slot(fw: &mut Firmware, inner: &Inner, slot: u8) {
    let entry_at = fw.cmdq_base + (u64::from(slot) << crate::initseg::LOG_CMDQ_STRIDE);
    let mut e = CmdLayout::new_zeroed();
    if inner.bus.dma.read(entry_at, e.as_mut_bytes()).is_err() {
        inner.stats().dma_faults += 1;
        tracing::warn!(slot, "command entry read faulted");
        return;
    }
    if !e.hw_owned() {
        return; // not handed to HW: a stale doorbell bit
    }
    let (opcode, op_mod) = opcode_op_mod(e.r#in.as_bytes());
    let mut log = CmdLogEntry {
        slot,
        opcode,
        op_mod,
        delivery: 0,
        status: 0,
        syndrome: 0,
    };
    let outcome = match inner.faults.take(opcode) {
        Some(CmdFault::NeverComplete) => {
            tracing::debug!(slot, opcode, "fault: command never completes");
            fw.stuck |= 1 << slot;
            return;
        }
        Some(CmdFault::Delivery(d)) => Err(d),
        Some(CmdFault::Status(s, syn)) => {
            e.out = [0.into(); 4];
            hw::set_cmd_status_syndrome(e.out.as_mut_bytes(), s.to_raw(), syn);
            Ok(None)
        }
        None => deliver(fw, inner, &e).map(Some),
    };
    let status_own = match outcome {
        Err(d) => {
            inner.stats().delivery_errors += 1;
            tracing::debug!(slot, opcode, delivery = %d, "command delivery error");
            log.delivery = d.to_raw();
            d.to_raw() << 1
        }
        Ok(None) => 0,
        Ok(Some((out, out_chain))) => {
            let n = out.len().min(INLINE);
            e.out.as_mut_bytes()[..n].copy_from_slice(&out[..n]);
            for (i, addr) in out_chain.iter().enumerate() {
                let from = INLINE + i * BLOCK_DATA;
                let mut data = [0u8; BLOCK_DATA];
                if let Some(src) = out.get(from..) {
                    let k = src.len().min(BLOCK_DATA);
                    data[..k].copy_from_slice(&src[..k]);
                }
                if inner.bus.dma.write(*addr, &data).is_err() {
                    inner.stats().dma_faults += 1;
                }
            }
            0
        }
    };
    (log.status, log.syndrome) = hw::cmd_status_syndrome(e.out.as_bytes());
    inner.stats().commands += 1;
    tracing::trace!(
        slot,
        opcode = format_args!("{opcode:#x}"),
        op_mod,
        status = log.status,
        "command done"
    );
    // Output inline area first, then status_own (ownership back to SW) last.
    if inner
        .bus
        .dma
        .write(entry_at + OUT_AT, e.out.as_bytes())
        .is_err()
        || inner
            .bus
            .dma
            .write(entry_at + STATUS_OWN_AT, &[status_own])
            .is_err()
    {
        inner.stats().dma_faults += 1;
    }
    {
        let mut l = lock(&inner.log);
        if l.len() >= CMD_LOG_CAPACITY {
            l.pop_front();
        }
        l.push_back(log);
    }
    fw.command_completed(inner, slot);
}

type Delivered = (Vec<u8>, Vec<u64>);

/// Checks the entry and mailboxes, runs the command; the output message
/// and the output chain, or the delivery status.
fn deliver(fw: &mut Firmware, inner: &Inner, e: &CmdLayout) -> Result<Delivered, DeliveryStatus> {
    if e.r#type != hw::PCI_CMD_XPORT {
        return Err(DeliveryStatus::BadDescriptor);
    }
    if fw.checksums && !e.sig_ok() {
        return Err(DeliveryStatus::SignatureError);
    }
    let inlen = e.inlen.get() as usize;
    let outlen = e.outlen.get() as usize;
    if !(8..=MAX_MSG).contains(&inlen) {
        return Err(DeliveryStatus::InputLength);
    }
    if !(8..=MAX_MSG).contains(&outlen) {
        return Err(DeliveryStatus::OutputLength);
    }
    let token = e.token;
    let inc = walk(
        inner,
        e.in_ptr.get(),
        mailbox_blocks(inlen),
        token,
        fw.checksums,
        true,
    )?;
    let outc = walk(
        inner,
        e.out_ptr.get(),
        mailbox_blocks(outlen),
        token,
        fw.checksums,
        false,
    )?;
    let mut input = Vec::with_capacity(inlen);
    input.extend_from_slice(e.r#in.as_bytes());
    input.extend_from_slice(&inc.data);
    input.truncate(inlen);
    let mut out = match fw.execute(inner, &input, outlen) {
        Ok(o) => o,
        Err(f) => {
            let mut o = vec![0u8; INLINE];
            hw::set_cmd_status_syndrome(&mut o, f.status.to_raw(), f.syndrome);
            tracing::debug!(opcode = format_args!("{:#x}", opcode_op_mod(&input).0),
                status = %f.status, syndrome = format_args!("{:#x}", f.syndrome), "command failed");
            o
        }
    };
    if let Some(hook) = &inner.cfg.output_override {
        let (opcode, op_mod) = opcode_op_mod(&input);
        if let Some(mut o) = hook.answer(opcode, op_mod, &input, &out) {
            o.resize(outlen, 0);
            out = o;
        }
    }
    out.truncate(outlen);
    Ok((out, outc.addrs))
}
