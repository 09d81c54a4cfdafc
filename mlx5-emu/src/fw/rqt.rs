//! CREATE_RQT / MODIFY_RQT / DESTROY_RQT / QUERY_RQT: RQ tables, the RQs an
//! indirect TIR spreads its hash over (mlx5e points them at its drop RQ at
//! probe and at the channels' RQs when the netdev opens). The list follows
//! the context (`rq_num`, one dword per entry, `rqt_actual_size` of them).

use mlx5_hw::ifc::{
    cmd_hca_cap, create_rqt_in, create_rqt_out, destroy_rqt_in, modify_rqt_in, query_rqt_in,
    query_rqt_out, rq_num, rqt_bitmask, rqtc, tirc,
};
use mlx5_hw::status::CmdStatus;

use super::eth::{free_number, known, limit, Obj};
use super::{fail, sized, synd, CmdResult, Fail, Firmware};

/// Bytes of an RQ table context with `actual` entries in its list.
fn table_bytes(actual: usize) -> usize {
    rqtc::SIZE_BYTES + actual * rq_num::SIZE_BYTES
}

impl Firmware {
    /// The context and list at `at` of `input`, checked: the size fits the
    /// card and the table's own maximum, every entry is an RQ.
    fn rqt_from(&self, input: &[u8], at: usize) -> Result<Vec<u8>, Fail> {
        let c = &input[at..at + rqtc::SIZE_BYTES];
        let max = rqtc::RQT_MAX_SIZE.get(c);
        let actual = rqtc::RQT_ACTUAL_SIZE.get(c);
        let card_max = 1u64 << self.cap(cmd_hca_cap::LOG_MAX_RQT_SIZE).min(24);
        if max == 0 || max > card_max || actual == 0 || actual > max {
            return Err(fail(CmdStatus::BadParameter, synd::RQT_BAD_SIZE));
        }
        if rqtc::RQ_VHCA_ID_FORMAT.get(c) != 0 || rqtc::LIST_Q_TYPE.get(c) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::RQT_BAD_PARAM));
        }
        let n = table_bytes(actual as usize);
        let Some(t) = input.get(at..at + n) else {
            return Err(fail(CmdStatus::BadInputLength, synd::BAD_INPUT_LENGTH));
        };
        for e in t[rqtc::SIZE_BYTES..].chunks(rq_num::SIZE_BYTES) {
            known(
                &self.eth.rqs,
                rq_num::RQ_NUM.get(e) as u32,
                synd::RQT_BAD_RQ,
            )?;
        }
        Ok(t.to_vec())
    }

    pub(super) fn create_rqt(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use create_rqt_in as i;
        sized(input, outlen, i::SIZE_BYTES, create_rqt_out::SIZE_BYTES)?;
        self.check_uid(i::UID.get(input))?;
        let ctx = self.rqt_from(input, i::RQT_CONTEXT.off / 8)?;
        let max = limit(self.cap(cmd_hca_cap::LOG_MAX_RQT));
        let rqtn = free_number(&self.eth.rqts, 1, max, synd::RQT_EXHAUSTED)?;
        self.eth.rqts.insert(rqtn, Obj { ctx });
        let mut out = vec![0u8; create_rqt_out::SIZE_BYTES];
        create_rqt_out::RQTN.set(&mut out, u64::from(rqtn));
        Ok(out)
    }

    pub(super) fn modify_rqt(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use modify_rqt_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let rqtn = i::RQTN.get(input) as u32;
        let old = known(&self.eth.rqts, rqtn, synd::RQT_UNKNOWN)?;
        let m = &input[i::BITMASK.off / 8..][..rqt_bitmask::SIZE_BYTES];
        if rqt_bitmask::RQN_LIST.get(m) == 0 {
            return Ok(vec![0; 0x10]);
        }
        let at = i::CTX.off / 8;
        let c = &input[at..at + rqtc::SIZE_BYTES];
        // The table keeps the maximum it was created with.
        let max = rqtc::RQT_MAX_SIZE.get(&old.ctx);
        if rqtc::RQT_ACTUAL_SIZE.get(c) > max {
            return Err(fail(CmdStatus::BadParameter, synd::RQT_BAD_SIZE));
        }
        let mut patched = input.to_vec();
        rqtc::RQT_MAX_SIZE.at(at * 8).set(&mut patched, max);
        let ctx = self.rqt_from(&patched, at)?;
        self.eth.rqts.insert(rqtn, Obj { ctx });
        Ok(vec![0; 0x10])
    }

    pub(super) fn destroy_rqt(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use destroy_rqt_in as i;
        sized(input, outlen, i::SIZE_BYTES, 0x10)?;
        self.check_uid(i::UID.get(input))?;
        let rqtn = i::RQTN.get(input) as u32;
        known(&self.eth.rqts, rqtn, synd::RQT_UNKNOWN)?;
        let spreads_over = |t: &Obj| {
            tirc::DISP_TYPE.get(&t.ctx) == mlx5_hw::eth::TIRC_DISP_TYPE_INDIRECT
                && tirc::INDIRECT_TABLE.get(&t.ctx) as u32 == rqtn
        };
        if self.eth.tirs.values().any(spreads_over) {
            return Err(fail(CmdStatus::BadResourceState, synd::RQT_IN_USE));
        }
        self.eth.rqts.remove(&rqtn);
        Ok(vec![0; 0x10])
    }

    pub(super) fn query_rqt(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        use query_rqt_out as o;
        sized(input, outlen, query_rqt_in::SIZE_BYTES, o::SIZE_BYTES)?;
        let rqtn = query_rqt_in::RQTN.get(input) as u32;
        let t = known(&self.eth.rqts, rqtn, synd::RQT_UNKNOWN)?;
        let at = o::RQT_CONTEXT.off / 8;
        if outlen < at + t.ctx.len() {
            return Err(fail(CmdStatus::BadOutputLength, synd::BAD_OUTPUT_LENGTH));
        }
        let mut out = vec![0u8; at + t.ctx.len()];
        out[at..].copy_from_slice(&t.ctx);
        Ok(out)
    }
}
