//! MAD_IFC against the model with raw commands: the subnet management
//! agent's NodeInfo, NodeDescription, PortInfo, GUIDInfo and P_KeyTable
//! from the port's state, the performance agent's counters moving with
//! RDMA traffic, and what the agents refuse (in the MAD's status) or
//! firmware refuses (a bad port: command status).

mod verbs_common;

use mlx5_hw::ifc::{general_obj_in_cmd_hdr, mad_ifc_in, mad_ifc_out};
use mlx5_hw::mad::{self as m, node_info as ni, port_info as pi};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use verbs::device::Context;
use verbs::qp::{send_flags as sf, Payload, QpType, SendOp, SendWr};
use verbs_common::{cap, pair, poll_n, qp_pair};

/// A MAD GET of `attr` in `class` (modifier `modifier`) on `port`; the
/// response MAD.
fn mad(ctx: &Context, port: u8, class: u8, method: u8, attr: u16, modifier: u32) -> Vec<u8> {
    try_mad(ctx, port, class, method, attr, modifier).unwrap()
}

fn try_mad(
    ctx: &Context,
    port: u8,
    class: u8,
    method: u8,
    attr: u16,
    modifier: u32,
) -> verbs::Result<Vec<u8>> {
    let mut c = vec![0u8; mad_ifc_in::SIZE_BYTES];
    general_obj_in_cmd_hdr::OPCODE.set(&mut c, u64::from(Opcode::MadIfc.to_raw()));
    mad_ifc_in::OP_MOD.set(&mut c, 3); // ignore M_Key and B_Key, as Linux
    mad_ifc_in::PORT.set(&mut c, u64::from(port));
    let at = mad_ifc_in::MAD.off / 8;
    let q = &mut c[at..at + m::MAD_SIZE];
    q[m::HDR_BASE_VERSION] = m::BASE_VERSION;
    q[m::HDR_MGMT_CLASS] = class;
    q[m::HDR_CLASS_VERSION] = m::CLASS_VERSION_1;
    q[m::HDR_METHOD] = method;
    q[m::HDR_TID..m::HDR_TID + 8].copy_from_slice(&0x1122_3344_5566_7788u64.to_be_bytes());
    q[m::HDR_ATTR_ID..m::HDR_ATTR_ID + 2].copy_from_slice(&attr.to_be_bytes());
    q[m::HDR_ATTR_MOD..m::HDR_ATTR_MOD + 4].copy_from_slice(&modifier.to_be_bytes());
    let out = ctx.hca().cmd().exec(&c, mad_ifc_out::SIZE_BYTES)?;
    let o = mad_ifc_out::RESPONSE_MAD_PACKET.off / 8;
    Ok(out[o..o + m::MAD_SIZE].to_vec())
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

fn status(r: &[u8]) -> u16 {
    be16(r, m::HDR_STATUS)
}

fn smp(ctx: &Context, attr: u16, modifier: u32) -> Vec<u8> {
    let r = mad(
        ctx,
        1,
        m::CLASS_SUBN_LID_ROUTED,
        m::METHOD_GET,
        attr,
        modifier,
    );
    assert_eq!(r[m::HDR_METHOD], m::METHOD_GET_RESP);
    assert_eq!(be64(&r, m::HDR_TID), 0x1122_3344_5566_7788);
    r
}

#[test]
fn the_sma_answers_from_the_ports_state() {
    let p = pair(1 << 16);
    let ctx = &p.a.ctx;
    let dev = ctx.query_device().unwrap();

    let r = smp(ctx, m::ATTR_NODE_INFO, 0);
    assert_eq!(status(&r), 0);
    let d = &r[m::DATA..];
    assert_eq!(d[ni::NODE_TYPE], ni::NODE_TYPE_CA);
    assert_eq!(d[ni::NUM_PORTS], 1);
    assert_eq!(be64(d, ni::NODE_GUID), dev.node_guid);
    assert_eq!(be64(d, ni::PORT_GUID), dev.node_guid);
    assert_eq!(be16(d, ni::PARTITION_CAP), 128);
    assert_eq!(
        be16(d, ni::DEVICE_ID),
        mlx5_emu::Profile::ConnectX4Lx.device_id()
    );
    assert_eq!(be32(d, ni::LOCAL_PORT_VENDOR_ID), 1 << 24 | 0x02c9);

    let r = smp(ctx, m::ATTR_NODE_DESC, 0);
    let text = String::from_utf8_lossy(&r[m::DATA..m::DATA + 64]);
    assert!(text.starts_with("MT4117 ConnectX4Lx"), "{text}");

    // A cabled 25G port: active, link up, 1x at EDR lane speed, LID 0.
    let r = smp(ctx, m::ATTR_PORT_INFO, 0);
    assert_eq!(status(&r), 0);
    let d = &r[m::DATA..];
    assert_eq!(d[pi::SPEED_SUP_PORT_STATE] & 0xf, pi::STATE_ACTIVE);
    assert_eq!(d[pi::PHYS_STATE_DOWN_DEF] >> 4, pi::PHYS_LINK_UP);
    assert_eq!(d[pi::LINK_WIDTH_ACTIVE], pi::WIDTH_1X);
    assert_eq!(d[pi::SPEED_EXT_ACTIVE_SUP] >> 4, pi::SPEED_EXT_EDR);
    assert_eq!(be16(d, pi::LID), 0);
    assert_eq!(be64(d, pi::GID_PREFIX), 0xfe80_0000_0000_0000);
    assert_eq!(d[pi::LOCAL_PORT_NUM], 1);

    let r = smp(ctx, m::ATTR_GUID_INFO, 0);
    assert_eq!(be64(&r, m::DATA), dev.node_guid);
    let r = smp(ctx, m::ATTR_PKEY_TABLE, 0);
    assert_eq!(be16(&r, m::DATA), 0xffff);
    assert_eq!(be16(&r, m::DATA + 2), 0);

    // Directed route: the same answer with the direction bit.
    let r = mad(
        ctx,
        1,
        m::CLASS_SUBN_DIRECTED_ROUTE,
        m::METHOD_GET,
        m::ATTR_NODE_INFO,
        0,
    );
    assert_eq!(status(&r), m::STATUS_DIRECTION);
    assert_eq!(be64(&r, m::DATA + ni::NODE_GUID), dev.node_guid);
}

#[test]
fn the_agents_refuse_in_the_mad_status_and_firmware_a_bad_port() {
    let p = pair(1 << 16);
    let ctx = &p.a.ctx;
    // 128 P_Keys are 4 blocks; one GUID is one block.
    assert_eq!(
        status(&smp(ctx, m::ATTR_PKEY_TABLE, 4)),
        m::STATUS_INVALID_ATTRIB_VALUE
    );
    assert_eq!(
        status(&smp(ctx, m::ATTR_GUID_INFO, 1)),
        m::STATUS_INVALID_ATTRIB_VALUE
    );
    // SMInfo (0x20): no subnet manager here.
    assert_eq!(
        status(&smp(ctx, 0x20, 0)),
        m::STATUS_UNSUPPORTED_METHOD_ATTRIB
    );
    let r = mad(
        ctx,
        1,
        m::CLASS_SUBN_LID_ROUTED,
        m::METHOD_SET,
        m::ATTR_PORT_INFO,
        0,
    );
    assert_eq!(status(&r), m::STATUS_UNSUPPORTED_METHOD);
    let r = mad(ctx, 1, 0x0a, m::METHOD_GET, 1, 0);
    assert_eq!(status(&r), m::STATUS_UNSUPPORTED_METHOD);
    match try_mad(
        ctx,
        2,
        m::CLASS_SUBN_LID_ROUTED,
        m::METHOD_GET,
        m::ATTR_NODE_INFO,
        0,
    ) {
        Err(verbs::Error::Cmd { status, .. }) => assert_eq!(status, CmdStatus::BadParameter),
        other => panic!("port 2: {other:?}"),
    }
}

#[test]
fn the_pma_counts_the_ports_traffic() {
    let mut p = pair(1 << 16);
    let pma = |ctx: &Context, attr| {
        let r = mad(ctx, 1, m::CLASS_PERF_MGMT, m::METHOD_GET, attr, 0);
        assert_eq!(status(&r), 0);
        r[m::DATA..].to_vec()
    };
    let cpi = pma(&p.a.ctx, m::ATTR_CLASS_PORT_INFO);
    assert_ne!(
        be16(&cpi, m::class_port_info::CAP_MASK) & m::class_port_info::CAP_EXT_WIDTH,
        0
    );
    use m::port_counters_ext as pe;
    let (a0, b0) = (
        pma(&p.a.ctx, m::ATTR_PORT_COUNTERS_EXT),
        pma(&p.b.ctx, m::ATTR_PORT_COUNTERS_EXT),
    );
    let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
    let s = p.a.mr.sge(0, 4096).unwrap();
    qa.post_send(&[SendWr {
        wr_id: 1,
        op: SendOp::RdmaWrite {
            raddr: p.b.mr.addr(),
            rkey: p.b.mr.rkey(),
        },
        payload: Payload::Sges(&[s]),
        flags: sf::SIGNALED,
        ud: None,
    }])
    .unwrap();
    assert_eq!(
        poll_n(&mut p.a.cq, 1)[0].status,
        verbs::cq::WcStatus::Success
    );
    let (a1, b1) = (
        pma(&p.a.ctx, m::ATTR_PORT_COUNTERS_EXT),
        pma(&p.b.ctx, m::ATTR_PORT_COUNTERS_EXT),
    );
    let moved = |x: &[u8], y: &[u8], at| be64(y, at) - be64(x, at);
    // 4 KiB of payload went out of a and into b (in 4-octet units).
    assert!(moved(&a0, &a1, pe::XMIT_DATA) >= 1024);
    assert!(moved(&b0, &b1, pe::RCV_DATA) >= 1024);
    assert!(moved(&a0, &a1, pe::XMIT_PACKETS) >= 1);
    assert!(moved(&b0, &b1, pe::RCV_PACKETS) >= 1);
    let c = pma(&p.a.ctx, m::ATTR_PORT_COUNTERS);
    assert_eq!(
        u64::from(be32(&c, m::port_counters::XMIT_PACKETS)),
        be64(&a1, pe::XMIT_PACKETS)
    );
}
