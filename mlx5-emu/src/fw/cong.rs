//! QUERY_CONG_STATISTICS: the RoCE congestion-control counters (DCQCN's
//! reaction point and notification point), which mlx5_ib reads when
//! `cc_query_allowed` is set. The model's fabric never marks ECN and its
//! transport sends and handles no CNPs, so no flow is ever rate-limited:
//! every counter is 0 — what a ConnectX-4 reports on a lossless fabric with
//! no congestion. The sample's time stamp is the HCA clock.

use mlx5_hw::ifc::{cmd_hca_cap, query_cong_statistics_in, query_cong_statistics_out};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};

impl Firmware {
    pub(super) fn query_cong_statistics(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            query_cong_statistics_in::SIZE_BYTES,
            query_cong_statistics_out::SIZE_BYTES,
        )?;
        if self.cap(cmd_hca_cap::CC_QUERY_ALLOWED) == 0 {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        let mut out = vec![0u8; query_cong_statistics_out::SIZE_BYTES];
        let ns = self.hca_clock_ns();
        query_cong_statistics_out::TIME_STAMP_HIGH.set(&mut out, ns >> 32);
        query_cong_statistics_out::TIME_STAMP_LOW.set(&mut out, ns & 0xffff_ffff);
        Ok(out)
    }
}
