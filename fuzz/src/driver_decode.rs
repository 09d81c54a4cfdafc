//! The driver's decoding of what the device writes, through the functions
//! the driver itself calls on it (`verbs`): a completed command's delivery
//! status, outbox status and syndrome (`cmd::check_status`), mailbox chains
//! (`cmd::check_chain`, `cmd::parse_chain`), CQEs (`cq::cqe_to_wc`, the
//! ownership test), EQEs (`eq::AsyncEvent::from_eqe`, the ownership test)
//! and capability pages (`caps::Caps`'s range-checked getters,
//! `caps::general_choices`).
//!
//! Input: a selector byte (modulo 5), then the bytes of that kind.

use mlx5_hw::cqe::{self as c};
use mlx5_hw::event as ev;
use verbs::caps::{self, CapPage, Caps};
use verbs::cmd;
use verbs::cq::{cqe_to_wc, CqeFields, Wc};
use verbs::eq::{eqe_is_sw_owned, AsyncEvent};
use verbs::qp::WqTrack;

/// A CQE as the bytes the device wrote.
struct Cqe([u8; c::CQE_SIZE]);

impl CqeFields for Cqe {
    fn u8_at(&self, off: usize) -> u8 {
        self.0[off]
    }
    fn be16_at(&self, off: usize) -> u16 {
        u16::from_be_bytes([self.0[off], self.0[off + 1]])
    }
    fn be32_at(&self, off: usize) -> u32 {
        u32::from_be_bytes([
            self.0[off],
            self.0[off + 1],
            self.0[off + 2],
            self.0[off + 3],
        ])
    }
}

fn be16(d: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([
        d.get(at).copied().unwrap_or(0),
        d.get(at + 1).copied().unwrap_or(0),
    ])
}

/// 64-byte entries of `d`, the last one zero-padded.
fn entries(d: &[u8]) -> impl Iterator<Item = [u8; 64]> + '_ {
    d.chunks(64).map(|ch| {
        let mut e = [0u8; 64];
        e[..ch.len()].copy_from_slice(ch);
        e
    })
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some((&sel, d)) = data.split_first() else {
        return;
    };
    match sel % 5 {
        0 => command_output(d),
        1 => mailbox_chain(d),
        2 => cqes(d),
        3 => eqes(d),
        _ => capabilities(d),
    }
}

/// Opcode, op_mod, `status_own`, then the output message.
fn command_output(d: &[u8]) {
    let status_own = d.get(4).copied().unwrap_or(0);
    let out = d.get(5..).unwrap_or(&[]);
    if let Err(e) = cmd::check_status(be16(d, 0), be16(d, 2), status_own, out) {
        let _ = e.to_string();
    }
}

/// Token, the declared length (2 bytes, in blocks' data units), the 16
/// inline bytes, then 576-byte blocks.
fn mailbox_chain(d: &[u8]) {
    let token = d.first().copied().unwrap_or(0);
    let len = usize::from(be16(d, 1)) * 8;
    let inline = d.get(3..19).unwrap_or(&[]);
    let blocks: Vec<[u8; cmd::BLOCK_SIZE]> = d
        .get(19..)
        .unwrap_or(&[])
        .chunks(cmd::BLOCK_SIZE)
        .map(|ch| {
            let mut b = [0u8; cmd::BLOCK_SIZE];
            b[..ch.len()].copy_from_slice(ch);
            b
        })
        .collect();
    let _ = cmd::check_chain(&blocks, token);
    for b in &blocks {
        let _ = cmd::block_sig_ok(b);
    }
    let msg = cmd::parse_chain(inline, &blocks, len);
    assert_eq!(
        msg.len(),
        len,
        "parse_chain gave a message of another length"
    );
}

/// The QP's numbers (QPN, log SQ and RQ sizes), the CQ's log size, then
/// CQEs, each decoded as the poll loop does when it owns it.
fn cqes(d: &[u8]) {
    let Some((head, rest)) = d.split_at_checked(5) else {
        return;
    };
    let qpn = u32::from(be16(head, 0));
    let sq = 1u32 << (head[2] % 16);
    let rq = if head[3] & 0x80 != 0 {
        0
    } else {
        1u32 << (head[3] % 16)
    };
    let log_cq = head[4] % 24;
    let track = WqTrack::new(qpn, sq, rq);
    let mut wc = Wc::default();
    for (ci, e) in entries(rest).enumerate() {
        if !c::cqe_is_sw_owned(e[c::CQE_OP_OWN_OFFSET], ci as u32, log_cq) {
            continue;
        }
        cqe_to_wc(&Cqe(e), &track, &mut wc);
        let _ = format!("{wc:?}");
    }
}

/// The EQ's log size, then EQEs.
fn eqes(d: &[u8]) {
    let Some((&log, rest)) = d.split_first() else {
        return;
    };
    let log_nent = u32::from(log % 24);
    for (ci, e) in entries(rest).enumerate() {
        if eqe_is_sw_owned(e[ev::EQE_OWNER_OFFSET], ci as u32, log_nent) {
            let a = AsyncEvent::from_eqe(&e);
            let _ = format!("{a:?}");
        }
    }
}

/// A page shift byte, then the general page (current, max), then the
/// optional pages, each as much as the input holds (short pages are
/// zero-filled to the capability page size).
fn capabilities(d: &[u8]) {
    const PAGE: usize = 0x1000;
    let Some((&shift, d)) = d.split_first() else {
        return;
    };
    let mut parts = d.chunks(PAGE).map(|ch| {
        let mut p = ch.to_vec();
        p.resize(PAGE, 0);
        p
    });
    let mut page = |present: bool| -> Option<CapPage> {
        present.then(|| CapPage {
            current: parts.next().unwrap_or_else(|| vec![0; PAGE]),
            max: parts.next().unwrap_or_else(|| vec![0; PAGE]),
        })
    };
    let general = page(true).unwrap_or(CapPage {
        current: vec![0; PAGE],
        max: vec![0; PAGE],
    });
    let caps = Caps {
        general,
        general_2: page(shift & 1 != 0),
        atomic: page(shift & 2 != 0),
        roce: page(shift & 4 != 0),
        odp: page(shift & 8 != 0),
        device_mem: page(shift & 16 != 0),
    };
    for r in [
        caps.max_qp_sz(),
        caps.max_srq_sz(),
        caps.max_cq_sz(),
        caps.max_qp(),
        caps.max_cq(),
        caps.max_srq(),
        caps.max_pd(),
        caps.max_mkey(),
        caps.max_ra_req_qp(),
        caps.max_ra_res_qp(),
        caps.max_msg(),
    ] {
        if let Err(e) = r {
            let _ = e.to_string();
        }
    }
    let _ = (caps.gen(), caps.gen_max(), caps.gen2(), caps.atomic());
    let _ = (caps.roce(), caps.odp(), caps.device_mem());
    let choices = caps::general_choices(
        &caps.general.current,
        &caps.general.max,
        u32::from(shift >> 5) + 12,
    );
    assert_eq!(
        choices.len(),
        caps.general.current.len(),
        "general_choices changed the page's size"
    );
}
