//! End to end, ordering attributes: relaxed ordering of memory keys
//! (`IBV_ACCESS_RELAXED_ORDERING`, read back by QUERY_MKEY) and the
//! data-in-order answers of QPs, on profiles that offer them and on the
//! ConnectX-4 Lx, which does not.

mod verbs_common;

use mlx5_emu::Profile;
use mlx5_hw::ifc::{create_mkey_in, create_mkey_out, CreateMkeyIn};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::status::CmdStatus;
use verbs::cq::WcStatus;
use verbs::mr::access;
use verbs::qp::{send_flags as sf, Payload, QpType, SendOp, SendWr};
use verbs::Error;
use verbs_common::*;

const RO: u32 = access::RELAXED_ORDERING;

#[test]
fn relaxed_ordering_sets_both_mkey_bits_where_offered_and_carries_traffic() {
    for profile in [Profile::ConnectX6, Profile::ConnectX7] {
        let mut p = pair_profile(1 << 16, profile, ALL | RO);
        let g = p.a.ctx.hca().caps().gen();
        assert!(
            g.relaxed_ordering_write() && g.relaxed_ordering_read(),
            "{profile:?} caps"
        );
        let k = p.b.mr.query_mkey().unwrap();
        assert!(
            k.relaxed_ordering_write && k.relaxed_ordering_read,
            "{profile:?}: {k:?}"
        );
        assert!(k.lw && k.rw && k.rr && k.a, "{k:?}");
        // Without the flag: neither bit.
        let plain = p.b.pd.reg_mr_buffer(&p.b.buf, 0, 4096, ALL).unwrap();
        let k = plain.query_mkey().unwrap();
        assert!(
            !k.relaxed_ordering_write && !k.relaxed_ordering_read,
            "{k:?}"
        );
        // A relaxed-ordering region takes RDMA WRITE and READ as any other.
        let (mut qa, _qb) = qp_pair(&p, QpType::Rc, cap(16));
        let data = fill(&p.a.buf, 0, 256, 9);
        let sge = p.a.mr.sge(0, 256).unwrap();
        qa.post_send(&[SendWr {
            wr_id: 1,
            op: SendOp::RdmaWrite {
                raddr: p.b.mr.addr() + 4096,
                rkey: p.b.mr.rkey(),
            },
            payload: Payload::Sges(&[sge]),
            flags: sf::SIGNALED,
            ud: None,
        }])
        .unwrap();
        assert_eq!(poll_n(&mut p.a.cq, 1)[0].status, WcStatus::Success);
        assert_eq!(read(&p.b.buf, 4096, 256), data, "{profile:?}");
    }
}

#[test]
fn relaxed_ordering_is_ignored_silently_on_the_connectx4_lx() {
    let p = pair_profile(1 << 16, Profile::ConnectX4Lx, ALL | RO);
    let g = p.a.ctx.hca().caps().gen();
    assert!(!g.relaxed_ordering_write() && !g.relaxed_ordering_read());
    assert!(!g.relaxed_ordering_read_pci_enabled());
    let k = p.a.mr.query_mkey().unwrap();
    assert!(
        !k.relaxed_ordering_write && !k.relaxed_ordering_read,
        "{k:?}"
    );
    assert!(k.lw && k.rw && k.rr && k.a, "the other rights stay: {k:?}");
}

/// A raw CREATE_MKEY (PA mode, local read) with relaxed-ordering bits.
fn raw_mkey(ctx: &verbs::device::Context, pdn: u32, write: bool, read: bool) -> verbs::Result<u32> {
    let mut inb = vec![0u8; create_mkey_in::SIZE_BYTES];
    {
        let mut c = CreateMkeyIn::new_unchecked(&mut inb[..]);
        c.set_opcode(Opcode::CreateMkey.to_raw());
        c.memory_key_mkey_entry_mut()
            .set_access_mode_1_0(mlx5_hw::wqe::MKC_ACCESS_MODE_PA)
            .set_lr(true)
            .set_relaxed_ordering_write(write)
            .set_relaxed_ordering_read(read)
            .set_qpn(0xff_ffff)
            .set_pd(pdn)
            .set_length64(true);
    }
    let out = ctx.hca().cmd().exec(&inb, create_mkey_out::SIZE_BYTES)?;
    Ok(mlx5_hw::ifc::CreateMkeyOut::new_unchecked(&out[..]).mkey_index() << 8)
}

#[test]
fn a_raw_mkey_with_relaxed_ordering_the_caps_lack_is_a_bad_parameter() {
    let p = pair_profile(4096, Profile::ConnectX4Lx, ALL);
    for (w, r) in [(true, false), (false, true), (true, true)] {
        match raw_mkey(&p.a.ctx, p.a.pd.pdn(), w, r) {
            Err(Error::Cmd {
                opcode: Opcode::CreateMkey,
                status: CmdStatus::BadParameter,
                ..
            }) => {}
            other => panic!("write {w} read {r}: {other:?}"),
        }
    }
    // The same keys on a ConnectX-6 are made, and read back as made.
    let p6 = pair_profile(4096, Profile::ConnectX6, ALL);
    let key = raw_mkey(&p6.a.ctx, p6.a.pd.pdn(), true, false).unwrap();
    assert!(key != 0);
}

use verbs::ordering::data_in_order as dio;

/// `IBV_WR_RDMA_WRITE` and `IBV_WR_SEND` (libibverbs' numbers).
const WR_RDMA_WRITE: u32 = 0;
const WR_SEND: u32 = 2;

#[test]
fn data_in_order_is_reported_for_rts_qps_where_the_device_offers_it() {
    let p = pair_profile(4096, Profile::ConnectX7, ALL);
    assert!(p.a.ctx.hca().caps().gen().qp_data_in_order());
    let fresh = create_qp(&p.a, QpType::Rc, cap(4));
    assert_eq!(fresh.query_data_in_order(WR_SEND, 0), 0, "not in RTS");
    assert_eq!(fresh.query_data_in_order(WR_SEND, dio::RETURN_CAPS), 0);
    for t in [QpType::Rc, QpType::Uc] {
        let (qa, _qb) = qp_pair(&p, t, cap(4));
        for op in [WR_RDMA_WRITE, WR_SEND] {
            assert_eq!(qa.query_data_in_order(op, 0), 1, "{t:?} op {op}");
            assert_eq!(
                qa.query_data_in_order(op, dio::RETURN_CAPS),
                dio::WHOLE_MSG | dio::ALIGNED_128_BYTES,
                "{t:?} op {op}"
            );
            assert_eq!(
                qa.query_data_in_order(op, dio::RETURN_CAPS | dio::DEVICE_ONLY),
                dio::WHOLE_MSG | dio::ALIGNED_128_BYTES
            );
        }
        // A flag libibverbs does not know: 0.
        assert_eq!(qa.query_data_in_order(WR_SEND, 1 << 2), 0);
    }
}

#[test]
fn data_in_order_is_0_where_the_device_does_not_offer_it() {
    for profile in [Profile::ConnectX4Lx, Profile::ConnectX6] {
        let p = pair_profile(4096, profile, ALL);
        assert!(!p.a.ctx.hca().caps().gen().qp_data_in_order());
        let (qa, _qb) = qp_pair(&p, QpType::Rc, cap(4));
        assert_eq!(qa.query_data_in_order(WR_SEND, 0), 0, "{profile:?}");
        assert_eq!(
            qa.query_data_in_order(WR_SEND, dio::RETURN_CAPS),
            0,
            "{profile:?}"
        );
    }
}
