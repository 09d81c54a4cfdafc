//! PAGE_FAULT_RESUME: the driver answers a page fault the data path
//! raised (transport/odp.rs). The transport scheme's information
//! (`trans_page_fault_info`): the fault's token, its type and work queue
//! as the EQE named them (for an RDMA fault Linux sends the token as the
//! work queue), and `error`. The held queue then runs again (or fails).
//! Refused without `pg` (BAD_OPERATION), for a token no fault holds or a
//! type/work queue other than the fault's (BAD_PARAMETER).

use mlx5_hw::ifc::{
    cmd_hca_cap, page_fault_resume_in, page_fault_resume_out, trans_page_fault_info,
};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware};
use crate::transport::odp::ResumeError;
use crate::Inner;

/// Syndromes of a refused PAGE_FAULT_RESUME (stable values of this model).
pub(crate) mod odp_synd {
    /// No fault holds that token (or it was resumed already).
    pub const RESUME_UNKNOWN_TOKEN: u32 = 0x0d9f_0001;
    /// The token's fault has another type or work queue.
    pub const RESUME_MISMATCH: u32 = 0x0d9f_0002;
}

const INFO_AT: usize = page_fault_resume_in::PAGE_FAULT_INFO.off / 8;

impl Firmware {
    pub(super) fn page_fault_resume(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            page_fault_resume_in::SIZE_BYTES,
            page_fault_resume_out::SIZE_BYTES,
        )?;
        if self.cap(cmd_hca_cap::PG) == 0 {
            return Err(fail(CmdStatus::BadOperation, synd::BAD_OPCODE));
        }
        let info = &input[INFO_AT..];
        let token = trans_page_fault_info::FAULT_TOKEN.get(info) as u32;
        let ty = trans_page_fault_info::PAGE_FAULT_TYPE.get(info) as u8;
        let wq = trans_page_fault_info::WQ_NUMBER.get(info) as u32;
        let error = trans_page_fault_info::ERROR.get(info) != 0;
        match inner.rdma.odp.resume(token, ty, wq, error) {
            Ok(qpn) => {
                tracing::debug!(token, ty, wq, error, qpn, "PAGE_FAULT_RESUME");
                inner.rdma.attend(qpn);
                Ok(vec![0u8; page_fault_resume_out::SIZE_BYTES])
            }
            Err(ResumeError::UnknownToken) => Err(fail(
                CmdStatus::BadParameter,
                odp_synd::RESUME_UNKNOWN_TOKEN,
            )),
            Err(ResumeError::Mismatch) => {
                Err(fail(CmdStatus::BadParameter, odp_synd::RESUME_MISMATCH))
            }
        }
    }

    /// CREATE_EQ, then tells the data path whether an EQ takes
    /// page-fault events.
    pub(super) fn create_eq_odp(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        let r = self.create_eq(inner, input, outlen);
        self.odp_eq_changed(inner);
        r
    }

    /// DESTROY_EQ, then as [`Firmware::create_eq_odp`].
    pub(super) fn destroy_eq_odp(
        &mut self,
        inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        let r = self.destroy_eq(input, outlen);
        self.odp_eq_changed(inner);
        r
    }

    /// Tells the data path whether an EQ takes page-fault events.
    fn odp_eq_changed(&self, inner: &Inner) {
        let on = self.eq_for(mlx5_hw::event::EventType::PageFault).is_some();
        inner.rdma.odp.set_pf_eq(on);
    }
}
