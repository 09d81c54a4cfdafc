//! CREATE_DCT / DESTROY_DCT / QUERY_DCT / DRAIN_DCT /
//! ARM_DCT_FOR_KEY_VIOLATION: DC targets (the data path is
//! `transport/dc.rs`), numbered in the QP number space; and what a DCI
//! adds to the QP commands: its stream fields, bounded by the caps, and the
//! stream reset (RTS2RTS with the QPC extension).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use mlx5_hw::ifc::{
    arm_dct_in, cmd_hca_cap, create_dct_in, create_dct_out, dctc, destroy_dct_in, drain_dct_in,
    qpc, qpc_ext, query_dct_in, query_dct_out, rts2rts_qp_in,
};
use mlx5_hw::opcode::Opcode;
use mlx5_hw::qp::{DCTC_STATE_ACTIVE, QPC_OPT_MASK_32_DCI_STREAM_CHANNEL_ID};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::transport::dc::{self, Dct};
use crate::transport::qp::{st, Qp, Sq};
use crate::transport::{rlock, wlock};
use crate::{lock, Inner};

const CTX: usize = create_dct_in::DCT_CONTEXT_ENTRY.off / 8;
const QUERY_CTX: usize = query_dct_out::DCT_CONTEXT_ENTRY.off / 8;

/// The DCT number of DESTROY_DCT, QUERY_DCT, DRAIN_DCT (`dctn`) and
/// ARM_DCT_FOR_KEY_VIOLATION (`dct_number`: the same bits).
fn dctn_of(input: &[u8]) -> u32 {
    destroy_dct_in::DCTN.get(input) as u32
}

/// The DCT commands.
pub(super) fn is_dct(op: Opcode) -> bool {
    use Opcode as O;
    matches!(
        op,
        O::CreateDct | O::DestroyDct | O::QueryDct | O::DrainDct | O::ArmDctForKeyViolation
    )
}

impl Firmware {
    /// One DCT command ([`is_dct`]).
    pub(super) fn execute_dct(
        &mut self,
        inner: &Inner,
        op: Opcode,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        use Opcode as O;
        match op {
            O::CreateDct => self.create_dct(inner, input, outlen),
            O::DestroyDct => self.destroy_dct(inner, input, outlen),
            O::QueryDct => self.query_dct(inner, input, outlen),
            O::DrainDct => self.drain_dct(inner, input, outlen),
            _ => self.arm_dct(inner, input, outlen),
        }
    }

    pub(super) fn create_dct(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            create_dct_in::SIZE_BYTES,
            create_dct_out::SIZE_BYTES,
        )?;
        if self.cap(cmd_hca_cap::DCT) == 0 {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        // A uid other than 0 was checked against the live user contexts
        // (`devx_check`), as for every command; DCTs are not owned per uid.
        let c = &input[CTX..CTX + dctc::SIZE_BYTES];
        let r = &inner.rdma;
        let pd = dctc::PD.get(c) as u32;
        if !lock(&r.pds).contains(&pd) {
            return Err(fail(CmdStatus::BadResource, synd::DCT_BAD_PD));
        }
        let Some(cq) = rlock(&r.cqs).get(&(dctc::CQN.get(c) as u32)).cloned() else {
            return Err(fail(CmdStatus::BadResource, synd::DCT_BAD_CQ));
        };
        let Some(srq) = rlock(&r.srqs)
            .get(&(dctc::SRQN_XRQN.get(c) as u32))
            .cloned()
        else {
            return Err(fail(CmdStatus::BadResource, synd::DCT_BAD_SRQ));
        };
        let mtu = match dctc::MTU.get(c) {
            m @ 1..=5 => 128u32 << m,
            _ => return Err(fail(CmdStatus::BadParameter, synd::DCT_BAD_MTU)),
        };
        if dctc::PORT.get(c) > 1 {
            return Err(fail(CmdStatus::BadParameter, synd::VPORT_BAD_PORT));
        }
        let sgid = dctc::MY_ADDR_INDEX.get(c) as usize;
        if rlock(&r.gids).get(sgid).copied().flatten().is_none() {
            return Err(fail(CmdStatus::BadParameter, synd::DCT_BAD_SGID));
        }
        let counter_set = dctc::COUNTER_SET_ID.get(c) as u32;
        if counter_set != 0 && !lock(&r.q_counters).contains_key(&counter_set) {
            return Err(fail(CmdStatus::BadParameter, synd::Q_COUNTER_UNKNOWN));
        }
        let qps = rlock(&r.qps);
        let dctn = self.free_queue_number_in(&qps, &r.qp_floor, synd::QP_EXHAUSTED)?;
        drop(qps);
        self.dctns.insert(dctn);
        let dct = Dct {
            dctn,
            pd,
            cq,
            srq,
            key: dctc::DC_ACCESS_KEY.get(c),
            rre: dctc::RRE.get(c) != 0,
            rwe: dctc::RWE.get(c) != 0,
            rae: dctc::RAE.get(c) != 0,
            mtu,
            min_rnr_nak: dctc::MIN_RNR_NAK.get(c) as u8,
            counter_set,
            cs_res: dctc::CS_RES.get(c) as u8,
            cqe_uidx: self.dct_cqe_uidx(c),
            ctx: c.to_vec(),
            state: AtomicU8::new(DCTC_STATE_ACTIVE),
            violations: AtomicU32::new(0),
            armed: AtomicBool::new(false),
            conns: Mutex::new(Default::default()),
        };
        tracing::debug!(
            dctn,
            pd,
            srqn = dct.srq.srqn,
            cqn = dct.cq.cqn,
            "CREATE_DCT"
        );
        wlock(&r.dcts).insert(dctn, Arc::new(dct));
        let mut out = vec![0u8; create_dct_out::SIZE_BYTES];
        create_dct_out::DCTN.set(&mut out, u64::from(dctn));
        Ok(out)
    }

    /// DESTROY_DCT: its connections end with it (Linux drains first).
    pub(super) fn destroy_dct(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, destroy_dct_in::SIZE_BYTES, 0x10)?;
        let dctn = dctn_of(input);
        let r = &inner.rdma;
        let Some(dct) = wlock(&r.dcts).remove(&dctn) else {
            return Err(fail(CmdStatus::BadResource, synd::DCT_UNKNOWN));
        };
        self.dctns.remove(&dctn);
        crate::transport::freed(&r.qp_floor, dctn);
        dct.close_all();
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_dct(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_dct_in::SIZE_BYTES,
            query_dct_out::SIZE_BYTES,
        )?;
        let Some(dct) = dc::dct(&inner.rdma, query_dct_in::DCTN.get(input) as u32) else {
            return Err(fail(CmdStatus::BadResource, synd::DCT_UNKNOWN));
        };
        let mut out = vec![0u8; query_dct_out::SIZE_BYTES];
        let c = &mut out[QUERY_CTX..QUERY_CTX + dctc::SIZE_BYTES];
        c.copy_from_slice(&dct.ctx);
        dctc::STATE.set(c, u64::from(dct.state.load(Ordering::Acquire)));
        dctc::DC_ACCESS_KEY_VIOLATION_COUNT
            .set(c, u64::from(dct.violations.load(Ordering::Relaxed)));
        Ok(out)
    }

    /// DRAIN_DCT: no connection opens, the open ones close as their DCIs
    /// disconnect; DCT_DRAINED when the last has (`transport::dc`).
    pub(super) fn drain_dct(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, drain_dct_in::SIZE_BYTES, 0x10)?;
        let Some(dct) = dc::dct(&inner.rdma, dctn_of(input)) else {
            return Err(fail(CmdStatus::BadResource, synd::DCT_UNKNOWN));
        };
        if dct.state.load(Ordering::Acquire) != DCTC_STATE_ACTIVE {
            return Err(fail(CmdStatus::BadResourceState, synd::DCT_DRAINED));
        }
        dct.drain(&inner.rdma);
        Ok(vec![0; 0x10])
    }

    /// ARM_DCT_FOR_KEY_VIOLATION: the next violation raises one event.
    pub(super) fn arm_dct(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, arm_dct_in::SIZE_BYTES, 0x10)?;
        let Some(dct) = dc::dct(&inner.rdma, arm_dct_in::DCT_NUMBER.get(input) as u32) else {
            return Err(fail(CmdStatus::BadResource, synd::DCT_UNKNOWN));
        };
        dct.armed.store(true, Ordering::Release);
        Ok(vec![0; 0x10])
    }

    /// What a DCT's receive CQEs carry in `srqn_uidx`: its user index
    /// under cqe_version 1 (as for QPs), else the SRQ number (`None`).
    fn dct_cqe_uidx(&self, c: &[u8]) -> Option<u32> {
        (self.cap(cmd_hca_cap::CQE_VERSION) == 1).then(|| dctc::USER_INDEX.get(c) as u32)
    }

    /// A new QP's DCI stream fields: only on a DCI, within
    /// `log_max_dci_stream_channels` / `log_max_dci_errored_streams`. More
    /// errored streams than streams is taken (rdma-core's test_mlx5_dc
    /// creates a DCI of 2^2 streams and 2^3 errored ones on the card; the
    /// DCI then never leaves RTS for its streams' errors).
    pub(super) fn dci_streams(&self, service: u8, c: &[u8]) -> Result<(u8, u8), Fail> {
        let streams = qpc::LOG_NUM_DCI_STREAM_CHANNELS.get(c);
        let errored = qpc::LOG_NUM_DCI_ERRORED_STREAMS.get(c);
        if service != st::DCI {
            if streams != 0 || errored != 0 {
                return Err(fail(CmdStatus::BadParameter, synd::DCI_BAD_STREAMS));
            }
            return Ok((0, 0));
        }
        if streams > self.cap(cmd_hca_cap::LOG_MAX_DCI_STREAM_CHANNELS)
            || errored > self.cap(cmd_hca_cap::LOG_MAX_DCI_ERRORED_STREAMS)
        {
            return Err(fail(CmdStatus::BadParameter, synd::DCI_BAD_STREAMS));
        }
        Ok((streams as u8, errored as u8))
    }
}

/// RTS2RTS with `qpc_ext` and `opt_param_mask_95_32` naming
/// `dci_stream_channel_id`: that stream of a DCI with streams is no longer
/// in error (rdma-core's mlx5dv_dci_stream_id_reset).
pub(super) fn dci_stream_reset(qp: &Qp, input: &[u8], sq: &mut Sq) -> Result<(), Fail> {
    if rts2rts_qp_in::QPC_EXT.get(input) == 0 {
        return Ok(());
    }
    if input.len() < rts2rts_qp_in::SIZE_BYTES {
        return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
    }
    if rts2rts_qp_in::OPT_PARAM_MASK_95_32.get(input) & QPC_OPT_MASK_32_DCI_STREAM_CHANNEL_ID == 0 {
        return Ok(());
    }
    if qp.st != st::DCI || qp.log_dci_streams == 0 {
        return Err(fail(CmdStatus::BadParameter, synd::DCI_BAD_STREAMS));
    }
    // A stream id names the channel the data path puts it on (its low
    // log_num_dci_stream_channels bits, `dc::stream_of`): rdma-core's
    // test_mlx5_dc posts and resets ids past the channel count. Only a
    // channel in error is reset; resetting one that is not is refused
    // (the same test expects that refusal).
    let at = rts2rts_qp_in::QPC_DATA_EXT.off / 8;
    let raw = qpc_ext::DCI_STREAM_CHANNEL_ID.get(&input[at..]) as u16;
    let id = raw & ((1u16 << qp.log_dci_streams) - 1);
    if !sq.dc.errored.remove(&id) {
        return Err(fail(CmdStatus::BadParameter, synd::DCI_BAD_STREAMS));
    }
    tracing::debug!(qpn = qp.qpn, stream = id, "DCI stream reset");
    Ok(())
}

#[cfg(test)]
mod tests {
    use mlx5_hw::ifc::qpc;

    use super::st;
    use crate::fw::Firmware;
    use crate::{DeviceConfig, Profile};

    #[test]
    fn a_dct_reports_its_user_index_under_cqe_version_1() {
        use mlx5_hw::ifc::{cmd_hca_cap, dctc};
        let mut fw = Firmware::new(&DeviceConfig::for_profile(Profile::ConnectX7));
        let mut c = vec![0u8; dctc::SIZE_BYTES];
        dctc::USER_INDEX.set(&mut c, 0x42);
        let general = crate::profile::cap_type::GENERAL;
        for (v, want) in [(0, None), (1, Some(0x42))] {
            let page = fw.caps.cur.get_mut(&general).unwrap();
            cmd_hca_cap::CQE_VERSION.set(page, v);
            assert_eq!(fw.dct_cqe_uidx(&c), want);
        }
    }

    #[test]
    fn dci_stream_bounds_are_the_caps_only() {
        let fw = Firmware::new(&DeviceConfig::for_profile(Profile::ConnectX7));
        let mut c = vec![0u8; qpc::SIZE_BYTES];
        // 2^2 streams, 2^3 errored (rdma-core's second DCI): taken.
        qpc::LOG_NUM_DCI_STREAM_CHANNELS.set(&mut c, 2);
        qpc::LOG_NUM_DCI_ERRORED_STREAMS.set(&mut c, 3);
        assert_eq!(fw.dci_streams(st::DCI, &c).unwrap(), (2, 3));
        // Past the caps (2^4 each on this profile), or on an RC QP: refused.
        qpc::LOG_NUM_DCI_ERRORED_STREAMS.set(&mut c, 5);
        assert!(fw.dci_streams(st::DCI, &c).is_err());
        qpc::LOG_NUM_DCI_ERRORED_STREAMS.set(&mut c, 0);
        assert!(fw.dci_streams(st::RC, &c).is_err());
    }
}
