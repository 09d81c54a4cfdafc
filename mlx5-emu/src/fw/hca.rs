//! ENABLE_HCA / DISABLE_HCA / INIT_HCA / TEARDOWN_HCA / SET_DRIVER_VERSION,
//! and the fast teardown that completes when the driver writes
//! nic_interface = disabled.

use mlx5_hw::ifc::{
    disable_hca_in, disable_hca_out, enable_hca_in, enable_hca_out, init_hca_in,
    set_driver_version_in, teardown_hca_in, teardown_hca_out,
};
use mlx5_hw::init::TeardownProfile;
use mlx5_hw::status::CmdStatus;

use super::{fail, sized, synd, CmdResult, Firmware, HcaState};
use crate::Inner;

impl Firmware {
    pub(super) fn enable_hca(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            enable_hca_in::SIZE_BYTES,
            enable_hca_out::SIZE_BYTES,
        )?;
        if enable_hca_in::FUNCTION_ID.get(input) != 0
            || enable_hca_in::EMBEDDED_CPU_FUNCTION.get(input) != 0
        {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_FUNCTION_ID));
        }
        match self.hca {
            HcaState::Disabled | HcaState::FastTornDown => {
                self.hca = HcaState::Enabled;
                self.issi = 0;
                Ok(vec![0; enable_hca_out::SIZE_BYTES])
            }
            _ => Err(fail(CmdStatus::BadSystemState, synd::HCA_ALREADY_ENABLED)),
        }
    }

    pub(super) fn disable_hca(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(
            input,
            outlen,
            disable_hca_in::SIZE_BYTES,
            disable_hca_out::SIZE_BYTES,
        )?;
        if disable_hca_in::FUNCTION_ID.get(input) != 0 {
            return Err(fail(CmdStatus::BadParameter, synd::BAD_FUNCTION_ID));
        }
        match self.hca {
            HcaState::Initialized => Err(fail(
                CmdStatus::BadSystemState,
                synd::DISABLE_WHILE_INITIALIZED,
            )),
            HcaState::Disabled => Err(fail(CmdStatus::BadSystemState, synd::HCA_NOT_ENABLED)),
            _ => {
                if !self.pages.is_empty() {
                    tracing::warn!(
                        pages = self.pages.len(),
                        "DISABLE_HCA with pages still given to firmware"
                    );
                }
                self.hca = HcaState::Disabled;
                Ok(vec![0; disable_hca_out::SIZE_BYTES])
            }
        }
    }

    pub(super) fn init_hca(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, 0x10)?;
        let _ = init_hca_in::SIZE_BYTES;
        match self.hca {
            HcaState::Enabled => {}
            HcaState::Initialized => {
                return Err(fail(
                    CmdStatus::BadSystemState,
                    synd::HCA_ALREADY_INITIALIZED,
                ))
            }
            _ => return Err(fail(CmdStatus::BadSystemState, synd::HCA_NOT_ENABLED)),
        }
        let need = u64::from(self.profile.boot_pages()) + u64::from(self.profile.init_pages());
        if (self.pages.len() as u64) < need {
            tracing::debug!(
                held = self.pages.len(),
                need,
                "INIT_HCA before the init pages"
            );
            return Err(fail(CmdStatus::BadSystemState, synd::INIT_WITHOUT_PAGES));
        }
        self.hca = HcaState::Initialized;
        self.extra_demand = 0;
        self.port.oper_up = self.port.admin_up;
        self.port.eth_proto_oper = if self.port.oper_up {
            self.port.eth_proto_up
        } else {
            0
        };
        Ok(vec![0; 0x10])
    }

    pub(super) fn teardown_hca(
        &mut self,
        _inner: &Inner,
        input: &[u8],
        outlen: usize,
    ) -> CmdResult {
        sized(
            input,
            outlen,
            teardown_hca_in::SIZE_BYTES,
            teardown_hca_out::SIZE_BYTES,
        )?;
        let profile = TeardownProfile::from(teardown_hca_in::PROFILE.get(input) as u16);
        if self.hca != HcaState::Initialized {
            return Err(fail(CmdStatus::BadSystemState, synd::HCA_NOT_INITIALIZED));
        }
        let out = vec![0u8; teardown_hca_out::SIZE_BYTES];
        match profile {
            TeardownProfile::GracefulClose | TeardownProfile::ForceClose => {
                self.release_objects();
                self.hca = HcaState::TornDown;
            }
            TeardownProfile::PrepareFastTeardown => {
                // state 0: success; the teardown happens when the driver
                // writes nic_interface = disabled.
                self.fast_teardown_prepared = true;
            }
            _ => return Err(fail(CmdStatus::BadParameter, synd::BAD_TEARDOWN_PROFILE)),
        }
        Ok(out)
    }

    /// Objects die with the HCA.
    fn release_objects(&mut self) {
        let flow = self.steering.objects();
        let eth = self.eth.objects();
        if !self.eqs.is_empty() || !self.uars.is_empty() || flow != 0 || eth != 0 {
            tracing::warn!(
                eqs = self.eqs.len(),
                uars = self.uars.len(),
                flow_objects = flow,
                eth_objects = eth,
                "teardown with objects alive"
            );
        }
        self.leaked += (self.eqs.len() + self.uars.len() + flow + eth) as u64;
        self.steering = Default::default();
        self.eth = Default::default();
        self.devx = Default::default();
        self.memic.clear();
        self.eqs.clear();
        self.uars.clear();
        self.eq_db_last.clear();
        self.port.oper_up = false;
        self.port.eth_proto_oper = 0;
    }

    /// nic_interface = disabled was written.
    pub(super) fn fast_teardown(&mut self, _inner: &Inner) {
        if self.fast_teardown_prepared && self.hca == HcaState::Initialized {
            tracing::debug!(
                pages = self.pages.len(),
                "fast teardown: firmware lets go of its pages"
            );
            self.release_objects();
            self.pages.clear();
            self.fast_teardown_prepared = false;
            self.hca = HcaState::FastTornDown;
        } else {
            tracing::debug!("nic_interface disabled without a prepared fast teardown");
        }
    }

    pub(super) fn set_driver_version(&mut self, input: &[u8], outlen: usize) -> CmdResult {
        sized(input, outlen, 0x10, 0x10)?;
        let s = input
            .get(0x10..set_driver_version_in::SIZE_BYTES.min(input.len()))
            .unwrap_or(&[]);
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        self.driver_version = String::from_utf8_lossy(&s[..end]).into_owned();
        tracing::debug!(version = %self.driver_version, "driver version");
        Ok(vec![0; 0x10])
    }
}
