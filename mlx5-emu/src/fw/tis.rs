//! CREATE_TIS / MODIFY_TIS / DESTROY_TIS / QUERY_TIS: transport interface
//! send objects, what an SQ sends through (mlx5e makes one per LAG port and
//! traffic class at probe). A TIS names a transport domain; MODIFY_TIS
//! changes the fields its bitmask selects (prio, LAG port affinity).

use mlx5_hw::ifc::{
    cmd_hca_cap, create_tis_in, create_tis_out, destroy_tis_in, modify_tis_bitmask, modify_tis_in,
    query_tis_in, query_tis_out, sqc, tisc,
};
use mlx5_hw::status::CmdStatus;

use super::eth::{free_number, known, limit, Obj};
use super::{fail, sized, synd, CmdResult, Fail, Firmware};
use crate::{lock, Inner};

impl Firmware {
    /// The checks a TIS context passes (creation and MODIFY_TIS).
    fn check_tisc(&self, c: &[u8]) -> Result<(), Fail> {
        if tisc::TLS_EN.get(c) != 0 && self.cap(cmd_hca_cap::TLS_TX) == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::TIS_BAD_PARAM));
        }
        let lag_ports = self.cap(cmd_hca_cap::NUM_LAG_PORTS).max(1);
        if tisc::LAG_TX_PORT_AFFINITY.get(c) > lag_ports {
            return Err(fail(CmdStatus::BadParameter, synd::TIS_BAD_PARAM));
        }
        if tisc::UNDERLAY_QPN.get(c) != 0 {
            // An IPoIB underlay QP: the model's ports are Ethernet.
            return Err(fail(CmdStatus::BadParameter, synd::TIS_BAD_PARAM));
        }
        Ok(())
    }

    pub(super) fn create_tis(&mut self, inner: &Inner, input: &[u8], outlen: usize) -> CmdResult {
        use create_tis_in as i;
        sized(input, outlen, i::SIZE_BYTES, create_tis_out::SIZE_BYTES)?;
        self.check_uid(i::UID.get(input))?;
        let c = &input[i::CTX.off / 8..][..tisc::SIZE_BYTES];
        let td = tisc::TRANSPORT_DOMAIN.get(c) as u32;
        if !lock(&inner.rdma.tds).contains(&td) {
            return Err(fail(CmdStatus::BadResource, synd::TIS_BAD_TD));
        }
        self.check_tisc(c)?;
        let max = limit(self.cap(cmd_hca_cap::LOG_MAX_TIS));
        let tisn = free_number(&self.eth.tises, 1, max, synd::TIS_EXHAUSTED)?;
        self.eth.tises.insert(tisn, Obj { ctx: c.to_vec() });
        tracing::debug!(tisn, td, "CREATE_TIS");
        let mut out = vec![0u8; create_tis_out::SIZE_BYTES];
        create_tis_out::TISN.set(&mut out, u64::from(tisn));
        Ok(out)
    }

    pub(super) fn modify_tis(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use modify_tis_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let tisn = i::TISN.get(input) as u32;
        known(&self.eth.tises, tisn, synd::TIS_UNKNOWN)?;
        let c = &input[i::CTX.off / 8..][..tisc::SIZE_BYTES];
        self.check_tisc(c)?;
        let m = &input[i::BITMASK.off / 8..][..modify_tis_bitmask::SIZE_BYTES];
        let Some(tis) = self.eth.tises.get_mut(&tisn) else {
            return Err(fail(CmdStatus::BadResource, synd::TIS_UNKNOWN));
        };
        for (bit, field) in [
            (modify_tis_bitmask::PRIO, tisc::PRIO),
            (
                modify_tis_bitmask::LAG_TX_PORT_AFFINITY,
                tisc::LAG_TX_PORT_AFFINITY,
            ),
            (
                modify_tis_bitmask::STRICT_LAG_TX_PORT_AFFINITY,
                tisc::STRICT_LAG_TX_PORT_AFFINITY,
            ),
        ] {
            if bit.get(m) != 0 {
                field.set(&mut tis.ctx, field.get(c));
            }
        }
        Ok(vec![0; 0x10])
    }

    pub(super) fn destroy_tis(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_tis_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let tisn = i::TISN.get(input) as u32;
        known(&self.eth.tises, tisn, synd::TIS_UNKNOWN)?;
        let sends_through = |sq: &Obj| sqc::TIS_NUM_0.get(&sq.ctx) as u32 == tisn;
        if self.eth.sqs.values().any(sends_through) {
            return Err(fail(CmdStatus::BadResourceState, synd::TIS_IN_USE));
        }
        self.eth.tises.remove(&tisn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_tis(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use query_tis_out as o;
        sized(input, outlen, query_tis_in::SIZE_BYTES, o::SIZE_BYTES)?;
        let tisn = query_tis_in::TISN.get(input) as u32;
        let tis = known(&self.eth.tises, tisn, synd::TIS_UNKNOWN)?;
        let mut out = vec![0u8; o::SIZE_BYTES];
        out[o::TIS_CONTEXT.off / 8..][..tisc::SIZE_BYTES].copy_from_slice(&tis.ctx);
        Ok(out)
    }
}
