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

use mlx5_hw::status::DeliveryStatus;

use crate::faults::CmdFault;
use crate::fw::Firmware;
use crate::{lock, CmdLogEntry, Inner, CMD_LOG_CAPACITY};

/// Largest message the model accepts (1 MiB), in bytes.
pub const MAX_MSG: usize = 1 << 20;
/// Bytes of the message inline in the entry.
pub const INLINE: usize = 16;
/// Data bytes per mailbox block.
pub const BLOCK_DATA: usize = 512;
/// Size of a mailbox block.
pub const BLOCK_SIZE: usize = 576;
/// Required mailbox alignment.
pub const BLOCK_ALIGN: u64 = 1024;

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from(be32(b, at)) << 32 | u64::from(be32(b, at + 4))
}

fn xor8(b: &[u8]) -> u8 {
    b.iter().fold(0, |a, x| a ^ x)
}

fn nblocks(len: usize) -> usize {
    len.saturating_sub(INLINE).div_ceil(BLOCK_DATA)
}

struct Chain {
    addrs: Vec<u64>,
    data: Vec<u8>,
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
    let mut b = [0u8; BLOCK_SIZE];
    for i in 0..n {
        if ptr == 0 {
            return Err(len_err);
        }
        if ptr % BLOCK_ALIGN != 0 {
            return Err(align_err);
        }
        if inner.bus.dma.read(ptr, &mut b).is_err() {
            inner.stats().dma_faults += 1;
            tracing::warn!(iova = format_args!("{ptr:#x}"), "mailbox read faulted");
            return Err(DeliveryStatus::FirmwareError);
        }
        if be32(&b, 0x238) != i as u32 {
            return Err(DeliveryStatus::BadBlockNumber);
        }
        if b[0x23d] != token {
            return Err(DeliveryStatus::TokenError);
        }
        if check_sig
            && input
            && (xor8(&b[0x200..0x23f]) != 0xff || xor8(&b[..0x23e]) ^ b[0x23f] != 0xff)
        {
            return Err(DeliveryStatus::SignatureError);
        }
        c.addrs.push(ptr);
        if input {
            c.data.extend_from_slice(&b[..BLOCK_DATA]);
        }
        ptr = be64(&b, 0x230);
    }
    Ok(c)
}

/// Executes the command in `slot` and completes it.
pub(crate) fn run_slot(fw: &mut Firmware, inner: &Inner, slot: u8) {
    let entry_at = fw.cmdq_base + (u64::from(slot) << crate::initseg::LOG_CMDQ_STRIDE);
    let mut e = [0u8; 64];
    if inner.bus.dma.read(entry_at, &mut e).is_err() {
        inner.stats().dma_faults += 1;
        tracing::warn!(slot, "command entry read faulted");
        return;
    }
    if e[0x3f] & 1 == 0 {
        return; // not handed to HW: a stale doorbell bit
    }
    let opcode = u16::from_be_bytes([e[0x10], e[0x11]]);
    let op_mod = u16::from_be_bytes([e[0x16], e[0x17]]);
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
            let mut out = [0u8; INLINE];
            out[0] = s.to_raw();
            out[4..8].copy_from_slice(&syn.to_be_bytes());
            e[0x20..0x30].copy_from_slice(&out);
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
            e[0x20..0x20 + n].copy_from_slice(&out[..n]);
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
    log.status = e[0x20];
    log.syndrome = be32(&e, 0x24);
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
        .write(entry_at + 0x20, &e[0x20..0x30])
        .is_err()
        || inner.bus.dma.write(entry_at + 0x3f, &[status_own]).is_err()
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
fn deliver(fw: &mut Firmware, inner: &Inner, e: &[u8; 64]) -> Result<Delivered, DeliveryStatus> {
    if e[0] != 7 {
        return Err(DeliveryStatus::BadDescriptor);
    }
    if fw.checksums && xor8(e) != 0xff {
        return Err(DeliveryStatus::SignatureError);
    }
    let inlen = be32(e, 0x04) as usize;
    let outlen = be32(e, 0x38) as usize;
    if !(8..=MAX_MSG).contains(&inlen) {
        return Err(DeliveryStatus::InputLength);
    }
    if !(8..=MAX_MSG).contains(&outlen) {
        return Err(DeliveryStatus::OutputLength);
    }
    let token = e[0x3c];
    let inc = walk(
        inner,
        be64(e, 0x08),
        nblocks(inlen),
        token,
        fw.checksums,
        true,
    )?;
    let outc = walk(
        inner,
        be64(e, 0x30),
        nblocks(outlen),
        token,
        fw.checksums,
        false,
    )?;
    let mut input = Vec::with_capacity(inlen);
    input.extend_from_slice(&e[0x10..0x20]);
    input.extend_from_slice(&inc.data);
    input.truncate(inlen);
    let mut out = match fw.execute(inner, &input, outlen) {
        Ok(o) => o,
        Err(f) => {
            let mut o = vec![0u8; INLINE];
            o[0] = f.status.to_raw();
            o[4..8].copy_from_slice(&f.syndrome.to_be_bytes());
            tracing::debug!(opcode = format_args!("{:#x}", u16::from_be_bytes([e[0x10], e[0x11]])),
                status = %f.status, syndrome = format_args!("{:#x}", f.syndrome), "command failed");
            o
        }
    };
    if let Some(hook) = &inner.cfg.output_override {
        let opcode = u16::from_be_bytes([input[0], input[1]]);
        let op_mod = u16::from_be_bytes([input[6], input[7]]);
        if let Some(mut o) = hook.answer(opcode, op_mod, &input, &out) {
            o.resize(outlen, 0);
            out = o;
        }
    }
    out.truncate(outlen);
    Ok((out, outc.addrs))
}
