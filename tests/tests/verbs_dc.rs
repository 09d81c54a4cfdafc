//! Dynamically Connected transport end to end (issue 20): DCTs and DCIs
//! (with and without streams) on cabled ConnectX-6 model functions.

mod verbs_common;

use std::collections::BTreeMap;

use mlx5_emu::{Fabric, Profile};
use verbs::ah::Ah;
use verbs::cq::{Cq, Wc, WcOpcode, WcStatus};
use verbs::dc::{DcAv, Dci, DciInitAttr, DciPath, DciStreams, Dct, DctInitAttr};
use verbs::qp::{send_flags as sf, AhAttr, Payload, QpCap, QpState, RecvWr, SendOp, SendWr};
use verbs::srq::Srq;
use verbs_common::*;

const KEY: u64 = 0x00dc_0000_cafe_f00d;
const MSG: usize = 256;

/// `n` cabled ConnectX-6 functions (they have `dct` and DCI streams).
fn dc_fabric(n: usize) -> (Fabric, Vec<Side>) {
    let fabric = Fabric::cabled(n, Profile::ConnectX6);
    let sides = (0..n)
        .map(|i| side(open(function(&fabric, i)), 1 << 20, ALL))
        .collect();
    (fabric, sides)
}

fn path(rnr_retry: u8) -> DciPath {
    DciPath {
        path_mtu: 3,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry,
        sq_psn: 0x10,
    }
}

fn dci(s: &Side, streams: Option<DciStreams>, rnr_retry: u8) -> Dci {
    let mut d =
        s.pd.create_dci(&DciInitAttr {
            send_cq: &s.cq,
            cap: QpCap {
                max_send_wr: 128,
                max_send_sge: 2,
                max_inline_data: 64,
                ..QpCap::default()
            },
            sq_sig_all: true,
            streams,
            create_flags: 0,
        })
        .unwrap();
    d.to_rts(&path(rnr_retry)).unwrap();
    assert_eq!(d.state(), QpState::Rts);
    d
}

/// A DCT on `s` over a new SRQ with `recvs` receives of [`MSG`] bytes
/// (each its own slot of the side's buffer, wr_id = slot).
fn dct(s: &Side, key: u64, recvs: u32) -> (Dct, Srq) {
    dct_flags(s, key, recvs, 0)
}

/// [`dct`] created with mlx5dv `create_flags`.
fn dct_flags(s: &Side, key: u64, recvs: u32, create_flags: u32) -> (Dct, Srq) {
    let srq = s.pd.create_srq(512, 1).unwrap();
    post_recvs(s, &srq, 0, recvs);
    let d =
        s.pd.create_dct(&dct_attr(&s.cq, &srq, key, create_flags))
            .unwrap();
    (d, srq)
}

/// A DCT's attributes: on `cq` and `srq`, every remote access, MTU 1024,
/// GID 0.
fn dct_attr<'a>(cq: &'a Cq, srq: &'a Srq, key: u64, create_flags: u32) -> DctInitAttr<'a> {
    DctInitAttr {
        cq,
        srq,
        access_key: key,
        access_flags: ALL,
        path_mtu: 3,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            sgid_index: 0,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        },
        pkey_index: 0,
        create_flags,
    }
}

fn post_recvs(s: &Side, srq: &Srq, from: u32, n: u32) {
    for i in from..from + n {
        let sge = s.mr.sge(u64::from(i) * MSG as u64, MSG as u32).unwrap();
        srq.post_recv(&[RecvWr {
            wr_id: u64::from(i),
            sg_list: &[sge],
        }])
        .unwrap();
    }
}

/// An inline SEND tagged `(sender, seq)`, signaled, wr_id `id`.
fn tagged(id: u64, tag: &[u8; 8]) -> SendWr<'_> {
    SendWr {
        wr_id: id,
        op: SendOp::Send,
        payload: Payload::Inline(tag),
        flags: sf::SIGNALED,
        ud: None,
    }
}

fn tag(sender: u32, seq: u32) -> [u8; 8] {
    let mut t = [0u8; 8];
    t[..4].copy_from_slice(&sender.to_be_bytes());
    t[4..].copy_from_slice(&seq.to_be_bytes());
    t
}

/// The tag a receive completion's slot holds.
fn tag_in(s: &Side, wc: &Wc) -> (u32, u32) {
    let b = read(&s.buf, wc.wr_id as usize * MSG, 8);
    (
        u32::from_be_bytes(b[..4].try_into().unwrap()),
        u32::from_be_bytes(b[4..].try_into().unwrap()),
    )
}

fn statuses(w: &[Wc]) -> Vec<(u64, WcStatus)> {
    w.iter().map(|w| (w.wr_id, w.status)).collect()
}

#[test]
fn many_dcis_to_one_dct() {
    let (fabric, mut s) = dc_fabric(3);
    const PER: u32 = 25;
    let (t, _srq) = dct(&s[0], KEY, 4 * PER);
    let mut dcis = Vec::new();
    for i in [1usize, 2] {
        for _ in 0..2 {
            dcis.push((i, dci(&s[i], None, 7)));
        }
    }
    let ahs = [ah(&s[1], &s[0]), ah(&s[2], &s[0])];
    for seq in 0..PER {
        for (i, d) in &mut dcis {
            // DCIs of different functions may have the same number.
            let tg = tag((*i as u32) << 24 | d.qp_num(), seq);
            let av = DcAv::new(&ahs[*i - 1], t.dctn(), KEY, 0);
            d.post_send(&[(tagged(u64::from(seq), &tg), av)]).unwrap();
        }
    }
    for i in [1usize, 2] {
        let w = poll_n(&mut s[i].cq, 2 * PER as usize);
        assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    }
    let rw = poll_n(&mut s[0].cq, 4 * PER as usize);
    let mut per_dci: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for w in &rw {
        assert_eq!((w.status, w.opcode), (WcStatus::Success, WcOpcode::Recv));
        assert_eq!(w.qp_num, t.dctn(), "a DCT receive names the DCT");
        let (sender, seq) = tag_in(&s[0], w);
        assert_eq!(sender & 0xff_ffff, w.src_qp, "src_qp is the sending DCI");
        per_dci.entry(sender).or_default().push(seq);
    }
    assert_eq!(per_dci.len(), 4, "four DCIs reached the DCT");
    for (d, seqs) in &per_dci {
        assert_eq!(*seqs, (0..PER).collect::<Vec<_>>(), "DCI {d:#x} in order");
    }
    settle(&fabric);
    let st = stats(&fabric, 0);
    assert_eq!(
        (st.dcts, st.dc_connections),
        (1, 0),
        "idle DCIs disconnected"
    );
    println!(
        "4 DCIs x {PER} SENDs to one DCT: {} received, DCT state held {} bytes",
        rw.len(),
        st.dc_bytes
    );
}

/// Scatter to CQE on a DC target (issue 22), as mlx5_ib's `create_dct`
/// asks for it: a DCT whose CQ has 128-byte CQEs gets small SENDs in the
/// CQE (handed out in place, or copied into the SRQ's WQE by the copying
/// poll); one created with `DISABLE_SCATTER_TO_CQE`, or on a CQ of 64-byte
/// CQEs, gets them in the SRQ's buffer.
#[test]
fn dct_scatters_small_sends_to_128_byte_cqes() {
    use verbs::scatter_cqe::{dv_flags, InlineRecv};
    let (_fabric, mut s) = dc_fabric(2);
    let ah0 = ah(&s[1], &s[0]);
    let mut d = dci(&s[1], None, 7);
    for (cqe, flags, scattered) in [
        (128, 0, true),
        (128, dv_flags::DISABLE_SCATTER_TO_CQE, false),
        (64, 0, false),
    ] {
        s[0].cq = s[0].ctx.create_cq_sized(256, None, None, cqe).unwrap();
        s[0].buf.write(0, &[0xee; 2 * MSG]).unwrap();
        let (t, _srq) = dct_flags(&s[0], KEY, 2, flags);
        let tags = [tag(cqe as u32, 1), tag(flags, 2)];
        for (i, tg) in tags.iter().enumerate() {
            let av = DcAv::new(&ah0, t.dctn(), KEY, 0);
            d.post_send(&[(tagged(i as u64, tg), av)]).unwrap();
        }
        assert!(poll_n(&mut s[1].cq, 2)
            .iter()
            .all(|w| w.status == WcStatus::Success));
        // The first in place: from the CQE when scattered.
        let mut wc = [Wc::default()];
        let mut inl = [InlineRecv::default()];
        tests::wait::until("the DCT's first receive", || {
            s[0].cq.poll_inline(&mut wc, &mut inl).unwrap() == 1
        });
        let what = format!("{cqe}-byte CQEs, flags {flags:#x}");
        assert_eq!(
            (wc[0].wr_id, wc[0].status),
            (0, WcStatus::Success),
            "{what}"
        );
        assert_eq!(wc[0].qp_num, t.dctn(), "{what}");
        if scattered {
            assert_eq!(&inl[0].data[..usize::from(inl[0].len)], &tags[0], "{what}");
            assert_eq!(
                read(&s[0].buf, 0, 8),
                vec![0xee; 8],
                "{what}: buffer untouched"
            );
        } else {
            assert_eq!(inl[0].len, 0, "{what}: nothing in the CQE");
            assert_eq!(tag_in(&s[0], &wc[0]), (cqe as u32, 1), "{what}");
        }
        // The second through the copying poll: in the SRQ's slot either way.
        let w = poll_n(&mut s[0].cq, 1)[0];
        assert_eq!(
            (w.wr_id, w.status, w.byte_len),
            (1, WcStatus::Success, 8),
            "{what}"
        );
        assert_eq!(tag_in(&s[0], &w), (flags, 2), "{what}");
        assert_eq!(
            read(&s[0].buf, MSG + 8, 1),
            vec![0xee],
            "{what}: nothing past it"
        );
    }
}

#[test]
fn one_dci_to_many_dcts_in_turn_and_interleaved() {
    let (_fabric, mut s) = dc_fabric(4);
    let targets: Vec<(Dct, Srq)> = (1..4).map(|i| dct(&s[i], KEY + i as u64, 64)).collect();
    let ahs: Vec<Ah> = (1..4).map(|i| ah(&s[0], &s[i])).collect();
    let mut d = dci(&s[0], None, 7);
    let av = |k: usize| DcAv::new(&ahs[k], targets[k].0.dctn(), KEY + k as u64 + 1, 0);
    // In turn: 5 SENDs to each target, then RDMA WRITEs to each.
    let mut id = 0u64;
    for k in 0..3 {
        for seq in 0..5 {
            let tg = tag(k as u32, seq);
            d.post_send(&[(tagged(id, &tg), av(k))]).unwrap();
            id += 1;
        }
    }
    fill(&s[0].buf, 0x8_0000, 4096, 9);
    let src = s[0].mr.sge(0x8_0000, 4096).unwrap();
    for k in 0..3 {
        let mut b = d.wr_start();
        b.wr_id(100 + k as u64, sf::SIGNALED)
            .rdma_write(s[k + 1].mr.rkey(), s[k + 1].mr.addr() + 0x4_0000)
            .set_dc_addr(&ahs[k], targets[k].0.dctn(), KEY + k as u64 + 1)
            .set_sge(src);
        b.complete().unwrap();
    }
    // Interleaved: round robin, 3 x 10 SENDs through the wr_* API.
    for seq in 5..15 {
        let mut b = d.wr_start();
        for k in 0..3 {
            let tg = tag(k as u32, seq);
            b.wr_id(id, sf::SIGNALED)
                .send()
                .set_dc_addr(&ahs[k], targets[k].0.dctn(), KEY + k as u64 + 1)
                .set_inline_data(&tg);
            id += 1;
        }
        b.complete().unwrap();
    }
    let w = poll_n(&mut s[0].cq, id as usize + 3);
    assert!(w.iter().all(|w| w.status == WcStatus::Success), "{w:?}");
    for k in 0..3 {
        let rw = poll_n(&mut s[k + 1].cq, 15);
        let seqs: Vec<u32> = rw
            .iter()
            .map(|w| {
                assert_eq!(w.status, WcStatus::Success);
                let (t, seq) = tag_in(&s[k + 1], w);
                assert_eq!(t, k as u32, "target {k} got only its messages");
                seq
            })
            .collect();
        assert_eq!(seqs, (0..15).collect::<Vec<_>>(), "target {k} in order");
        assert_eq!(
            read(&s[k + 1].buf, 0x4_0000, 4096),
            read(&s[0].buf, 0x8_0000, 4096),
            "WRITE to target {k}"
        );
    }
}

/// Streams run together; stream 1's target refuses its key: stream 1's
/// WQEs fail (the first with the NAK's error, the rest flushed), the other
/// streams complete, the DCI stays RTS. After a reset stream 1 works
/// again; a second errored stream (the limit, 2^1) moves the DCI to ERR.
#[test]
fn streams_with_one_target_failing() {
    let (_fabric, mut s) = dc_fabric(3);
    let (good, _g) = dct(&s[1], KEY, 256);
    let (bad, _b) = dct(&s[2], KEY, 256);
    let (ah_good, ah_bad) = (ah(&s[0], &s[1]), ah(&s[0], &s[2]));
    let streams = DciStreams {
        log_num_concurent: 2,
        log_num_errored: 1,
    };
    let mut d = dci(&s[0], Some(streams), 7);
    // 4 streams x 8 WQEs, interleaved; stream 1 uses a wrong key.
    let mut wrs = Vec::new();
    for seq in 0..8u64 {
        for st in 0..4u16 {
            let av = if st == 1 {
                DcAv::new(&ah_bad, bad.dctn(), KEY ^ 1, st)
            } else {
                DcAv::new(&ah_good, good.dctn(), KEY, st)
            };
            wrs.push((u64::from(st) << 32 | seq, av));
        }
    }
    let tg = [7u8; 8];
    let post: Vec<(SendWr<'_>, DcAv)> = wrs
        .iter()
        .map(|(id, av)| (tagged(*id, &tg), av.clone()))
        .collect();
    d.post_send(&post).unwrap();
    let w = poll_n(&mut s[0].cq, 32);
    let mut per: BTreeMap<u16, Vec<WcStatus>> = BTreeMap::new();
    for c in &w {
        per.entry((c.wr_id >> 32) as u16)
            .or_default()
            .push(c.status);
    }
    for st in [0u16, 2, 3] {
        assert_eq!(
            per[&st],
            vec![WcStatus::Success; 8],
            "stream {st} completes"
        );
    }
    let mut want = vec![WcStatus::WrFlushErr; 8];
    want[0] = WcStatus::RemAccessErr;
    assert_eq!(per[&1], want, "stream 1: the NAK, then flushed");
    let ok = w.iter().filter(|c| c.status == WcStatus::Success).count();
    println!("streams: {ok} of 32 completed, stream 1's 8 in error");
    assert_eq!(poll_n(&mut s[1].cq, 24).len(), 24);
    assert_eq!(
        d.query_state().unwrap(),
        QpState::Rts,
        "only the stream failed"
    );
    assert_eq!(bad.query().unwrap().key_violations, 1);
    // Reset stream 1: it works again with the right key.
    d.stream_id_reset(1).unwrap();
    d.post_send(&[(tagged(99, &tg), DcAv::new(&ah_bad, bad.dctn(), KEY, 1))])
        .unwrap();
    assert_eq!(
        statuses(&poll_n(&mut s[0].cq, 1)),
        vec![(99, WcStatus::Success)]
    );
    // A stream not in error is not reset (BAD_PARAMETER), as on the card.
    assert!(d.stream_id_reset(0).is_err(), "stream 0 is not in error");
    assert!(d.stream_id_reset(1).is_err(), "stream 1 was reset already");
    // Two streams in error (2^1): the DCI goes to ERR.
    d.post_send(&[
        (tagged(200, &tg), DcAv::new(&ah_bad, bad.dctn(), 0, 2)),
        (tagged(201, &tg), DcAv::new(&ah_bad, bad.dctn(), 0, 3)),
    ])
    .unwrap();
    let w = poll_n(&mut s[0].cq, 2);
    assert_eq!(
        statuses(&w),
        vec![(200, WcStatus::RemAccessErr), (201, WcStatus::RemAccessErr)]
    );
    assert_eq!(d.query_state().unwrap(), QpState::Err);
    assert!(d.stream_id_reset(2).is_err(), "no reset out of RTS");
}

#[test]
fn key_violation_naks_counts_and_errors_the_dci() {
    let (_fabric, mut s) = dc_fabric(2);
    let (t, _srq) = dct(&s[1], KEY, 8);
    t.arm_key_violation().unwrap();
    let a = ah(&s[0], &s[1]);
    let mut d = dci(&s[0], None, 7);
    let tg = [1u8; 8];
    d.post_send(&[(tagged(1, &tg), DcAv::new(&a, t.dctn(), KEY + 1, 0))])
        .unwrap();
    assert_eq!(
        statuses(&poll_n(&mut s[0].cq, 1)),
        vec![(1, WcStatus::RemAccessErr)]
    );
    assert_eq!(d.query_state().unwrap(), QpState::Err);
    let q = t.query().unwrap();
    assert_eq!((q.key_violations, q.access_key), (1, KEY));
    assert!(nothing_more(&_fabric, &mut s[1].cq), "nothing was received");
    assert_eq!(stats(&_fabric, 1).dc_connections, 0);
}

#[test]
fn dct_without_srq_receive_is_rnr() {
    let (fabric, mut s) = dc_fabric(2);
    let (t, srq) = dct(&s[1], KEY, 0);
    let a = ah(&s[0], &s[1]);
    let tg = [2u8; 8];
    // No retries: the first RNR NAK fails the WQE.
    let mut d = dci(&s[0], None, 0);
    d.post_send(&[(tagged(1, &tg), DcAv::new(&a, t.dctn(), KEY, 0))])
        .unwrap();
    assert_eq!(
        statuses(&poll_n(&mut s[0].cq, 1)),
        vec![(1, WcStatus::RnrRetryExcErr)]
    );
    assert!(stats(&fabric, 1).rnr_naks >= 1);
    settle(&fabric);
    assert_eq!(stats(&fabric, 1).dc_connections, 0, "the failed DCI left");
    // With a receive posted, a new DCI gets through.
    post_recvs(&s[1], &srq, 0, 1);
    let mut d2 = dci(&s[0], None, 0);
    d2.post_send(&[(tagged(2, &tg), DcAv::new(&a, t.dctn(), KEY, 0))])
        .unwrap();
    assert_eq!(
        statuses(&poll_n(&mut s[0].cq, 1)),
        vec![(2, WcStatus::Success)]
    );
    assert_eq!(poll_n(&mut s[1].cq, 1)[0].status, WcStatus::Success);
}

/// A DCI on `s` whose WQEs to a DCT that stopped answering fail soon (a
/// short ACK timeout, two retries).
fn impatient_dci(s: &Side) -> Dci {
    let mut d =
        s.pd.create_dci(&DciInitAttr {
            send_cq: &s.cq,
            cap: QpCap {
                max_send_wr: 128,
                max_send_sge: 1,
                max_inline_data: 64,
                ..QpCap::default()
            },
            sq_sig_all: true,
            streams: None,
            create_flags: 0,
        })
        .unwrap();
    d.to_rts(&DciPath {
        timeout: 6,
        retry_cnt: 2,
        ..path(7)
    })
    .unwrap();
    d
}

/// DRAIN_DCT while a DCI sends: the open connection goes on (every WQE
/// completes and is received), no new one opens, and the DCT is drained
/// once the DCI disconnects. DESTROY_DCT while one sends: every WQE
/// completes once, delivered or failed (retry exceeded, then flushed).
#[test]
fn drain_and_destroy_under_traffic() {
    let (fabric, mut s) = dc_fabric(2);
    let (t, _srq) = dct(&s[1], KEY, 400);
    let a = ah(&s[0], &s[1]);
    let tg = [3u8; 8];
    let wrs: Vec<(SendWr<'_>, DcAv)> = (0..100)
        .map(|i| (tagged(i, &tg), DcAv::new(&a, t.dctn(), KEY, 0)))
        .collect();
    let mut d = impatient_dci(&s[0]);
    d.post_send(&wrs).unwrap();
    t.drain().unwrap();
    let w = poll_n(&mut s[0].cq, 100);
    let ok = w.iter().filter(|c| c.status == WcStatus::Success).count();
    let rw = poll_n(&mut s[1].cq, ok);
    assert!(rw.iter().all(|c| c.status == WcStatus::Success));
    println!("drain under traffic: {ok} of 100 delivered before the DCI disconnected");
    settle(&fabric);
    assert!(
        nothing_more(&fabric, &mut s[1].cq),
        "received what completed"
    );
    let q = t.query().unwrap().state;
    assert_eq!(
        q,
        mlx5_hw::qp::DCTC_STATE_DRAINED,
        "drained once the DCI left"
    );
    // A new connection to the drained DCT is refused: the WQE fails.
    let mut d2 = impatient_dci(&s[0]);
    d2.post_send(&[(tagged(500, &tg), DcAv::new(&a, t.dctn(), KEY, 0))])
        .unwrap();
    assert_eq!(
        statuses(&poll_n(&mut s[0].cq, 1)),
        vec![(500, WcStatus::RetryExcErr)]
    );
    t.destroy().unwrap();

    // DESTROY_DCT under traffic.
    let (t2, _srq2) = dct(&s[1], KEY, 400);
    let wrs: Vec<(SendWr<'_>, DcAv)> = (0..100)
        .map(|i| (tagged(1000 + i, &tg), DcAv::new(&a, t2.dctn(), KEY, 0)))
        .collect();
    let mut d3 = impatient_dci(&s[0]);
    let cqes_before = stats(&fabric, 1).cqes;
    d3.post_send(&wrs).unwrap();
    t2.destroy().unwrap();
    let w = poll_n(&mut s[0].cq, 100);
    let ok = w.iter().filter(|c| c.status == WcStatus::Success).count();
    let failed: Vec<WcStatus> = w
        .iter()
        .filter(|c| c.status != WcStatus::Success)
        .map(|c| c.status)
        .collect();
    assert_eq!(ok + failed.len(), 100, "every WR completed once");
    for (i, st) in failed.iter().enumerate() {
        let want = if i == 0 {
            WcStatus::RetryExcErr
        } else {
            WcStatus::WrFlushErr
        };
        assert_eq!(*st, want, "failure {i}");
    }
    // Completed means received; a failed one may have landed too (its ACK
    // went with the DCT), as on any RC connection. Counted as the receive
    // CQEs the device wrote: the driver cleans a destroyed DCT's CQEs out
    // of its CQ (libmlx5's mlx5_cq_clean), so a poll after the destroy
    // finds none of those that landed before it.
    settle(&fabric);
    let got = (stats(&fabric, 1).cqes - cqes_before) as usize;
    let mut wc = [Wc::default(); 16];
    while s[1].cq.poll(&mut wc).unwrap() > 0 {}
    assert!(got >= ok, "{got} received, {ok} completed");
    let st = stats(&fabric, 1);
    assert_eq!((st.dcts, st.dc_connections), (0, 0));
    println!(
        "destroy under traffic: {ok} of 100 delivered, {} failed, {got} received",
        failed.len()
    );
}

/// A DCT that received, its SRQ, its MR and its PD destroyed while its CQ
/// is not polled again (perftest's `ib_send_bw -c DC` server leaves its
/// receive CQ so): what the CQ keeps for its next poll (the last QP it
/// completed for, the DCT's cleaning) holds neither the SRQ nor the PD,
/// so the PD goes (it was busy); the CQ's next poll drops the DCT's
/// unpolled CQE.
#[test]
fn a_dct_its_srq_and_pd_go_while_its_cq_is_not_polled_again() {
    let (_fabric, mut s) = dc_fabric(2);
    let ah0 = ah(&s[1], &s[0]);
    let mut d = dci(&s[1], None, 7);
    let pd = s[0].ctx.alloc_pd().unwrap();
    let mr = pd.reg_mr_buffer(&s[0].buf, 0, 4 * MSG, ALL).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    for i in 0..2u64 {
        let sge = mr.sge(i * MSG as u64, MSG as u32).unwrap();
        srq.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &[sge],
        }])
        .unwrap();
    }
    let t = pd.create_dct(&dct_attr(&s[0].cq, &srq, KEY, 0)).unwrap();
    for seq in 0..2 {
        let av = DcAv::new(&ah0, t.dctn(), KEY, 0);
        d.post_send(&[(tagged(u64::from(seq), &tag(1, seq)), av)])
            .unwrap();
        let w = poll_n(&mut s[1].cq, 1);
        assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
        if seq == 0 {
            // Polled: the CQ's cache holds the DCT's completion tracking.
            let r = poll_n(&mut s[0].cq, 1);
            assert_eq!((r[0].status, r[0].qp_num), (WcStatus::Success, t.dctn()));
        }
    }
    // The second receive's CQE stays in the ring: the DCT's destroy files
    // its cleaning for the CQ's next poll.
    t.destroy().unwrap();
    drop(srq);
    mr.dereg().unwrap();
    pd.dealloc()
        .expect("the PD goes once its objects went, whatever its CQs hold");
    let mut wc = [Wc::default(); 4];
    assert_eq!(s[0].cq.poll(&mut wc).unwrap(), 0, "the DCT's CQE cleaned");
}
