//! The model's command engine (`mlx5-emu`'s `cmdq` and the firmware behind
//! it): command entries and mailbox chains as a hostile or broken driver
//! writes them, rung through the doorbell of the mapped BAR.
//!
//! Input: a start byte (bit 0 set: the HCA is brought up first, so that
//! commands meet initialized firmware; clear: power-on state), then up to
//! [`MAX_COMMANDS`] records, each
//!
//! | bytes | what |
//! |---|---|
//! | 1 | slot (low 5 bits) |
//! | 1 | fix-ups: which parts of the entry and chains are made valid |
//! | 4 | extra doorbell bits rung with the slot's |
//! | 64 | the command entry (ownership is set; inline input at 0x10) |
//! | 1 | input blocks `n` (modulo 17) |
//! | 576 * `n` | input mailbox blocks, placed 1 KiB apart from `MBOX_IOVA` |
//!
//! Without fix-ups everything is as the input says: pointers anywhere
//! (unmapped, misaligned, chains that loop back on themselves), any block
//! numbers, tokens and signatures. Each fix-up bit makes one part right
//! (type, lengths, chain pointers, block numbers, tokens, signatures) so
//! that the fuzzer reaches firmware with everything else still its own.
//!
//! Oracle: every command completes (ownership returns within
//! [`CMD_DEADLINE`](crate::rig::CMD_DEADLINE)), nothing panics.

use verbs::cmd::{sign_block, sign_entry, BLOCK_SIZE};

use crate::rig::{rig, Rig, MBOX_BLOCKS, MBOX_IOVA, PAGES_IOVA, PAGES_LEN};

/// Commands run from one input at most.
pub const MAX_COMMANDS: usize = 32;
/// Fix-up: `type` = 7 (PCI transport).
pub const FIX_TYPE: u8 = 1 << 0;
/// Fix-up: `inlen` and `outlen` fit the blocks there are.
pub const FIX_LEN: u8 = 1 << 1;
/// Fix-up: `in_ptr`, `out_ptr` and each block's `next` chain the blocks.
pub const FIX_CHAIN: u8 = 1 << 2;
/// Fix-up: `block_num` counts 0, 1, 2, ...
pub const FIX_NUM: u8 = 1 << 3;
/// Fix-up: every block carries the entry's token.
pub const FIX_TOKEN: u8 = 1 << 4;
/// Fix-up: the entry and every block are signed.
pub const FIX_SIG: u8 = 1 << 5;
/// Every fix-up.
pub const FIX_ALL: u8 = 0x3f;

const HALF: usize = MBOX_BLOCKS / 2;
const OUT_BASE: u64 = MBOX_IOVA + (HALF as u64) * 1024;

fn take<'a>(d: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (a, b) = d.split_at(n.min(d.len()));
    *d = b;
    a
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let r = rig();
    r.power_on();
    let Some((&start, mut d)) = data.split_first() else {
        return;
    };
    if start & 1 != 0 {
        bring_up(r);
    }
    for _ in 0..MAX_COMMANDS {
        if d.is_empty() {
            break;
        }
        let head = take(&mut d, 6);
        let slot = head[0];
        let fix = head.get(1).copied().unwrap_or(0);
        let mut db = [0u8; 4];
        db[..head.len().saturating_sub(2)].copy_from_slice(head.get(2..).unwrap_or(&[]));
        let mut e = [0u8; 64];
        let ent = take(&mut d, 64);
        e[..ent.len()].copy_from_slice(ent);
        let n = usize::from(take(&mut d, 1).first().copied().unwrap_or(0)) % (HALF + 1);
        let mut blocks = vec![[0u8; BLOCK_SIZE]; n];
        for b in &mut blocks {
            let src = take(&mut d, BLOCK_SIZE);
            b[..src.len()].copy_from_slice(src);
        }
        command(r, slot, fix, u32::from_be_bytes(db), e, blocks);
    }
}

/// Pages per MANAGE_PAGES of [`bring_up`] (fits the input half of the
/// mailbox area).
const PAGES_PER_CMD: usize = 1000;

/// ENABLE_HCA, SET_ISSI 1, the boot and init pages, INIT_HCA: what the
/// driver does before anything else (the records as a driver writes them).
pub fn bring_up(r: &Rig) {
    let run = |input: Vec<u8>, outlen: u32| {
        let rec = crate::seeds::cmd_record(0, FIX_ALL, &input, outlen);
        // The record's own parsing: slot, fix-ups, doorbell, entry, blocks.
        let mut e = [0u8; 64];
        e.copy_from_slice(&rec[6..70]);
        let blocks = rec[71..]
            .chunks(BLOCK_SIZE)
            .map(|c| {
                let mut b = [0u8; BLOCK_SIZE];
                b[..c.len()].copy_from_slice(c);
                b
            })
            .collect();
        command(r, 0, FIX_ALL, 0, e, blocks);
    };
    use crate::seeds::cmd_input;
    run(cmd_input(0x104, 0, 16, &[]), 16);
    run(cmd_input(0x10b, 0, 16, &[(10, &[0, 1])]), 16);
    let profile = r.f.model().config().profile;
    let need = (profile.boot_pages() + profile.init_pages()) as usize;
    let need = need.min(PAGES_LEN / 4096);
    let mut given = 0;
    while given < need {
        let n = (need - given).min(PAGES_PER_CMD);
        let mut pas = Vec::with_capacity(n * 8);
        for i in given..given + n {
            pas.extend_from_slice(&(PAGES_IOVA + i as u64 * 4096).to_be_bytes());
        }
        let input = cmd_input(
            0x108,
            1,
            16 + pas.len(),
            &[(12, &(n as u32).to_be_bytes()), (16, &pas)],
        );
        run(input, 16);
        given += n;
    }
    run(cmd_input(0x102, 0, 16, &[]), 16);
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put_block_ctrl(
    b: &mut [u8; BLOCK_SIZE],
    next: Option<u64>,
    num: Option<u32>,
    token: Option<u8>,
) {
    if let Some(next) = next {
        b[0x230..0x238].copy_from_slice(&next.to_be_bytes());
    }
    if let Some(num) = num {
        b[0x238..0x23c].copy_from_slice(&num.to_be_bytes());
    }
    if let Some(t) = token {
        b[0x23d] = t;
    }
}

fn command(r: &Rig, slot: u8, fix: u8, db: u32, mut e: [u8; 64], mut inb: Vec<[u8; BLOCK_SIZE]>) {
    if fix & FIX_TYPE != 0 {
        e[0] = 7;
    }
    if fix & FIX_LEN != 0 {
        let inlen = (be32(&e, 0x04) as usize).clamp(8, 16 + 512 * inb.len());
        let outlen = (be32(&e, 0x38) as usize).clamp(8, 16 + 512 * HALF);
        e[0x04..0x08].copy_from_slice(&(inlen as u32).to_be_bytes());
        e[0x38..0x3c].copy_from_slice(&(outlen as u32).to_be_bytes());
    }
    let token = e[0x3c];
    let nout = (be32(&e, 0x38) as usize)
        .saturating_sub(16)
        .div_ceil(512)
        .min(HALF);
    let mut outb = vec![[0u8; BLOCK_SIZE]; nout];
    let chain = fix & FIX_CHAIN != 0;
    if chain {
        let in_ptr = if inb.is_empty() { 0 } else { MBOX_IOVA };
        let out_ptr = if outb.is_empty() { 0 } else { OUT_BASE };
        e[0x08..0x10].copy_from_slice(&in_ptr.to_be_bytes());
        e[0x30..0x38].copy_from_slice(&out_ptr.to_be_bytes());
    }
    for (blocks, base) in [(&mut inb, MBOX_IOVA), (&mut outb, OUT_BASE)] {
        let n = blocks.len();
        for (i, b) in blocks.iter_mut().enumerate() {
            let next = if i + 1 < n {
                base + (i as u64 + 1) * 1024
            } else {
                0
            };
            put_block_ctrl(
                b,
                chain.then_some(next),
                (fix & FIX_NUM != 0).then_some(i as u32),
                (fix & FIX_TOKEN != 0).then_some(token),
            );
            if fix & FIX_SIG != 0 {
                sign_block(b);
            }
        }
    }
    for (i, b) in inb.iter().enumerate() {
        let _ = r.mbox.write(i * 1024, b);
    }
    for (i, b) in outb.iter().enumerate() {
        let _ = r.mbox.write((HALF + i) * 1024, b);
    }
    e[0x3f] = 1;
    if fix & FIX_SIG != 0 {
        sign_entry(&mut e);
    }
    let done = r.exec_entry(slot, &e, db);
    if std::env::var_os("MLX5_FUZZ_VERBOSE").is_some() {
        eprintln!(
            "slot {slot}: opcode {:#06x} delivery {:#x} status {:#x} syndrome {:#x}",
            u16::from_be_bytes([e[0x10], e[0x11]]),
            done[0x3f] >> 1,
            done[0x20],
            be32(&done, 0x24)
        );
    }
}
