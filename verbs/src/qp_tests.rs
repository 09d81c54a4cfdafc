//! What the send path puts in memory, checked against mlx5-hw's generated
//! views and the PRM's numbers (opcodes, flags), not against the code
//! that writes it; and how CQEs decode into work completions.
#![allow(unsafe_code)] // Sge::new_unchecked for SGEs no device will see.

use std::sync::Arc;

use mlx5_hw::ifc::{cqe64, err_cqe, WqeAtomicSeg, WqeCtrlSeg, WqeDataSeg, WqeRaddrSeg};
use vfio::{DmaBuffer, MemType, Mmio};
use vm_memory::mmap::MmapRegion;
use zerocopy::FromBytes;

use super::*;
use crate::cq::{cqe_to_wc, CqRing, Wc, WcOpcode, WcStatus};
use crate::mr::Sge;

const QPN: u32 = 0x12_3456;

struct Rig {
    sq: SendRing,
    buf: Arc<DmaBuffer>,
    dbrec: Arc<DmaBuffer>,
    uar: Arc<Mmio>,
    track: Arc<WqTrack>,
}

/// A send ring over a write-combining UAR stand-in (BlueFlame on).
fn rig(log: u32) -> Rig {
    rig_on(log, MemType::WriteCombining)
}

fn rig_on(log: u32, mem: MemType) -> Rig {
    let buf = DmaBuffer::new(64 << log).unwrap();
    let dbrec = DmaBuffer::new(4096).unwrap();
    let region = MmapRegion::<()>::new(4096).unwrap();
    let uar = Arc::new(Mmio::with_type(region, 0, mem));
    let track = WqTrack::new(QPN, 1 << log, 0);
    let sq = SendRing::new(
        buf.clone(),
        0,
        log,
        dbrec.clone(),
        4,
        uar.clone(),
        0x800,
        track.clone(),
    )
    .unwrap();
    Rig {
        sq,
        buf,
        dbrec,
        uar,
        track,
    }
}

fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
    // SAFETY: these rings have no device behind them.
    unsafe { Sge::new_unchecked(addr, len, lkey) }
}

fn block(r: &Rig, bb: usize, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; 64 * n];
    r.buf.read(bb * 64, &mut v).unwrap();
    v
}

fn ctrl(b: &[u8]) -> WqeCtrlSeg {
    WqeCtrlSeg::read_from_bytes(&b[..16]).unwrap()
}

fn wr<'a>(op: SendOp, payload: Payload<'a>, flags: u32) -> SendWr<'a> {
    SendWr {
        wr_id: 77,
        op,
        payload,
        flags,
        ud: None,
    }
}

/// opmod_idx_opcode: opcode in bits 7:0, WQE index in 23:8 (PRM).
fn opcode_index(c: &WqeCtrlSeg) -> (u8, u16) {
    let v = c.opmod_idx_opcode.get();
    ((v & 0xff) as u8, (v >> 8) as u16)
}

/// qpn_ds: QPN in 31:8, DS (16-byte units) in 5:0.
fn qpn_ds(c: &WqeCtrlSeg) -> (u32, u8) {
    let v = c.qpn_ds.get();
    (v >> 8, (v & 0x3f) as u8)
}

#[test]
fn fast_rdma_write_is_the_prm_wqe_and_matches_the_general_path() {
    let mut a = rig(4);
    let s = sge(0x1122_3344_5566_7788, 0x1000, 0xabcd_ef01);
    a.sq.write_rdma_write(9, 0x0102_0304_0506_0708, 0x99, &s, send_flags::SIGNALED)
        .unwrap();
    let b = block(&a, 0, 1);
    let c = ctrl(&b);
    assert_eq!(
        opcode_index(&c),
        (0x08, 0),
        "MLX5_OPCODE_RDMA_WRITE, index 0"
    );
    assert_eq!(qpn_ds(&c), (QPN, 3), "ctrl + raddr + data");
    assert_eq!(c.fm_ce_se, 0x08, "CQ update (MLX5_WQE_CTRL_CQ_UPDATE)");
    let r = WqeRaddrSeg::read_from_bytes(&b[16..32]).unwrap();
    assert_eq!((r.raddr.get(), r.rkey.get()), (0x0102_0304_0506_0708, 0x99));
    let d = WqeDataSeg::read_from_bytes(&b[32..48]).unwrap();
    assert_eq!(
        (d.byte_count.get(), d.lkey.get(), d.addr.get()),
        (0x1000, 0xabcd_ef01, 0x1122_3344_5566_7788)
    );
    // The general builder makes the same WQE as the register fast path
    // (which `write_wr` takes for it).
    let mut g = rig(4);
    g.sq.write_wr_general(
        &wr(
            SendOp::RdmaWrite {
                raddr: 0x0102_0304_0506_0708,
                rkey: 0x99,
            },
            Payload::Sges(&[s]),
            send_flags::SIGNALED,
        ),
        QpType::Rc,
        64,
    )
    .unwrap();
    assert_eq!(block(&g, 0, 1)[..48], b[..48]);
    assert_eq!(a.sq.pc(), 1);
    // The completion of index 0 gives the wr_id back and frees the block.
    assert_eq!(a.sq.free(), 15);
    assert_eq!(a.track.sq_complete(0), 9);
    assert_eq!(a.sq.free(), 16);
}

#[test]
fn every_opcode_has_its_prm_opcode_segments_and_ds() {
    let s8 = sge(0x5000, 8, 0x42);
    let s = sge(0x6000, 100, 0x43);
    // (op, payload, PRM opcode, ds, imm in the ctrl segment)
    let cases: [(SendOp, &[Sge], u8, u8, u32); 7] = [
        (SendOp::Send, &[s], 0x0a, 2, 0),
        (SendOp::SendImm(0xfeed_f00d), &[s], 0x0b, 2, 0xfeed_f00d),
        (
            SendOp::RdmaWrite {
                raddr: 1 << 40,
                rkey: 5,
            },
            &[s],
            0x08,
            3,
            0,
        ),
        (
            SendOp::RdmaWriteImm {
                raddr: 1 << 40,
                rkey: 5,
                imm: 0x0bad_cafe,
            },
            &[s],
            0x09,
            3,
            0x0bad_cafe,
        ),
        (
            SendOp::RdmaRead {
                raddr: 1 << 40,
                rkey: 5,
            },
            &[s, s],
            0x10,
            4,
            0,
        ),
        (
            SendOp::AtomicCmpSwp {
                raddr: 1 << 40,
                rkey: 5,
                compare: 0x1111,
                swap: 0x2222,
            },
            &[s8],
            0x11,
            4,
            0,
        ),
        (
            SendOp::AtomicFetchAdd {
                raddr: 1 << 40,
                rkey: 5,
                add: 0x3333,
            },
            &[s8],
            0x12,
            4,
            0,
        ),
    ];
    let mut r = rig(6);
    for (k, (op, sges, opc, ds, imm)) in cases.iter().enumerate() {
        let pc = r.sq.pc();
        r.sq.write_wr(&wr(*op, Payload::Sges(sges), 0), QpType::Rc, 64)
            .unwrap();
        let b = block(&r, pc as usize, 1);
        let c = ctrl(&b);
        assert_eq!(opcode_index(&c), (*opc, pc as u16), "case {k}");
        assert_eq!(qpn_ds(&c), (QPN, *ds), "case {k}");
        assert_eq!(c.imm.get(), *imm, "case {k}");
        assert_eq!(c.fm_ce_se, 0, "unsignaled");
        let mut at = 16;
        if *opc != 0x0a && *opc != 0x0b {
            let ra = WqeRaddrSeg::read_from_bytes(&b[at..at + 16]).unwrap();
            assert_eq!((ra.raddr.get(), ra.rkey.get()), (1 << 40, 5), "case {k}");
            at += 16;
        }
        if *opc == 0x11 || *opc == 0x12 {
            let a = WqeAtomicSeg::read_from_bytes(&b[at..at + 16]).unwrap();
            let want = if *opc == 0x11 {
                (0x2222, 0x1111)
            } else {
                (0x3333, 0)
            };
            assert_eq!((a.swap_add.get(), a.compare.get()), want, "case {k}");
            at += 16;
        }
        for (i, x) in sges.iter().enumerate() {
            let d = WqeDataSeg::read_from_bytes(&b[at + 16 * i..at + 16 * i + 16]).unwrap();
            assert_eq!(
                (d.byte_count.get(), d.lkey.get(), d.addr.get()),
                (x.length(), x.lkey(), x.addr()),
                "case {k} sge {i}"
            );
        }
        assert_eq!(at + 16 * sges.len(), usize::from(*ds) * 16, "case {k}");
    }
}

#[test]
fn flags_set_fence_solicited_and_signaled_bits() {
    let s = sge(0x6000, 10, 1);
    let mut r = rig(4);
    // PRM fm_ce_se: fence mode 7:5 (strong ordering = 4), CE 3:2, SE bit 1.
    for (flags, want) in [
        (send_flags::SIGNALED, 0x08u8),
        (send_flags::SOLICITED, 0x02),
        (send_flags::FENCE, 0x80),
        (
            send_flags::FENCE | send_flags::SIGNALED | send_flags::SOLICITED,
            0x8a,
        ),
        // INLINE sets no bit of its own.
        (send_flags::INLINE | send_flags::SIGNALED, 0x08),
        (0, 0),
    ] {
        let pc = r.sq.pc();
        r.sq.write_wr(
            &wr(SendOp::Send, Payload::Sges(&[s]), flags),
            QpType::Rc,
            64,
        )
        .unwrap();
        assert_eq!(
            ctrl(&block(&r, pc as usize, 1)).fm_ce_se,
            want,
            "flags {flags:#x}"
        );
    }
    r.sq.set_sig_all(true);
    let pc = r.sq.pc();
    r.sq.write_wr(&wr(SendOp::Send, Payload::Sges(&[s]), 0), QpType::Rc, 64)
        .unwrap();
    assert_eq!(
        ctrl(&block(&r, pc as usize, 1)).fm_ce_se,
        0x08,
        "sq_sig_all"
    );
}

#[test]
fn inline_data_follows_an_inline_segment() {
    let mut r = rig(4);
    let data: Vec<u8> = (1..=40).collect();
    r.sq.write_wr(&wr(SendOp::Send, Payload::Inline(&data), 0), QpType::Rc, 64)
        .unwrap();
    let b = block(&r, 0, 1);
    // byte_count with MLX5_INLINE_SEG (bit 31), then the bytes.
    assert_eq!(
        u32::from_be_bytes(b[16..20].try_into().unwrap()),
        0x8000_0000 | 40
    );
    assert_eq!(&b[20..60], &data[..]);
    assert_eq!(qpn_ds(&ctrl(&b)).1, 1 + (4 + 40usize).div_ceil(16) as u8);
    // Too much inline, inline on a READ: refused, nothing written.
    let big = [0u8; 65];
    let pc = r.sq.pc();
    assert_eq!(
        r.sq.write_wr(&wr(SendOp::Send, Payload::Inline(&big), 0), QpType::Rc, 64),
        Err(PostError::TooLarge)
    );
    assert_eq!(
        r.sq.write_wr(
            &wr(
                SendOp::RdmaRead { raddr: 0, rkey: 1 },
                Payload::Inline(&data[..4]),
                0
            ),
            QpType::Rc,
            64
        ),
        Err(PostError::TooLarge)
    );
    assert_eq!(r.sq.pc(), pc);
}

#[test]
fn a_wqe_longer_than_a_block_spans_two_and_the_next_index_follows() {
    let mut r = rig(4);
    let sges = [sge(0x1000, 1, 1), sge(0x2000, 2, 2), sge(0x3000, 3, 3)];
    r.sq.write_wr(
        &wr(
            SendOp::RdmaWrite {
                raddr: 0x10,
                rkey: 9,
            },
            Payload::Sges(&sges),
            0,
        ),
        QpType::Rc,
        64,
    )
    .unwrap();
    let b = block(&r, 0, 2);
    assert_eq!(qpn_ds(&ctrl(&b)).1, 5, "ctrl + raddr + 3 data");
    let d = WqeDataSeg::read_from_bytes(&b[64..80]).unwrap();
    assert_eq!(
        (d.byte_count.get(), d.addr.get()),
        (3, 0x3000),
        "third SGE in block 1"
    );
    assert_eq!(r.sq.pc(), 2);
    r.sq.write_wr(
        &wr(SendOp::Send, Payload::Sges(&sges[..1]), 0),
        QpType::Rc,
        64,
    )
    .unwrap();
    assert_eq!(opcode_index(&ctrl(&block(&r, 2, 1))), (0x0a, 2));
}

#[test]
fn operations_that_do_not_apply_are_refused() {
    let mut r = rig(4);
    let s = [sge(0x1000, 16, 1)];
    let rd = wr(SendOp::RdmaRead { raddr: 0, rkey: 1 }, Payload::Sges(&s), 0);
    assert_eq!(r.sq.write_wr(&rd, QpType::Uc, 64), Err(PostError::BadOp));
    let send = wr(SendOp::Send, Payload::Sges(&s), 0);
    assert_eq!(
        r.sq.write_wr(&send, QpType::Ud, 64),
        Err(PostError::BadOp),
        "no UD address"
    );
    // An atomic needs exactly one 8-byte SGE.
    let fa = wr(
        SendOp::AtomicFetchAdd {
            raddr: 0,
            rkey: 1,
            add: 1,
        },
        Payload::Sges(&s),
        0,
    );
    assert_eq!(r.sq.write_wr(&fa, QpType::Rc, 64), Err(PostError::BadOp));
    assert_eq!(r.sq.pc(), 0, "nothing written");
}

fn uar_bytes(r: &Rig, off: usize, n: usize) -> Vec<u8> {
    (0..n / 4)
        .flat_map(|i| r.uar.read32_be(off + 4 * i).unwrap().to_be_bytes())
        .collect()
}

#[test]
fn blueflame_copies_a_lone_wqe_and_batches_ring_the_doorbell() {
    let s = sge(0x1000, 16, 1);
    let mut r = rig(4);
    // A lone one-block WQE: the whole block through BlueFlame buffer 0x800.
    r.sq.write_rdma_write(1, 0x10, 2, &s, 0).unwrap();
    r.sq.ring();
    let b0 = block(&r, 0, 1);
    assert_eq!(uar_bytes(&r, 0x800, 64), b0);
    assert_eq!(r.dbrec.read_u32_be(4).unwrap(), 1, "snd_counter");
    // The next ring uses the other buffer (0x900).
    r.sq.write_rdma_write(2, 0x10, 2, &s, 0).unwrap();
    r.sq.ring();
    assert_eq!(uar_bytes(&r, 0x900, 64), block(&r, 1, 1));
    // Two WQEs in one ring: the 8-byte doorbell (ctrl's first 8 bytes of
    // the last WQE) at 0x800; the rest of the BlueFlame buffer untouched.
    r.sq.write_rdma_write(3, 0x10, 2, &s, 0).unwrap();
    r.sq.write_rdma_write(4, 0x10, 2, &s, 0).unwrap();
    r.sq.ring();
    let last = block(&r, 3, 1);
    assert_eq!(uar_bytes(&r, 0x800, 8), last[..8]);
    assert_eq!(uar_bytes(&r, 0x808, 56), b0[8..], "no BlueFlame copy");
    assert_eq!(r.dbrec.read_u32_be(4).unwrap(), 4);
    // BlueFlame off: a lone WQE rings the doorbell only.
    let mut d = rig(4);
    d.sq.set_blueflame(false);
    d.sq.write_rdma_write(1, 0x10, 2, &s, 0).unwrap();
    d.sq.ring();
    assert_eq!(uar_bytes(&d, 0x800, 8), block(&d, 0, 1)[..8]);
    assert_eq!(uar_bytes(&d, 0x808, 56), vec![0; 56]);
}

#[test]
fn blueflame_is_used_only_over_a_write_combining_uar() {
    let s = sge(0x1000, 16, 1);
    for (mem, bf) in [
        (MemType::WriteCombining, true),
        (MemType::Uncached, false),
        (MemType::WriteBack, false),
    ] {
        let mut r = rig_on(4, mem);
        assert_eq!(r.sq.blueflame(), bf, "{mem:?}: the mode chosen");
        assert_eq!(r.sq.set_blueflame(true), bf, "{mem:?}: asked for");
        // A lone one-block WQE: over uncached (or ordinary) memory only
        // the 8-byte doorbell reaches the UAR, never the 64-byte copy.
        r.sq.write_rdma_write(1, 0x10, 2, &s, 0).unwrap();
        r.sq.ring();
        let b0 = block(&r, 0, 1);
        assert_eq!(uar_bytes(&r, 0x800, 8), b0[..8], "{mem:?}");
        let rest = if bf { b0[8..].to_vec() } else { vec![0; 56] };
        assert_eq!(uar_bytes(&r, 0x808, 56), rest, "{mem:?}");
    }
    assert_eq!(
        Mmio::new(MmapRegion::<()>::new(4096).unwrap(), 0).mem_type(),
        MemType::Uncached,
        "a mapping of unknown type is taken as uncached"
    );
}

/// A post of one WR rings with the control word it has just written
/// (`ring_one`, the count known to be one block): the same doorbell,
/// BlueFlame copy and record as `ring` after the same WQE.
#[test]
fn ring_one_rings_as_ring_does() {
    let s = sge(0x1000, 16, 1);
    for bf in [true, false] {
        let (mut a, mut b) = (rig(4), rig(4));
        a.sq.set_blueflame(bf);
        b.sq.set_blueflame(bf);
        for id in 0..3 {
            a.sq.write_rdma_write(id, 0x10 + id, 2, &s, 0).unwrap();
            a.sq.ring();
            assert!(b.sq.has_known_room());
            let ctrl = b.sq.put_rdma_write(id, 0x10 + id, 2, &s, 0);
            b.sq.ring_one(ctrl);
            assert_eq!(block(&a, id as usize, 1), block(&b, id as usize, 1));
            assert_eq!(
                uar_bytes(&a, 0x800, 0x200),
                uar_bytes(&b, 0x800, 0x200),
                "BlueFlame {bf}, WQE {id}"
            );
            assert_eq!(a.dbrec.read_u32_be(4).unwrap(), id as u32 + 1);
            assert_eq!(b.dbrec.read_u32_be(4).unwrap(), id as u32 + 1);
        }
    }
}

#[test]
fn the_doorbell_carries_the_last_wqe_whatever_its_size() {
    let s = sge(0x1000, 16, 1);
    let four = [s, s, s, s];
    let big = wr(SendOp::Send, Payload::Sges(&four), 0);
    let mut r = rig(4);
    r.sq.set_blueflame(false);
    // A two-block WQE last (ctrl + 4 data segments = 80 bytes): its first
    // block's ctrl word, not the block before the counter.
    r.sq.write_rdma_write(1, 0x10, 2, &s, 0).unwrap();
    r.sq.write_wr(&big, QpType::Rc, 64).unwrap();
    assert_eq!(r.sq.pc(), 3);
    r.sq.ring();
    assert_eq!(uar_bytes(&r, 0x800, 8), block(&r, 1, 1)[..8]);
    // A one-block WQE after a two-block one: that one.
    r.sq.write_wr(&big, QpType::Rc, 64).unwrap();
    r.sq.write_rdma_write(2, 0x10, 2, &s, 0).unwrap();
    r.sq.ring();
    assert_eq!(uar_bytes(&r, 0x900, 8), block(&r, 5, 1)[..8]);
    // A two-block WQE rewound away, then a one-block WQE ending where it
    // ended: the one-block WQE rings.
    let pc = r.sq.pc();
    r.sq.write_wr(&big, QpType::Rc, 64).unwrap();
    r.sq.rewind(pc);
    r.sq.write_rdma_write(3, 0x10, 2, &s, 0).unwrap();
    r.sq.write_rdma_write(4, 0x10, 2, &s, 0).unwrap();
    r.sq.ring();
    assert_eq!(uar_bytes(&r, 0x800, 8), block(&r, 7, 1)[..8]);
    assert_eq!(opcode_index(&ctrl(&block(&r, 7, 1))), (0x08, 7));
}

/// A list's run of 1-SGE RDMA WRITEs: the same WQEs one by one writes,
/// up to the first other WR and the room known, and the doorbell names
/// the run's last WQE.
#[test]
fn a_run_of_writes_stops_at_another_wr_or_the_room() {
    let s = sge(0x1000, 16, 1);
    let write = |id: u64| SendWr {
        wr_id: id,
        ..wr(
            SendOp::RdmaWrite {
                raddr: 0x9000 + id,
                rkey: 5,
            },
            Payload::Sges(std::slice::from_ref(&s)),
            send_flags::SIGNALED,
        )
    };
    let mut r = rig(2);
    let mut one = rig(2);
    r.sq.set_blueflame(false);
    one.sq.set_blueflame(false);
    // A SEND third: the run is the two WRITEs before it.
    let send = wr(SendOp::Send, Payload::Sges(std::slice::from_ref(&s)), 0);
    assert_eq!(
        r.sq.write_rdma_write_run(&[write(0), write(1), send, write(3)]),
        2
    );
    for id in 0..2 {
        one.sq
            .write_rdma_write(id, 0x9000 + id, 5, &s, send_flags::SIGNALED)
            .unwrap();
    }
    assert_eq!(block(&r, 0, 2), block(&one, 0, 2), "the WQEs one by one");
    r.sq.ring();
    assert_eq!(uar_bytes(&r, 0x800, 8), block(&r, 1, 1)[..8]);
    assert_eq!(opcode_index(&ctrl(&block(&r, 1, 1))), (0x08, 1));
    // Two blocks of room left in a ring of four: two of the three.
    assert_eq!(
        r.sq.write_rdma_write_run(&[write(4), write(5), write(6)]),
        2
    );
    assert_eq!(r.sq.pc(), 4);
    assert_eq!(r.sq.write_rdma_write_run(&[write(7)]), 0, "no room known");
    r.sq.ring();
    assert_eq!(uar_bytes(&r, 0x900, 8), block(&r, 3, 1)[..8]);
    assert_eq!(opcode_index(&ctrl(&block(&r, 3, 1))), (0x08, 3));
    // Completions free the ring, but a run reads no tail: the general
    // path does (the WRITE after it then runs with the room it saw).
    r.track.sq_complete(3);
    assert_eq!(r.sq.write_rdma_write_run(&[write(8)]), 0, "tail not read");
    r.sq.write_rdma_write(8, 0x9008, 5, &s, 0).unwrap();
    assert_eq!(r.sq.write_rdma_write_run(&[write(9)]), 1);
    // An empty entry is the general writer's (no data segment).
    let empty = sge(0x1000, 0, 1);
    let w = SendWr {
        payload: Payload::Sges(std::slice::from_ref(&empty)),
        ..write(10)
    };
    assert_eq!(r.sq.write_rdma_write_run(&[w]), 0);
}

#[test]
fn a_full_ring_refuses_and_completions_free_it() {
    let s = sge(0x1000, 16, 1);
    let mut r = rig(2);
    for i in 0..4 {
        r.sq.write_rdma_write(i, 0, 1, &s, 0).unwrap();
    }
    assert_eq!(
        r.sq.write_rdma_write(9, 0, 1, &s, 0),
        Err(PostError::QueueFull)
    );
    assert_eq!(r.track.sq_complete(1), 1, "completes 0 and 1");
    r.sq.write_rdma_write(4, 0, 1, &s, 0).unwrap();
    r.sq.write_rdma_write(5, 0, 1, &s, 0).unwrap();
    assert_eq!(
        r.sq.write_rdma_write(6, 0, 1, &s, 0),
        Err(PostError::QueueFull)
    );
    // The ring wrapped: WQE index 4 sits in block 0.
    assert_eq!(opcode_index(&ctrl(&block(&r, 0, 1))), (0x08, 4));
}

// ---- CQEs ----

const OP_OWN: usize = mlx5_hw::cqe::CQE_OP_OWN_OFFSET;

fn cqe(opcode: u8, owner: u8, f: impl FnOnce(&mut [u8; 64])) -> [u8; 64] {
    let mut e = [0u8; 64];
    let q = cqe64::SOP_DROP_QPN.off / 8;
    e[q..q + 4].copy_from_slice(&QPN.to_be_bytes());
    f(&mut e);
    e[OP_OWN] = (opcode << 4) | owner;
    e
}

fn put(e: &mut [u8], f: mlx5_hw::bits::BitField, v: &[u8]) {
    let o = f.off / 8;
    e[o..o + v.len()].copy_from_slice(v);
}

/// A track with send WQEs 0..n posted with wr_ids 100.. and receives.
fn tracked() -> Rig {
    let mut r = rig(4);
    let s = sge(0x1000, 16, 1);
    for i in 0..8 {
        r.sq.write_rdma_write(100 + i, 0, 1, &s, 0).unwrap();
    }
    r
}

#[test]
fn requester_cqes_decode_by_the_wqe_opcode() {
    let r = tracked();
    // (s_wqe_opcode, WC opcode, byte_len kept)
    for (i, (sop, want, len)) in [
        (0x08u8, WcOpcode::RdmaWrite, 0u32),
        (0x09, WcOpcode::RdmaWrite, 0),
        (0x0a, WcOpcode::Send, 0),
        (0x0b, WcOpcode::Send, 0),
        (0x10, WcOpcode::RdmaRead, 4000),
        (0x11, WcOpcode::CompSwap, 8),
        (0x12, WcOpcode::FetchAdd, 8),
    ]
    .into_iter()
    .enumerate()
    {
        let e = cqe(0x0, 0, |e| {
            put(
                e,
                cqe64::SOP_DROP_QPN,
                &((u32::from(sop) << 24) | QPN).to_be_bytes(),
            );
            put(e, cqe64::WQE_COUNTER, &(i as u16).to_be_bytes());
            put(e, cqe64::BYTE_CNT, &4000u32.to_be_bytes());
        });
        let mut wc = Wc::default();
        cqe_to_wc(&e, &r.track, &mut wc);
        assert_eq!(
            (wc.status, wc.opcode, wc.wr_id, wc.qp_num, wc.byte_len),
            (WcStatus::Success, want, 100 + i as u64, QPN, len),
            "s_wqe_opcode {sop:#x}"
        );
    }
}

#[test]
fn responder_cqes_carry_length_source_qp_immediate_and_grh() {
    let buf = DmaBuffer::new(4096).unwrap();
    let dbrec = DmaBuffer::new(4096).unwrap();
    let track = WqTrack::new(QPN, 4, 4);
    // Four WQEs of one data segment each.
    let mut rq = RecvRing::new(buf.clone(), 0, 16, 4, dbrec, 0, track.clone()).unwrap();
    let s = sge(0x1000, 64, 1);
    let rbuf = buf;
    for id in [500, 501, 502, 503] {
        rq.post(&RecvWr {
            wr_id: id,
            sg_list: &[s],
        })
        .unwrap();
    }
    // Receive WQE 0: one data segment (stride 16: no terminator fits).
    let d = WqeDataSeg::read_from_bytes(&{
        let mut b = [0u8; 16];
        rbuf.read(0, &mut b).unwrap();
        b
    })
    .unwrap();
    assert_eq!(
        (d.byte_count.get(), d.lkey.get(), d.addr.get()),
        (64, 1, 0x1000)
    );
    // PRM CQE opcodes: RESP_SEND 2, RESP_SEND_IMM 3, RESP_WR_IMM 1.
    for (k, (op, imm, grh, want_op, want_flags)) in [
        (2u8, 0u32, 0u32, WcOpcode::Recv, 0u32),
        (
            3,
            0xabcd_0123,
            0,
            WcOpcode::Recv,
            crate::cq::wc_flags::WITH_IMM,
        ),
        (
            1,
            0x55,
            0,
            WcOpcode::RecvRdmaWithImm,
            crate::cq::wc_flags::WITH_IMM,
        ),
        (2, 0, 2, WcOpcode::Recv, crate::cq::wc_flags::GRH),
    ]
    .into_iter()
    .enumerate()
    {
        let e = cqe(op, 0, |e| {
            put(e, cqe64::BYTE_CNT, &(1000 + k as u32).to_be_bytes());
            put(e, cqe64::IMMEDIATE, &imm.to_be_bytes());
            // flags_rqpn: l3 header type 29:28 (GRH present), source QP 23:0.
            put(
                e,
                cqe64::FLAGS_RQPN,
                &((grh << 28) | 0x00_0777).to_be_bytes(),
            );
        });
        let mut wc = Wc::default();
        cqe_to_wc(&e, &track, &mut wc);
        assert_eq!(
            (
                wc.wr_id,
                wc.status,
                wc.opcode,
                wc.byte_len,
                wc.src_qp,
                wc.qp_num
            ),
            (
                500 + k as u64,
                WcStatus::Success,
                want_op,
                1000 + k as u32,
                0x777,
                QPN
            ),
            "case {k}"
        );
        assert_eq!(wc.wc_flags, want_flags, "case {k}");
        // ibv_wc's imm_data: network order (the bytes as they came).
        assert_eq!(wc.imm_data, imm.to_be(), "case {k}");
        assert_eq!(wc.imm(), (imm != 0).then_some(imm), "case {k}");
    }
}

#[test]
fn error_cqes_keep_syndrome_and_vendor_syndrome() {
    // PRM syndromes and the verbs status rdma-core maps each to.
    let table = [
        (0x01u8, WcStatus::LocLenErr),
        (0x02, WcStatus::LocQpOpErr),
        (0x04, WcStatus::LocProtErr),
        (0x05, WcStatus::WrFlushErr),
        (0x06, WcStatus::MwBindErr),
        (0x10, WcStatus::BadRespErr),
        (0x11, WcStatus::LocAccessErr),
        (0x12, WcStatus::RemInvReqErr),
        (0x13, WcStatus::RemAccessErr),
        (0x14, WcStatus::RemOpErr),
        (0x15, WcStatus::RetryExcErr),
        (0x16, WcStatus::RnrRetryExcErr),
        (0x22, WcStatus::RemAbortErr),
        (0x7f, WcStatus::GeneralErr),
    ];
    let r = tracked();
    for (i, (synd, want)) in table.into_iter().enumerate() {
        // REQ_ERR (0xd) completes send WQE `i % 8`.
        let e = cqe(0xd, 0, |e| {
            put(e, err_cqe::SYNDROME, &[synd]);
            put(e, err_cqe::VENDOR_ERR_SYND, &[0x5a]);
            put(e, cqe64::WQE_COUNTER, &((i % 8) as u16).to_be_bytes());
        });
        let mut wc = Wc::default();
        cqe_to_wc(&e, &r.track, &mut wc);
        assert_eq!(wc.status, want, "syndrome {synd:#x}");
        assert_eq!(wc.vendor_err, (u32::from(synd) << 8) | 0x5a);
        assert_eq!(wc.wr_id, 100 + (i % 8) as u64);
        assert_eq!(wc.qp_num, QPN);
    }
    // WcStatus numbers are libibverbs' enum ibv_wc_status.
    assert_eq!(
        [
            WcStatus::Success as u32,
            WcStatus::LocLenErr as u32,
            WcStatus::LocProtErr as u32,
            WcStatus::WrFlushErr as u32,
            WcStatus::RemAccessErr as u32,
            WcStatus::RetryExcErr as u32,
            WcStatus::RnrRetryExcErr as u32,
            WcStatus::GeneralErr as u32,
        ],
        [0, 1, 4, 5, 10, 12, 13, 21]
    );
}

#[test]
fn cqes_are_polled_by_owner_bit_across_the_wrap() {
    let buf = DmaBuffer::new(4096).unwrap();
    let dbrec = DmaBuffer::new(4096).unwrap();
    let uar = Arc::new(Mmio::new(MmapRegion::<()>::new(4096).unwrap(), 0));
    let r = tracked();
    let mut cq = CqRing::new(buf.clone(), 2, dbrec.clone(), 0, 7, uar, 0).unwrap();
    let mut wc = [Wc::default(); 8];
    assert_eq!(
        cq.poll_one_qp(&r.track, &mut wc),
        0,
        "fresh ring: all INVALID"
    );
    let put_cqe = |slot: usize, idx: u16, owner: u8| {
        let e = cqe(0x0, owner, |e| {
            put(e, cqe64::WQE_COUNTER, &idx.to_be_bytes())
        });
        buf.write(slot * 64, &e).unwrap();
    };
    // First pass: owner 0.
    for i in 0..4 {
        put_cqe(i, i as u16, 0);
    }
    assert_eq!(cq.poll_one_qp(&r.track, &mut wc), 4);
    assert_eq!(
        wc[..4].iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        [100, 101, 102, 103]
    );
    assert_eq!(dbrec.read_u32_be(0).unwrap(), 4, "set_ci");
    // Second pass expects owner 1: stale owner-0 entries are not new.
    assert_eq!(cq.poll_one_qp(&r.track, &mut wc), 0);
    put_cqe(0, 4, 1);
    put_cqe(1, 5, 0);
    assert_eq!(cq.poll_one_qp(&r.track, &mut wc), 1);
    assert_eq!(wc[0].wr_id, 104);
    assert_eq!(cq.ci(), 5);
}

// ---- modify: the attribute masks verbs checks ----

#[test]
fn transition_masks_are_ib_modify_qp_is_ok_s_table() {
    use QpState::*;
    use QpType::*;
    // libibverbs' IBV_QP_* values, written out.
    const PKEY: u32 = 16;
    const PORT: u32 = 32;
    const QKEY: u32 = 64;
    const ACCESS: u32 = 8;
    const CUR: u32 = 2;
    const AV: u32 = 128;
    const MTU: u32 = 256;
    const TIMEOUT: u32 = 512;
    const RETRY: u32 = 1024;
    const RNR_RETRY: u32 = 2048;
    const RQ_PSN: u32 = 4096;
    const RD_ATOMIC: u32 = 8192;
    const ALT: u32 = 16384;
    const MIN_RNR: u32 = 32768;
    const SQ_PSN: u32 = 65536;
    const DEST_RD_ATOMIC: u32 = 131_072;
    const MIG: u32 = 262_144;
    const DEST_QPN: u32 = 1_048_576;
    let t = |ty, a, b| transition_masks(ty, a, b);
    assert_eq!(t(Rc, Reset, Init), Some((PKEY | PORT | ACCESS, 0)));
    assert_eq!(t(Uc, Reset, Init), Some((PKEY | PORT | ACCESS, 0)));
    assert_eq!(t(Ud, Reset, Init), Some((PKEY | PORT | QKEY, 0)));
    assert_eq!(
        t(Rc, Init, Rtr),
        Some((
            AV | MTU | DEST_QPN | RQ_PSN | DEST_RD_ATOMIC | MIN_RNR,
            ALT | ACCESS | PKEY
        ))
    );
    assert_eq!(
        t(Uc, Init, Rtr),
        Some((AV | MTU | DEST_QPN | RQ_PSN, ALT | ACCESS | PKEY))
    );
    assert_eq!(t(Ud, Init, Rtr), Some((0, PKEY | QKEY)));
    assert_eq!(
        t(Rc, Rtr, Rts),
        Some((
            SQ_PSN | TIMEOUT | RETRY | RNR_RETRY | RD_ATOMIC,
            CUR | ALT | ACCESS | MIN_RNR | MIG
        ))
    );
    assert_eq!(t(Ud, Rtr, Rts), Some((SQ_PSN, CUR | QKEY)));
    assert_eq!(t(Rc, Rts, Sqd), Some((0, 4)));
    assert_eq!(t(Ud, Sqe, Rts), Some((0, CUR | QKEY)));
    assert_eq!(t(Uc, Sqe, Rts), Some((0, CUR | ACCESS)));
    assert_eq!(t(Rc, Sqe, Rts), None, "RC has no SQE state to leave");
    assert_eq!(t(Rc, Reset, Rtr), None);
    assert_eq!(t(Rc, Init, Rts), None);
    assert_eq!(t(Ud, Rts, Err), Some((0, 0)));
    assert_eq!(t(Rc, Rtr, Reset), Some((0, 0)));
}

#[test]
fn a_short_receive_list_ends_with_an_invalid_lkey_segment() {
    let buf = DmaBuffer::new(4096).unwrap();
    buf.fill(0, 4096, 0xee).unwrap();
    let dbrec = DmaBuffer::new(4096).unwrap();
    // Four WQEs of four data segments each.
    let mut rq = RecvRing::new(
        buf.clone(),
        0,
        64,
        4,
        dbrec.clone(),
        0,
        WqTrack::new(QPN, 4, 4),
    )
    .unwrap();
    let s = [sge(0x1000, 10, 7), sge(0x2000, 20, 8)];
    rq.post(&RecvWr {
        wr_id: 1,
        sg_list: &s,
    })
    .unwrap();
    let mut b = [0u8; 64];
    buf.read(0, &mut b).unwrap();
    for (i, x) in s.iter().enumerate() {
        let d = WqeDataSeg::read_from_bytes(&b[16 * i..16 * i + 16]).unwrap();
        assert_eq!(
            (d.byte_count.get(), d.lkey.get(), d.addr.get()),
            (x.length(), x.lkey(), x.addr())
        );
    }
    let t = WqeDataSeg::read_from_bytes(&b[32..48]).unwrap();
    assert_eq!(
        (t.byte_count.get(), t.lkey.get(), t.addr.get()),
        (0, 0x100, 0),
        "MLX5_INVALID_LKEY"
    );
    let too_many = [s[0]; 5];
    assert_eq!(
        rq.post(&RecvWr {
            wr_id: 2,
            sg_list: &too_many
        }),
        Err(PostError::TooLarge)
    );
    rq.ring();
    assert_eq!(dbrec.read_u32_be(0).unwrap(), 1, "rcv_counter");
}

#[test]
fn required_mask_is_state_plus_the_required_attributes() {
    use crate::qp::{attr_mask as m, required_mask, QpState as S, QpType as T};
    assert_eq!(
        required_mask(T::Rc, S::Init, S::Rtr),
        m::STATE
            | m::AV
            | m::PATH_MTU
            | m::DEST_QPN
            | m::RQ_PSN
            | m::MAX_DEST_RD_ATOMIC
            | m::MIN_RNR_TIMER
    );
    assert_eq!(
        required_mask(T::Ud, S::Reset, S::Init),
        m::STATE | m::PKEY_INDEX | m::PORT | m::QKEY
    );
    assert_eq!(required_mask(T::Uc, S::Rtr, S::Rts), m::STATE | m::SQ_PSN);
    // A transition verbs does not know: STATE alone (modify refuses it).
    assert_eq!(required_mask(T::Rc, S::Reset, S::Rts), m::STATE);
}

#[test]
fn qp_sizes_follow_the_caps_and_refuse_what_does_not_fit() {
    let cap = |wr, sge, inline, rwr, rsge| QpCap {
        max_send_wr: wr,
        max_recv_wr: rwr,
        max_send_sge: sge,
        max_recv_sge: rsge,
        max_inline_data: inline,
    };
    // RC, 1 SGE, no inline: ctrl + raddr + atomic + one data segment = one block.
    let s = QpSizes::new(cap(100, 1, 0, 10, 1), QpType::Rc, false, 1 << 15).unwrap();
    assert_eq!(
        (s.wqe_bbs, s.sq_cnt, s.rq_cnt, s.rq_stride),
        (1, 128, 16, 16)
    );
    // The RQ (16 x 16 bytes) is whole blocks; the SQ starts after it.
    assert_eq!((s.sq_base(), s.buf_len()), (256, 256 + 128 * 64));
    let g = s.granted(cap(100, 1, 0, 10, 1));
    assert_eq!((g.max_send_wr, g.max_recv_wr, g.max_recv_sge), (128, 16, 1));
    // 64 - ctrl, raddr, atomic (48) - the inline header (4).
    assert_eq!(g.max_inline_data, 12);
    // Sized for a memory-window bind (the C library's RC QPs, as mlx5_ib's
    // sq_overhead): ctrl + UMR ctrl + mkey + padded KLM (192) + one data
    // segment = four blocks a WQE; UD is not sized so.
    let s = QpSizes::for_st(
        cap(100, 1, 0, 10, 1),
        QpType::Rc,
        false,
        1 << 15,
        QpType::Rc.st(),
        true,
    )
    .unwrap();
    assert_eq!((s.wqe_bbs, s.sq_cnt), (4, 512));
    let s = QpSizes::for_st(
        cap(8, 4, 0, 1, 1),
        QpType::Ud,
        false,
        1 << 15,
        QpType::Ud.st(),
        true,
    )
    .unwrap();
    assert_eq!(s.wqe_bbs, 2);
    // UD, 4 SGEs: ctrl + datagram (64) + 4 x 16 = two blocks per WQE.
    let s = QpSizes::new(cap(8, 4, 0, 1, 1), QpType::Ud, false, 1 << 15).unwrap();
    assert_eq!((s.wqe_bbs, s.sq_cnt), (2, 16));
    // One receive WQE of 16 bytes still takes a whole block (4 WQEs).
    assert_eq!((s.rq_cnt, s.sq_base()), (4, 64));
    // With an SRQ, no receive queue of its own.
    let s = QpSizes::new(cap(8, 1, 0, 8, 1), QpType::Rc, true, 1 << 15).unwrap();
    assert_eq!((s.rq_cnt, s.rq_stride, s.sq_base()), (0, 0, 0));
    // Beyond the device, or beyond u32: an error, never an overflow.
    for (c, why) in [
        (cap(u32::MAX, 1, 0, 1, 1), "max_send_wr beyond the device's"),
        (cap(1 << 16, 1, 0, 1, 1), "max_send_wr beyond the device's"),
        (cap(1, 1, 0, u32::MAX, 1), "max_recv_wr beyond the device's"),
        (
            cap(1, MAX_SGE as u32 + 1, 0, 1, 1),
            "QP capacities beyond the device's",
        ),
        (
            cap(1, 1, MAX_INLINE as u32 + 1, 1, 1),
            "QP capacities beyond the device's",
        ),
    ] {
        let e = QpSizes::new(c, QpType::Rc, false, 1 << 15).unwrap_err();
        assert!(matches!(e, Error::Invalid(m) if m == why), "{c:?}: {e}");
    }
}
