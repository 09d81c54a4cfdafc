//! QUERY_ISSI / SET_ISSI: the interface step sequence id.

use mlx5_hw::ifc::{query_issi_out, set_issi_in};
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware, HcaState};

impl Firmware {
    pub(super) fn query_issi(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, query_issi_out::SIZE_BYTES)?;
        let mut out = vec![0u8; query_issi_out::SIZE_BYTES];
        query_issi_out::CURRENT_ISSI.set(&mut out, u64::from(self.issi));
        query_issi_out::SUPPORTED_ISSI_DW0.set(&mut out, u64::from(self.profile.supported_issi()));
        Ok(out)
    }

    pub(super) fn set_issi(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, set_issi_in::SIZE_BYTES, 0x10)?;
        if self.hca != HcaState::Enabled {
            return Err(fail(CmdStatus::BadSystemState, synd::ISSI_AFTER_INIT));
        }
        let issi = set_issi_in::CURRENT_ISSI.get(input);
        if issi >= 32 || self.profile.supported_issi() & (1 << issi) == 0 {
            return Err(fail(CmdStatus::BadParameter, synd::ISSI_UNSUPPORTED));
        }
        self.issi = issi as u16;
        Ok(vec![0; 0x10])
    }
}
