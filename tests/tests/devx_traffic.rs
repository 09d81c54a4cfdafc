//! DevX end to end: an RC QP and its CQ created by raw PRM commands under
//! a user context, their rings and doorbell records in a UMEM, their data
//! behind a memory key over another UMEM, moved to RTS by raw
//! RST2INIT / INIT2RTR / RTR2RTS commands, exchanging SEND and RDMA WRITE
//! traffic with a verbs QP on the cabled peer function. The DevX queues are
//! posted to and polled through the verbs data path
//! (`DevxQp::from_devx`, `DevxCq::from_devx`).
#![allow(unsafe_code)] // Sge::new_unchecked over the DevX memory key.

mod verbs_common;

use std::sync::Arc;

use mlx5_emu::{Fabric, Profile};
use mlx5_hw::bits::BitField;
use mlx5_hw::ifc::{
    ads, alloc_pd_in, alloc_pd_out, cqc, create_cq_in, create_cq_out, create_mkey_in,
    create_mkey_out, create_qp_in, create_qp_out, general_obj_in_cmd_hdr, init2rtr_qp_in, mkc, qpc,
    rst2init_qp_in, rst2init_qp_out, rtr2rts_qp_in,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::{NON_ZERO_RQ, QPC_PM_STATE_MIGRATED, QPC_ST_RC};
use tests::wait::until;
use verbs::cq::{Wc, WcOpcode, WcStatus};
use verbs::device::{mac_of_link_local_gid, Context};
use verbs::devx::{DevxCq, DevxCqRings, DevxCtx, DevxObj, DevxQp, DevxQpRings};
use verbs::mr::Sge;
use verbs::qp::{send_flags as sf, Payload, QpType, RecvWr, SendOp, SendWr};
use verbs_common::{connect, create_qp, fill, function, open, poll_n, read, side, Side, ALL};
use vfio::DmaBuffer;

/// The queue UMEM: CQEs at 0 (64 of them), the QP's work queues at
/// `WQ` (16 receive WQEs of 64 bytes, then 64 send blocks), the doorbell
/// records at `CQ_DBR` and `QP_DBR`.
const QBUF: usize = 0x4000;
const LOG_CQ: u8 = 6;
const WQ: usize = 0x1000;
const LOG_RQ: u8 = 4;
/// 64-byte receive WQEs (4 data segments), in 16-byte units.
const LOG_RQ_STRIDE: u8 = 2;
const LOG_SQ: u8 = 6;
const CQ_DBR: usize = 0x3000;
const QP_DBR: usize = 0x3040;
/// The data UMEM, and the memory key's variant byte.
const DBUF: usize = 0x4000;
const KEY_7_0: u64 = 0x5a;

fn cmd(op: Opcode, len: usize) -> Vec<u8> {
    let mut c = vec![0u8; len];
    general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(op.to_raw()));
    c
}

/// Sets field `f` of the sub-layout at `at` of `c`.
fn put(c: &mut [u8], at: BitField, f: BitField, v: u64) {
    f.set(&mut c[at.off / 8..], v);
}

/// The DevX side's raw objects (kept for their lifetime).
struct Devx {
    dx: DevxCtx,
    qbuf: Arc<DmaBuffer>,
    dbuf: Arc<DmaBuffer>,
    lkey: u32,
    cq: DevxCq,
    qp: DevxQp,
    objs: Vec<DevxObj>,
    umems: Vec<verbs::devx::DevxUmem>,
    _uar: verbs::devx::DevxUar,
}

/// PD, memory key over the data UMEM, CQ and RC QP in the queue UMEM, all
/// by raw commands under a fresh user context of `ctx`.
fn devx_side(ctx: &Context) -> Devx {
    let dx = DevxCtx::open(ctx, 0).unwrap();
    let uar = dx.alloc_uar().unwrap();
    let qbuf = DmaBuffer::new(QBUF).unwrap();
    let dbuf = DmaBuffer::new(DBUF).unwrap();
    let qumem = dx.umem_reg_buffer(&qbuf, 0, QBUF, true).unwrap();
    let dumem = dx.umem_reg_buffer(&dbuf, 0, DBUF, true).unwrap();
    let pd = dx
        .obj_create(
            &cmd(Opcode::AllocPd, alloc_pd_in::SIZE_BYTES),
            alloc_pd_out::SIZE_BYTES,
        )
        .unwrap();
    let pdn = alloc_pd_out::PD.get(pd.create_out());

    // MTT key whose translation is the data UMEM (mkey_umem_valid).
    let mut m = cmd(Opcode::CreateMkey, create_mkey_in::SIZE_BYTES);
    create_mkey_in::MKEY_UMEM_VALID.set(&mut m, 1);
    create_mkey_in::MKEY_UMEM_ID.set(&mut m, u64::from(dumem.umem_id()));
    let k = create_mkey_in::MEMORY_KEY_MKEY_ENTRY;
    for f in [mkc::LR, mkc::LW, mkc::RR, mkc::RW] {
        put(&mut m, k, f, 1);
    }
    put(&mut m, k, mkc::ACCESS_MODE_1_0, 1); // MTT
    put(&mut m, k, mkc::QPN, 0xff_ffff);
    put(&mut m, k, mkc::MKEY_7_0, KEY_7_0);
    put(&mut m, k, mkc::PD, pdn);
    put(&mut m, k, mkc::LEN, DBUF as u64);
    put(&mut m, k, mkc::LOG_PAGE_SIZE, 12);
    let mkey = dx.obj_create(&m, create_mkey_out::SIZE_BYTES).unwrap();
    let lkey = (create_mkey_out::MKEY_INDEX.get(mkey.create_out()) << 8 | KEY_7_0) as u32;

    // CQ: CQEs at 0 of the queue UMEM, its record at CQ_DBR.
    let mut c = cmd(Opcode::CreateCq, create_cq_in::SIZE_BYTES);
    create_cq_in::CQ_UMEM_VALID.set(&mut c, 1);
    create_cq_in::CQ_UMEM_ID.set(&mut c, u64::from(qumem.umem_id()));
    let x = create_cq_in::CQ_CONTEXT;
    put(&mut c, x, cqc::LOG_CQ_SIZE, LOG_CQ.into());
    put(&mut c, x, cqc::UAR_PAGE, uar.index().into());
    put(
        &mut c,
        x,
        cqc::C_EQN_OR_APU_ELEMENT,
        ctx.hca().comp_eqns()[0].into(),
    );
    put(&mut c, x, cqc::DBR_UMEM_VALID, 1);
    put(&mut c, x, cqc::DBR_UMEM_ID, qumem.umem_id().into());
    put(&mut c, x, cqc::DBR_ADDR, CQ_DBR as u64);
    let cq_obj = dx.obj_create(&c, create_cq_out::SIZE_BYTES).unwrap();
    let cqn = create_cq_out::CQN.get(cq_obj.create_out());
    let mut cq = DevxCq::from_devx(
        &cq_obj,
        &DevxCqRings {
            buf: qbuf.clone(),
            offset: 0,
            log_size: LOG_CQ,
            dbr_buf: qbuf.clone(),
            dbr_offset: CQ_DBR,
        },
        &uar,
    )
    .unwrap();

    // RC QP: its work queues at WQ, its record at QP_DBR.
    let mut q = cmd(Opcode::CreateQp, create_qp_in::SIZE_BYTES);
    create_qp_in::WQ_UMEM_VALID.set(&mut q, 1);
    create_qp_in::WQ_UMEM_ID.set(&mut q, u64::from(qumem.umem_id()));
    create_qp_in::WQ_UMEM_OFFSET.set(&mut q, WQ as u64);
    let x = create_qp_in::QPC;
    put(&mut q, x, qpc::ST, QPC_ST_RC.into());
    put(&mut q, x, qpc::PM_STATE, QPC_PM_STATE_MIGRATED.into());
    put(&mut q, x, qpc::PD, pdn);
    put(&mut q, x, qpc::UAR_PAGE, uar.index().into());
    put(&mut q, x, qpc::RQ_TYPE, NON_ZERO_RQ.into());
    put(&mut q, x, qpc::LOG_RQ_SIZE, LOG_RQ.into());
    put(&mut q, x, qpc::LOG_RQ_STRIDE, LOG_RQ_STRIDE.into());
    put(&mut q, x, qpc::LOG_SQ_SIZE, LOG_SQ.into());
    put(&mut q, x, qpc::CQN_SND, cqn);
    put(&mut q, x, qpc::CQN_RCV, cqn);
    put(&mut q, x, qpc::DBR_UMEM_VALID, 1);
    put(&mut q, x, qpc::DBR_UMEM_ID, qumem.umem_id().into());
    put(&mut q, x, qpc::DBR_ADDR, QP_DBR as u64);
    let qp_obj = dx.obj_create(&q, create_qp_out::SIZE_BYTES).unwrap();
    let qp = DevxQp::from_devx(
        &qp_obj,
        &DevxQpRings {
            buf: qbuf.clone(),
            offset: WQ,
            log_rq_size: Some(LOG_RQ),
            log_rq_stride: LOG_RQ_STRIDE,
            log_sq_size: LOG_SQ,
            dbr_buf: qbuf.clone(),
            dbr_offset: QP_DBR,
            max_inline: 64,
        },
        &uar,
    )
    .unwrap();
    cq.attach(&qp);
    Devx {
        dx,
        qbuf,
        dbuf,
        lkey,
        cq,
        qp,
        // Destroyed in this order: QP, CQ, key, PD.
        objs: vec![qp_obj, cq_obj, mkey, pd],
        umems: vec![qumem, dumem],
        _uar: uar,
    }
}

/// RST2INIT, INIT2RTR (towards `rqpn` on `remote`), RTR2RTS, each a raw
/// command on the QP object.
fn connect_raw(d: &Devx, local: &Context, remote: &Context, rqpn: u32) {
    let qp = &d.objs[0];
    let qpn = u64::from(d.qp.qp_num());
    let x = rst2init_qp_in::QPC;
    let p = qpc::PRIMARY_ADDRESS_PATH;
    let path = |c: &mut Vec<u8>, f: BitField, v: u64| f.set(&mut c[x.off / 8 + p.off / 8..], v);

    let mut c = cmd(Opcode::Rst2InitQp, rst2init_qp_in::SIZE_BYTES);
    rst2init_qp_in::QPN.set(&mut c, qpn);
    put(&mut c, x, qpc::RWE, 1);
    put(&mut c, x, qpc::RRE, 1);
    path(&mut c, ads::VHCA_PORT_NUM, 1);
    qp.modify(&c, rst2init_qp_out::SIZE_BYTES).unwrap();

    let gid = remote.query_gid(1, 0).unwrap();
    let mac = mac_of_link_local_gid(&gid).expect("link-local GID");
    let mut c = cmd(Opcode::Init2RtrQp, init2rtr_qp_in::SIZE_BYTES);
    init2rtr_qp_in::QPN.set(&mut c, qpn);
    put(&mut c, x, qpc::MTU, 3);
    put(
        &mut c,
        x,
        qpc::LOG_MSG_MAX,
        local.hca().caps().gen().log_max_msg().into(),
    );
    put(&mut c, x, qpc::REMOTE_QPN, rqpn.into());
    // The peer sends from PSN 0x100 (verbs_common::connect).
    put(&mut c, x, qpc::NEXT_RCV_PSN, 0x100);
    put(&mut c, x, qpc::LOG_RRA_MAX, 2);
    put(&mut c, x, qpc::MIN_RNR_NAK, 1);
    path(&mut c, ads::GRH, 1);
    path(&mut c, ads::SRC_ADDR_INDEX, 0);
    path(&mut c, ads::HOP_LIMIT, 64);
    path(&mut c, ads::UDP_SPORT, 0xc000);
    path(&mut c, ads::VHCA_PORT_NUM, 1);
    path(
        &mut c,
        ads::RMAC_47_32,
        u64::from(u16::from_be_bytes([mac[0], mac[1]])),
    );
    path(
        &mut c,
        ads::RMAC_31_0,
        u64::from(u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]])),
    );
    let at = (x.off + p.off + ads::RGID_RIP.off) / 8;
    c[at..at + 16].copy_from_slice(&gid);
    qp.modify(&c, rst2init_qp_out::SIZE_BYTES).unwrap();

    let mut c = cmd(Opcode::Rtr2RtsQp, rtr2rts_qp_in::SIZE_BYTES);
    rtr2rts_qp_in::QPN.set(&mut c, qpn);
    put(&mut c, x, qpc::NEXT_SEND_PSN, 0x100);
    put(&mut c, x, qpc::RETRY_COUNT, 7);
    put(&mut c, x, qpc::RNR_RETRY, 7);
    put(&mut c, x, qpc::LOG_SRA_MAX, 2);
    path(&mut c, ads::ACK_TIMEOUT, 14);
    qp.modify(&c, rst2init_qp_out::SIZE_BYTES).unwrap();
}

/// `n` completions from the DevX CQ.
fn devx_poll(cq: &mut DevxCq, n: usize) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut wc = [Wc::default(); 8];
    until("DevX completions", || {
        let k = cq.poll(&mut wc[..(n - out.len()).min(8)]);
        out.extend_from_slice(&wc[..k]);
        out.len() == n
    });
    out
}

/// A range of the DevX data UMEM, through the DevX memory key (its
/// addresses start at 0).
fn devx_sge(d: &Devx, off: usize, len: usize) -> Sge {
    assert!(off + len <= DBUF);
    // SAFETY: the range lies in the data UMEM's buffer, which the key
    // (`lkey`, start address 0, DBUF bytes) translates and which lives
    // (registered) until the test ends, after the last completion.
    unsafe { Sge::new_unchecked(off as u64, len as u32, d.lkey) }
}

#[test]
fn devx_rc_qp_exchanges_send_and_write_with_a_verbs_qp() {
    let fabric = Fabric::cabled(2, Profile::ConnectX5);
    let a = open(function(&fabric, 0));
    let mut b: Side = side(open(function(&fabric, 1)), 1 << 16, ALL);
    let mut d = devx_side(&a);
    let mut vq = create_qp(&b, QpType::Rc, verbs_common::cap(16));
    connect_raw(&d, &a, &b.ctx, vq.qp_num());
    connect(&mut vq, &b.ctx, &a, d.qp.qp_num());
    // The DevX QP reached RTS by raw commands: QUERY_QP says so.
    assert_eq!(qp_state(&d), u64::from(mlx5_hw::qp::QPC_STATE_RTS));

    // DevX -> verbs: a SEND into a posted receive, then an RDMA WRITE.
    let r = b.mr.sge(0, 2048).unwrap();
    vq.post_recv(&[RecvWr {
        wr_id: 500,
        sg_list: &[r],
    }])
    .unwrap();
    let sent = fill(&d.dbuf, 0, 1500, 3);
    let written = fill(&d.dbuf, 0x2000, 4096, 9);
    let raddr = b.mr.addr() + 0x4000;
    let (s0, s1) = (devx_sge(&d, 0, 1500), devx_sge(&d, 0x2000, 4096));
    d.qp.post_send(&[
        SendWr {
            wr_id: 1,
            op: SendOp::Send,
            payload: Payload::Sges(&[s0]),
            flags: sf::SIGNALED,
            ud: None,
        },
        SendWr {
            wr_id: 2,
            op: SendOp::RdmaWrite {
                raddr,
                rkey: b.mr.rkey(),
            },
            payload: Payload::Sges(&[s1]),
            flags: sf::SIGNALED,
            ud: None,
        },
    ])
    .unwrap();
    let wc = devx_poll(&mut d.cq, 2);
    for (w, (id, op)) in wc
        .iter()
        .zip([(1, WcOpcode::Send), (2, WcOpcode::RdmaWrite)])
    {
        assert_eq!(
            (w.status, w.wr_id, w.opcode),
            (WcStatus::Success, id, op),
            "{w:?}"
        );
        assert_eq!(w.qp_num, d.qp.qp_num());
    }
    let wc = poll_n(&mut b.cq, 1);
    assert_eq!((wc[0].status, wc[0].wr_id), (WcStatus::Success, 500));
    assert_eq!((wc[0].opcode, wc[0].byte_len), (WcOpcode::Recv, 1500));
    assert_eq!(read(&b.buf, 0, 1500), sent);
    assert_eq!(read(&b.buf, 0x4000, 4096), written);

    // verbs -> DevX: a SEND into a receive on the DevX QP's UMEM ring, an
    // RDMA WRITE through the DevX key, and an inline SEND.
    let (r0, r1) = (devx_sge(&d, 0x1000, 1024), devx_sge(&d, 0x1400, 1024));
    d.qp.post_recv(&[
        RecvWr {
            wr_id: 700,
            sg_list: &[r0],
        },
        RecvWr {
            wr_id: 701,
            sg_list: &[r1],
        },
    ])
    .unwrap();
    let back = fill(&b.buf, 0x8000, 1000, 5);
    let wback = fill(&b.buf, 0x9000, 3000, 11);
    let (v0, v1) = (
        b.mr.sge(0x8000, 1000).unwrap(),
        b.mr.sge(0x9000, 3000).unwrap(),
    );
    vq.post_send(&[
        SendWr {
            wr_id: 10,
            op: SendOp::Send,
            payload: Payload::Sges(&[v0]),
            flags: sf::SIGNALED,
            ud: None,
        },
        SendWr {
            wr_id: 11,
            op: SendOp::RdmaWrite {
                raddr: 0x3000,
                rkey: d.lkey,
            },
            payload: Payload::Sges(&[v1]),
            flags: sf::SIGNALED,
            ud: None,
        },
        SendWr {
            wr_id: 12,
            op: SendOp::Send,
            payload: Payload::Inline(b"inline from verbs"),
            flags: sf::SIGNALED,
            ud: None,
        },
    ])
    .unwrap();
    let wc = poll_n(&mut b.cq, 3);
    assert!(wc.iter().all(|w| w.status == WcStatus::Success), "{wc:?}");
    let wc = devx_poll(&mut d.cq, 2);
    assert_eq!(
        (wc[0].status, wc[0].wr_id, wc[0].byte_len),
        (WcStatus::Success, 700, 1000)
    );
    assert_eq!(
        (wc[1].status, wc[1].wr_id, wc[1].byte_len),
        (WcStatus::Success, 701, 17)
    );
    assert!(wc
        .iter()
        .all(|w| w.opcode == WcOpcode::Recv && w.qp_num == d.qp.qp_num()));
    assert_eq!(read(&d.dbuf, 0x1000, 1000), back);
    assert_eq!(read(&d.dbuf, 0x3000, 3000), wback);
    assert_eq!(read(&d.dbuf, 0x1400, 17), b"inline from verbs");

    // Teardown under the uid: objects, then UMEMs, then the context. The
    // doorbell records stayed in the queue UMEM throughout.
    assert_ne!(read(&d.qbuf, QP_DBR + 4, 4), vec![0; 4], "send counter");
    vq.destroy().unwrap();
    let Devx {
        dx,
        objs,
        umems,
        _uar,
        ..
    } = d;
    for o in objs {
        o.destroy().unwrap();
    }
    for mut u in umems {
        u.dereg().unwrap();
    }
    drop(_uar);
    dx.close().unwrap();
}

fn qp_state(d: &Devx) -> u64 {
    let mut c = cmd(Opcode::QueryQp, mlx5_hw::ifc::query_qp_in::SIZE_BYTES);
    mlx5_hw::ifc::query_qp_in::QPN.set(&mut c, d.qp.qp_num().into());
    let out = d.objs[0]
        .query(&c, mlx5_hw::ifc::query_qp_out::SIZE_BYTES)
        .unwrap();
    let at = mlx5_hw::ifc::query_qp_out::QPC.off / 8;
    qpc::STATE.get(&out[at..])
}

/// Asynchronous commands and object events on a DevX QP: QUERY_QPs issued
/// with `query_async` complete on the caller's queue with their `wr_id`s
/// (a failing one with its PRM status); a WRITE with a bad rkey from the
/// verbs peer puts the DevX QP in error, and the WQ access error event
/// reaches the channel subscribed to the QP, with the cookie.
#[test]
fn devx_async_queries_and_qp_events_reach_the_caller() {
    use mlx5_hw::event::EventType;
    use mlx5_hw::ifc::{query_qp_in, query_qp_out, EqeQpSrq};
    use std::time::Duration;

    let fabric = Fabric::cabled(2, Profile::ConnectX5);
    let a = open(function(&fabric, 0));
    let mut b: Side = side(open(function(&fabric, 1)), 1 << 16, ALL);
    let mut d = devx_side(&a);
    let mut vq = create_qp(&b, QpType::Rc, verbs_common::cap(16));
    connect_raw(&d, &a, &b.ctx, vq.qp_num());
    connect(&mut vq, &b.ctx, &a, d.qp.qp_num());

    let comp = d.dx.create_cmd_comp();
    let mut q = cmd(Opcode::QueryQp, query_qp_in::SIZE_BYTES);
    query_qp_in::QPN.set(&mut q, d.qp.qp_num().into());
    for wr_id in 1..=3 {
        d.objs[0]
            .query_async(&q, query_qp_out::SIZE_BYTES, wr_id, &comp)
            .unwrap();
    }
    let mut bad = q.clone();
    query_qp_in::QPN.set(&mut bad, 0xfff_fff);
    d.dx.general_cmd_async(&bad, query_qp_out::SIZE_BYTES, 99, &comp)
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..4 {
        let c = comp
            .get_async_cmd_comp(Duration::from_secs(10))
            .expect("an asynchronous completion");
        if c.wr_id == 99 {
            assert!(
                matches!(
                    c.result,
                    Err(verbs::Error::Cmd {
                        status: mlx5_hw::status::CmdStatus::BadResource,
                        ..
                    })
                ),
                "{:?}",
                c.result
            );
        } else {
            let out = c.result.unwrap();
            let at = query_qp_out::QPC.off / 8;
            assert_eq!(
                qpc::STATE.get(&out[at..]),
                u64::from(mlx5_hw::qp::QPC_STATE_RTS)
            );
        }
        ids.push(c.wr_id);
    }
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3, 99]);
    assert_eq!(comp.in_flight(), 0);
    assert!(comp.try_get().is_none());

    // Completion events of the DevX CQ, once armed, reach the channel.
    let ch = d.dx.create_event_channel();
    ch.subscribe_devx_event(Some(&d.objs[1]), &[EventType::Comp], 0xcc)
        .unwrap();
    d.cq.arm(0, false).unwrap();
    let r = b.mr.sge(0, 64).unwrap();
    vq.post_recv(&[RecvWr {
        wr_id: 1,
        sg_list: &[r],
    }])
    .unwrap();
    let s0 = devx_sge(&d, 0, 64);
    d.qp.post_send(&[SendWr {
        wr_id: 2,
        op: SendOp::Send,
        payload: Payload::Sges(&[s0]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let ev = ch
        .get_event(Duration::from_secs(10))
        .expect("the DevX CQ's completion event");
    assert_eq!((ev.cookie, ev.event.event_type), (0xcc, EventType::Comp));
    let comp: &mlx5_hw::ifc::EqeComp = zerocopy::transmute_ref!(&ev.event.data);
    assert_eq!(
        u64::from(comp.cqn.get()),
        create_cq_out::CQN.get(d.objs[1].create_out())
    );
    assert_eq!(devx_poll(&mut d.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(poll_n(&mut b.cq, 1)[0].status, WcStatus::Success);

    // Events: a QP cannot have CQ errors; subscribe to its access errors.
    assert!(ch
        .subscribe_devx_event(Some(&d.objs[0]), &[EventType::CqError], 1)
        .is_err());
    ch.subscribe_devx_event(
        Some(&d.objs[0]),
        &[EventType::WqAccessError, EventType::WqCatasError],
        0xc0ffee,
    )
    .unwrap();
    let s = b.mr.sge(0, 64).unwrap();
    vq.post_send(&[SendWr {
        wr_id: 7,
        op: SendOp::RdmaWrite {
            raddr: 0,
            rkey: d.lkey ^ 0x100,
        },
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    let wc = poll_n(&mut b.cq, 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{wc:?}");
    let ev = ch
        .get_event(Duration::from_secs(10))
        .expect("the DevX QP's access error event");
    assert_eq!(ev.cookie, 0xc0ffee);
    assert_eq!(ev.event.event_type, EventType::WqAccessError);
    let data: &EqeQpSrq = zerocopy::transmute_ref!(&ev.event.data);
    assert_eq!(data.qp_srq_n.get() & 0xff_ffff, d.qp.qp_num());
}
