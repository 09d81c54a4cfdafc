//! End to end, mlx5dv indirect mkeys between two cabled device-model
//! functions: `create_mkey`, `wr_mr_list` (KLM list), `wr_mr_interleaved`
//! (repeat block), the `wr_mkey_configure` setters, resolution through
//! them as an rkey (WRITE, READ, atomics) and as an lkey (local SGE),
//! each refusal with its driver error or CQE status, the small fence of a
//! reconfiguration after a READ that uses the key, QUERY_MKEY of a KLM
//! key, and `Mr::access()` after an access UMR.

mod verbs_common;

use mlx5_hw::ifc::{mkc, query_mkey_in, query_mkey_out};
use mlx5_hw::opcode::Opcode;
use verbs::cq::{WcOpcode, WcStatus};
use verbs::mkey::{mkey_init_flags as mf, DvMkey, MkeyConfAttr, MkeyInitAttr, MrInterleaved};
use verbs::mr::{access, Sge};
use verbs::qp::{send_flags as sf, Payload, Qp, QpCap, QpType, SendOp, SendWr};
use verbs::wr::PostError;
use verbs::Error;
use verbs_common::*;

const SIG_INL: u32 = sf::SIGNALED | sf::INLINE;

/// An RC QP pair whose send WQEs have room for 24 inline entries.
fn umr_qps(p: &Pair) -> (Qp, Qp) {
    qp_pair(
        p,
        QpType::Rc,
        QpCap {
            max_inline_data: 512,
            ..cap(16)
        },
    )
}

fn mkey(p: &Pair, max: u16) -> DvMkey {
    let mut attr = MkeyInitAttr {
        create_flags: mf::INDIRECT,
        max_entries: max,
    };
    let k = p.b.pd.create_mkey(&mut attr).unwrap();
    assert_eq!(attr.max_entries, max.next_multiple_of(4));
    k
}

/// The next completion on `side`'s CQ: (wr_id, status, opcode).
fn next(s: &mut Side) -> (u64, WcStatus, WcOpcode) {
    let wc = poll_n(&mut s.cq, 1)[0];
    (wc.wr_id, wc.status, wc.opcode)
}

/// a runs `op` with `len` bytes of its buffer from offset `off` (seeded
/// with `seed` first); the status.
fn a_does(p: &mut Pair, qa: &mut Qp, op: SendOp, off: u64, len: u32, seed: u8) -> WcStatus {
    fill(&p.a.buf, off as usize, len as usize, seed);
    let sge = p.a.mr.sge(off, len).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 100,
        op,
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    next(&mut p.a).1
}

#[test]
fn mr_list_carries_write_read_atomics_and_local_sges() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = umr_qps(&p);
    let k = mkey(&p, 3);
    let list = [
        p.b.mr.sge(0x100, 0x80).unwrap(),
        p.b.mr.sge(0x1000, 0x80).unwrap(),
    ];
    let acc = access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ;
    let mut b = qb.wr_start();
    b.wr_id(1, SIG_INL)
        .mr_list(&k, acc | access::REMOTE_ATOMIC, &list);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b), (1, WcStatus::Success, WcOpcode::Umr));
    assert_eq!(
        (k.length(), k.access()),
        (0x100, acc | access::REMOTE_ATOMIC)
    );
    // WRITE through the rkey: zero-based, split over the two pieces.
    let w = SendOp::RdmaWrite {
        raddr: 0x40,
        rkey: k.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 0x80, 1), WcStatus::Success);
    let sent = read(&p.a.buf, 0, 0x80);
    assert_eq!(read(&p.b.buf, 0x140, 0x40), sent[..0x40]);
    assert_eq!(read(&p.b.buf, 0x1000, 0x40), sent[0x40..]);
    // READ back across the boundary.
    let r = SendOp::RdmaRead {
        raddr: 0x40,
        rkey: k.rkey(),
    };
    assert_eq!(
        a_does(&mut p, &mut qa, r, 0x800, 0x80, 2),
        WcStatus::Success
    );
    assert_eq!(read(&p.a.buf, 0x800, 0x80), sent);
    // Fetch-and-add at key byte 0x88 = region byte 0x1008.
    let before = u64::from_be_bytes(read(&p.b.buf, 0x1008, 8).try_into().unwrap());
    let fa = SendOp::AtomicFetchAdd {
        raddr: 0x88,
        rkey: k.rkey(),
        add: 5,
    };
    assert_eq!(a_does(&mut p, &mut qa, fa, 0x900, 8, 3), WcStatus::Success);
    let after = u64::from_be_bytes(read(&p.b.buf, 0x1008, 8).try_into().unwrap());
    assert_eq!(after, before.wrapping_add(5));
    let old = u64::from_be_bytes(read(&p.a.buf, 0x900, 8).try_into().unwrap());
    assert_eq!(old, before);
    // b sends from the key as a local SGE: the two pieces, in order.
    // SAFETY: bytes 0..0x100 of the key are the two pieces of b's MR.
    let sge = unsafe { Sge::new_unchecked(0, 0x100, k.lkey()) };
    qb.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::RdmaWrite {
            raddr: p.a.mr.addr() + 0x2000,
            rkey: p.a.mr.rkey(),
        },
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::Success);
    let mut want = read(&p.b.buf, 0x100, 0x80);
    want.extend(read(&p.b.buf, 0x1000, 0x80));
    assert_eq!(read(&p.a.buf, 0x2000, 0x100), want);
    // Past the layout: remote access error.
    let (mut qa2, _qb2) = umr_qps(&p);
    let w = SendOp::RdmaWrite {
        raddr: 0xf8,
        rkey: k.rkey(),
    };
    assert_eq!(
        a_does(&mut p, &mut qa2, w, 0, 16, 4),
        WcStatus::RemAccessErr
    );
}

#[test]
fn mr_interleaved_strides_through_two_regions() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = umr_qps(&p);
    let k = mkey(&p, 2);
    let base = p.b.mr.addr();
    let data = [
        MrInterleaved {
            addr: base + 0x3000,
            bytes_count: 16,
            bytes_skip: 48,
            lkey: p.b.mr.lkey(),
        },
        MrInterleaved {
            addr: base + 0x5000,
            bytes_count: 8,
            bytes_skip: 24,
            lkey: p.b.mr.lkey(),
        },
    ];
    let mut b = qb.wr_start();
    b.wr_id(1, SIG_INL).mr_interleaved(&k, ALL, 4, &data);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b), (1, WcStatus::Success, WcOpcode::Umr));
    assert_eq!(k.length(), 96);
    let w = SendOp::RdmaWrite {
        raddr: 0,
        rkey: k.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 96, 5), WcStatus::Success);
    let sent = read(&p.a.buf, 0, 96);
    for r in 0..4 {
        let piece = &sent[r * 24..r * 24 + 24];
        assert_eq!(read(&p.b.buf, 0x3000 + r * 64, 16), piece[..16]);
        assert_eq!(read(&p.b.buf, 0x5000 + r * 32, 8), piece[16..]);
    }
    // The same through the setters, one by one: two repetitions.
    let mut b = qb.wr_start();
    b.wr_id(2, SIG_INL)
        .mkey_configure(&k, 2, &MkeyConfAttr::default())
        .set_mkey_layout_interleaved(2, &data[..1])
        .set_mkey_access_flags(access::LOCAL_WRITE | access::REMOTE_READ);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b), (2, WcStatus::Success, WcOpcode::Umr));
    assert_eq!(k.length(), 32);
    // READ of both repetitions; a WRITE is refused now (no remote write).
    let r = SendOp::RdmaRead {
        raddr: 0,
        rkey: k.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, r, 0x400, 32, 6), WcStatus::Success);
    assert_eq!(
        read(&p.a.buf, 0x400, 32),
        [&sent[..16], &sent[24..40]].concat()
    );
    let w = SendOp::RdmaWrite {
        raddr: 0,
        rkey: k.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 8, 7), WcStatus::RemAccessErr);
}

#[test]
fn mkey_wrs_the_driver_refuses_post_nothing() {
    let mut p = pair(1 << 16);
    let (_qa, mut qb) = umr_qps(&p);
    let k = mkey(&p, 4);
    let one = [p.b.mr.sge(0, 64).unwrap()];
    let five = [p.b.mr.sge(0, 64).unwrap(); 5];
    type Build = fn(&mut verbs::wr::WrBatch<'_>, &DvMkey, &[Sge], &[Sge]);
    let cases: [(&str, Build, PostError); 6] = [
        (
            "no IBV_SEND_INLINE (EOPNOTSUPP)",
            |b, k, one, _| {
                b.wr_id(1, sf::SIGNALED).mr_list(k, 0, one);
            },
            PostError::BadOp,
        ),
        (
            "a setter without wr_mkey_configure",
            |b, _, one, _| {
                b.wr_id(1, SIG_INL).set_mkey_layout_list(one);
            },
            PostError::BadMkeyWr("setter without wr_mkey_configure"),
        ),
        (
            "access flags set twice",
            |b, k, _, _| {
                b.wr_id(1, SIG_INL)
                    .mkey_configure(k, 3, &MkeyConfAttr::default())
                    .set_mkey_access_flags(0)
                    .set_mkey_access_flags(0);
            },
            PostError::BadMkeyWr("access flags set twice"),
        ),
        (
            "MW_BIND is no mkey access flag",
            |b, k, one, _| {
                b.wr_id(1, SIG_INL).mr_list(k, access::MW_BIND, one);
            },
            PostError::BadMkeyWr("access flags beyond the mkey's four"),
        ),
        (
            "five entries on a key of four (ENOMEM)",
            |b, k, _, five| {
                b.wr_id(1, SIG_INL).mr_list(k, 0, five);
            },
            PostError::TooLarge,
        ),
        (
            "a configuration left without its setters",
            |b, k, _, _| {
                b.wr_id(1, SIG_INL)
                    .mkey_configure(k, 2, &MkeyConfAttr::default())
                    .set_mkey_access_flags(0);
            },
            PostError::BadMkeyWr("mkey configuration missing setters"),
        ),
    ];
    for (what, build, want) in cases {
        let mut b = qb.wr_start();
        build(&mut b, &k, &one, &five);
        assert_eq!(b.complete(), Err(want), "{what}");
    }
    assert!(nothing_more(&p.fabric, &mut p.b.cq), "nothing was posted");
    // create_mkey: INDIRECT is required; signature and crypto keys are not made.
    for flags in [
        0,
        mf::BLOCK_SIGNATURE | mf::INDIRECT,
        mf::CRYPTO | mf::INDIRECT,
    ] {
        let mut attr = MkeyInitAttr {
            create_flags: flags,
            max_entries: 1,
        };
        assert!(matches!(
            p.b.pd.create_mkey(&mut attr),
            Err(Error::NotSupported(_))
        ));
    }
    // Still usable after all that.
    let mut b = qb.wr_start();
    b.wr_id(9, SIG_INL).mr_list(&k, ALL, &one);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b), (9, WcStatus::Success, WcOpcode::Umr));
}

#[test]
fn mkey_refusals_of_the_device_carry_their_status() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = umr_qps(&p);
    let k = mkey(&p, 4);
    // An entry through a region of another PD: the UMR is taken (entries
    // are checked on access), the access fails the PD check.
    let pd2 = p.b.ctx.alloc_pd().unwrap();
    let other = pd2.reg_mr_buffer(&p.b.buf, 0, 4096, ALL).unwrap();
    let mut b = qb.wr_start();
    b.wr_id(1, SIG_INL)
        .mr_list(&k, ALL, &[other.sge(0, 64).unwrap()]);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::Success);
    let w = SendOp::RdmaWrite {
        raddr: 0,
        rkey: k.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 8, 1), WcStatus::RemAccessErr);
    // An entry whose region is gone (its key destroyed): remote access
    // error (on fresh QPs: the refused access put both in error).
    let gone = p.b.pd.reg_mr_buffer(&p.b.buf, 0, 4096, ALL).unwrap();
    let sge = gone.sge(0, 64).unwrap();
    gone.dereg().unwrap();
    let (mut qa2, mut qb) = umr_qps(&p);
    let mut b = qb.wr_start();
    b.wr_id(2, SIG_INL).mr_list(&k, ALL, &[sge]);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::Success);
    assert_eq!(a_does(&mut p, &mut qa2, w, 0, 8, 2), WcStatus::RemAccessErr);
    let (_qa5, mut qb) = umr_qps(&p);
    // A repeat block with no repetition: the device refuses the UMR
    // (local QP operation error), the QP goes to error.
    let data = [MrInterleaved {
        addr: p.b.mr.addr(),
        bytes_count: 16,
        bytes_skip: 0,
        lkey: p.b.mr.lkey(),
    }];
    let mut b = qb.wr_start();
    b.wr_id(3, SIG_INL).mr_interleaved(&k, ALL, 0, &data);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::LocQpOpErr);
    // A key of another PD configured from this PD's QP: local protection
    // error.
    let mut attr = MkeyInitAttr {
        create_flags: mf::INDIRECT,
        max_entries: 1,
    };
    let k2 = pd2.create_mkey(&mut attr).unwrap();
    let (_qa3, mut qb3) = umr_qps(&p);
    let mut b = qb3.wr_start();
    b.wr_id(4, SIG_INL)
        .mr_list(&k2, ALL, &[other.sge(0, 64).unwrap()]);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::LocProtErr);
    // A key never configured (still free): remote access error.
    let k3 = mkey(&p, 1);
    let (mut qa4, _qb4) = umr_qps(&p);
    let w3 = SendOp::RdmaWrite {
        raddr: 0,
        rkey: k3.rkey(),
    };
    assert_eq!(
        a_does(&mut p, &mut qa4, w3, 0, 8, 3),
        WcStatus::RemAccessErr
    );
    // The same key as a local SGE of b's: local protection error.
    let (_qa6, mut qb6) = umr_qps(&p);
    // SAFETY: the device refuses the free key before reaching any memory.
    let sge = unsafe { Sge::new_unchecked(0, 8, k3.lkey()) };
    qb6.post_send(&[SendWr {
        wr_id: 6,
        op: SendOp::RdmaWrite {
            raddr: p.a.mr.addr(),
            rkey: p.a.mr.rkey(),
        },
        payload: Payload::Sges(&[sge]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::LocProtErr);
    drop(k2);
    other.dereg().unwrap();
}

#[test]
fn a_reconfiguration_after_a_read_through_the_key_waits_for_it() {
    let mut p = pair(1 << 16);
    let (_qa, mut qb) = umr_qps(&p);
    let k = mkey(&p, 1);
    let mut b = qb.wr_start();
    b.wr_id(1, SIG_INL)
        .mr_list(&k, ALL, &[p.b.mr.sge(0x1000, 64).unwrap()]);
    b.complete().unwrap();
    assert_eq!(next(&mut p.b).1, WcStatus::Success);
    let src = fill(&p.a.buf, 0x4000, 64, 9);
    // One batch: a READ landing in the key (a local SGE through it), then
    // the key moved to another piece. The READ's data lands in the old
    // piece: the UMR (small fence) waited for it.
    // SAFETY: bytes 0..64 of the key are in b's MR, old and new layout.
    let sge = unsafe { Sge::new_unchecked(0, 64, k.lkey()) };
    let mut b = qb.wr_start();
    b.wr_id(2, sf::SIGNALED)
        .rdma_read(p.a.mr.rkey(), p.a.mr.addr() + 0x4000)
        .set_sge(sge);
    b.wr_id(3, SIG_INL)
        .mr_list(&k, ALL, &[p.b.mr.sge(0x2000, 64).unwrap()]);
    b.complete().unwrap();
    let wc = poll_n(&mut p.b.cq, 2);
    assert_eq!(
        [(wc[0].wr_id, wc[0].status), (wc[1].wr_id, wc[1].status)],
        [(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    assert_eq!(read(&p.b.buf, 0x1000, 64), src, "the old piece");
    assert_eq!(read(&p.b.buf, 0x2000, 64), vec![0; 64], "not the new one");
}

#[test]
fn query_mkey_of_a_klm_key_reports_its_entries() {
    let p = pair(1 << 16);
    let k = mkey(&p, 6);
    let mut q = vec![0u8; query_mkey_in::SIZE_BYTES];
    q[..2].copy_from_slice(&Opcode::QueryMkey.to_raw().to_be_bytes());
    query_mkey_in::MKEY_INDEX.set(&mut q, u64::from(k.lkey() >> 8));
    let out =
        p.b.ctx
            .hca()
            .cmd()
            .exec(&q, query_mkey_out::SIZE_BYTES)
            .unwrap();
    let m = &out[query_mkey_out::MEMORY_KEY_MKEY_ENTRY.off / 8..];
    assert_eq!(
        mkc::TRANSLATIONS_OCTWORD_SIZE.get(m),
        8,
        "6 entries, room for 8"
    );
    assert_eq!((mkc::FREE.get(m), mkc::UMR_EN.get(m)), (1, 1));
}

#[test]
fn mr_access_follows_a_posted_access_umr() {
    let mut p = pair(1 << 16);
    let (mut qa, mut qb) = umr_qps(&p);
    let mr = p.b.pd.reg_mr_buffer(&p.b.buf, 0, 4096, ALL).unwrap();
    let ro = access::LOCAL_WRITE | access::REMOTE_READ;
    qb.post_rereg_access(5, &mr, ro, sf::SIGNALED).unwrap();
    assert_eq!(mr.access(), ro);
    assert_eq!(next(&mut p.b), (5, WcStatus::Success, WcOpcode::Umr));
    let w = SendOp::RdmaWrite {
        raddr: mr.addr(),
        rkey: mr.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 8, 1), WcStatus::RemAccessErr);
    // Refused before posting: remote write without local write.
    assert_eq!(
        qb.post_rereg_access(6, &mr, access::REMOTE_WRITE, 0),
        Err(PostError::BadMkeyWr("access flags"))
    );
    assert_eq!(mr.access(), ro);
}

/// Firmware commands function 1 (b) executed so far.
fn b_commands(p: &Pair) -> u64 {
    stats(&p.fabric, 1).commands
}

#[test]
fn the_mkey_cache_registers_and_deregisters_without_commands() {
    use verbs::mkey_cache::MkeyCacheCounts;
    use verbs::umr::{rereg_flags as rf, Rereg, ReregMemory};
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = umr_qps(&p);
    let cache = p.b.ctx.enable_mkey_cache(2).unwrap();
    let bufs = [
        vfio::DmaBuffer::new(1 << 16).unwrap(),
        vfio::DmaBuffer::new(1 << 16).unwrap(),
    ];
    // The first registration makes a key (one CREATE_MKEY), its
    // deregistration keeps it.
    let c0 = b_commands(&p);
    let mr = p.b.pd.reg_mr_buffer(&bufs[0], 0, 4096, ALL).unwrap();
    assert_eq!(
        b_commands(&p) - c0,
        1,
        "CREATE_MKEY of the first cached key"
    );
    let first_key = mr.rkey();
    mr.dereg().unwrap();
    assert_eq!(b_commands(&p) - c0, 1, "dereg by UMR: no command");
    // Ten more registrations and deregistrations: no command at all; the
    // key is the same one, enabled and revoked by UMR each time.
    let c1 = b_commands(&p);
    for i in 0..10 {
        let mut mr = p.b.pd.reg_mr_buffer(&bufs[i % 2], 0, 4096, ALL).unwrap();
        assert_eq!(mr.rkey(), first_key);
        let w = SendOp::RdmaWrite {
            raddr: mr.addr() + 0x100,
            rkey: mr.rkey(),
        };
        assert_eq!(
            a_does(&mut p, &mut qa, w, 0, 64, i as u8),
            WcStatus::Success
        );
        assert_eq!(read(&bufs[i % 2], 0x100, 64), read(&p.a.buf, 0, 64));
        // Re-registration onto the other buffer: in place, no command.
        let m = ReregMemory::Buffer {
            buf: &bufs[(i + 1) % 2],
            offset: 0x1000,
            len: 0x2000,
        };
        let how = mr.rereg(rf::CHANGE_TRANSLATION, None, Some(m), 0).unwrap();
        assert_eq!((how, mr.rkey()), (Rereg::InPlace, first_key));
        mr.dereg().unwrap();
    }
    assert_eq!(
        b_commands(&p) - c1,
        0,
        "no command for 10 reg + rereg + dereg"
    );
    assert_eq!(
        cache.counts(),
        MkeyCacheCounts {
            created: 1,
            reused: 10,
            returned: 11,
            destroyed: 0,
        }
    );
    // A revoked key grants nothing: a WRITE through the last rkey fails.
    let w = SendOp::RdmaWrite {
        raddr: bufs[1].host_addr() + 0x1000,
        rkey: first_key,
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 8, 99), WcStatus::RemAccessErr);
    // Three regions alive at once: two more keys made; back, two kept
    // (keep = 2), the third destroyed.
    let mrs: Vec<_> = (0..3)
        .map(|_| p.b.pd.reg_mr_buffer(&bufs[0], 0, 4096, ALL).unwrap())
        .collect();
    drop(mrs);
    let c = cache.counts();
    assert_eq!(
        (c.created, c.reused, c.destroyed, cache.kept()),
        (3, 11, 1, 2)
    );
    // Without the cache: CREATE_MKEY and DESTROY_MKEY per registration.
    drop(cache);
    let c2 = b_commands(&p);
    for _ in 0..3 {
        let mr = p.b.pd.reg_mr_buffer(&bufs[0], 0, 4096, ALL).unwrap();
        mr.dereg().unwrap();
    }
    assert_eq!(b_commands(&p) - c2, 6, "two commands per registration");
}

#[test]
fn a_1_gib_region_through_the_mkey_cache_takes_one_umr_and_no_command() {
    let mut p = pair(1 << 16);
    let (mut qa, _qb) = umr_qps(&p);
    let cache = p.b.ctx.enable_mkey_cache(1).unwrap();
    cache.prefill(verbs::mkey_cache::order_of(1), 1).unwrap();
    // A memfd of 1 GiB: only the pages written below are ever touched.
    let big = vfio::DmaBuffer::new(1 << 30).unwrap();
    let c0 = b_commands(&p);
    let mr = p.b.pd.reg_mr_buffer(&big, 0, 1 << 30, ALL).unwrap();
    assert_eq!(b_commands(&p) - c0, 0, "the prefilled key, by UMR");
    // One 1 GiB MTT page, two entries where the buffer straddles two.
    assert!(mr.mtt_entries() <= 2 && mr.log_page_size() == 30);
    assert_eq!(cache.counts().reused, 1);
    let w = SendOp::RdmaWrite {
        raddr: mr.addr() + (1 << 30) - 64,
        rkey: mr.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa, w, 0, 64, 7), WcStatus::Success);
    assert_eq!(read(&big, (1 << 30) - 64, 64), read(&p.a.buf, 0, 64));
    // One byte past it: remote access error.
    let (mut qa2, _qb2) = umr_qps(&p);
    let w = SendOp::RdmaWrite {
        raddr: mr.addr() + (1 << 30) - 4,
        rkey: mr.rkey(),
    };
    assert_eq!(a_does(&mut p, &mut qa2, w, 0, 8, 8), WcStatus::RemAccessErr);
    let c1 = b_commands(&p);
    mr.dereg().unwrap();
    assert_eq!(b_commands(&p) - c1, 0, "dereg by UMR");
    assert_eq!(cache.counts().returned, 1);
}

/// `mlx5dv_destroy_mkey`, then the PD: the key's destroy lets go of the
/// PD (it had forgotten its reference, and the PD stayed busy for good);
/// a key dropped without `destroy` lets go too.
#[test]
fn a_destroyed_or_dropped_mkey_leaves_its_pd_free() {
    let p = pair(1 << 12);
    for destroy in [true, false] {
        let pd = p.b.ctx.alloc_pd().unwrap();
        let mut attr = MkeyInitAttr {
            create_flags: mf::INDIRECT,
            max_entries: 4,
        };
        let k = pd.create_mkey(&mut attr).unwrap();
        if destroy {
            k.destroy().unwrap();
        } else {
            drop(k);
        }
        pd.dealloc()
            .unwrap_or_else(|e| panic!("PD after the key (destroy {destroy}): {e}"));
    }
}
