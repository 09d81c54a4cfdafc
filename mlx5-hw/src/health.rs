//! Firmware health: the syndrome and severity firmware writes into the
//! initialization segment's health buffer (`MLX5_INITIAL_SEG_HEALTH_SYNDROME_*`
//! of mlx5_ifc.h, texts from Linux's `hsynd_str()` in core/health.c), and the
//! health counter a live firmware keeps incrementing.
//!
//! The `nic_interface` state that health polling also reads lives in
//! [`crate::init::NicInterface`].

use crate::macros::prm_enum;

/// Syndrome value meaning "no health issue" (health buffer `synd` is 0).
pub const HEALTH_SYNDROME_NONE: u8 = 0;

/// `health_buffer.fw_ver` reads as all ones when the PCI link is dead.
pub const HEALTH_FW_VER_DEAD: u32 = 0xffff_ffff;

/// Bit position of `rfr` (recovery flow required) in `rfr_severity`.
pub const RFR_BIT_OFFSET: u8 = 7;
/// Mask of the severity level in `rfr_severity`.
pub const SEVERITY_MASK: u8 = 0x7;
/// Bit of `rfr_severity` telling that the severity level is valid.
pub const SEVERITY_VALID_MASK: u8 = 0x8;

/// Mask of the free-running counter in the `health_counter` dword (iseg 0x1010).
pub const HEALTH_COUNTER_MASK: u32 = 0x00ff_ffff;
/// Shift of the health syndrome byte in the `health_counter` dword.
pub const HEALTH_COUNTER_SYNDROME_SHIFT: u32 = 24;

/// Unchanged health-counter polls in a row after which Linux declares firmware stuck.
pub const HEALTH_MAX_MISSES: u32 = 3;
/// Linux's health poll interval, in milliseconds.
pub const HEALTH_POLL_INTERVAL_MS: u32 = 2000;

prm_enum! {
    /// Health syndrome: `health_buffer.synd` (iseg 0x23d), nonzero once
    /// firmware hits a fatal error.
    pub enum HealthSyndrome: u8, unknown = "unrecognized error" {
        /// Firmware internal error.
        FwInternalError = 0x01 => "firmware internal error",
        /// An internal processor (irisc) stopped responding.
        DeadIrisc = 0x07 => "irisc not responding",
        /// Unrecoverable hardware error.
        HwFatalError = 0x08 => "unrecoverable hardware error",
        /// Firmware image CRC error.
        FwCrcError = 0x09 => "firmware CRC error",
        /// PCI error while fetching ICM.
        IcmFetchPciError = 0x0a => "ICM fetch PCI error",
        /// ICM page error (`ICM_PAGE_ERR`; Linux's text ends in a stray newline, dropped here).
        IcmPageError = 0x0b => "HW fatal error",
        /// An asynchronous EQ overflowed.
        AsyncEqBufferOverrun = 0x0c => "async EQ buffer overrun",
        /// An EQ is in the error state.
        EqInError = 0x0d => "EQ error",
        /// An invalid EQ was referenced.
        EqInvalid = 0x0e => "Invalid EQ referenced",
        /// FFSER error.
        FfserError = 0x0f => "FFSER error",
        /// The device is over temperature.
        HighTemperature = 0x10 => "High temperature",
        /// ICM fetch returned poisoned PCI data.
        IcmPciPoisoned = 0x12 => "ICM fetch PCI data poisoned error",
    }
}

prm_enum! {
    /// Severity of a health event: `rfr_severity & 7` when the valid bit is
    /// set; the values are Linux log levels.
    pub enum HealthSeverity: u8, unknown = "Unknown log level" {
        /// System is unusable.
        Emergency = 0 => "EMERGENCY",
        /// Action must be taken immediately.
        Alert = 1 => "ALERT",
        /// Critical condition.
        Critical = 2 => "CRITICAL",
        /// Error condition (also the default when the valid bit is clear).
        Error = 3 => "ERROR",
        /// Warning condition.
        Warning = 4 => "WARNING",
        /// Normal but significant condition.
        Notice = 5 => "NOTICE",
        /// Informational.
        Info = 6 => "INFO",
        /// Debug-level message.
        Debug = 7 => "DEBUG",
    }
}

/// Whether `rfr_severity` (health buffer 0x38) asks for the recovery flow.
pub const fn rfr(rfr_severity: u8) -> bool {
    rfr_severity >> RFR_BIT_OFFSET != 0
}

/// Severity level of `rfr_severity`; `Error` when firmware marked it invalid
/// (as Linux does).
pub const fn severity(rfr_severity: u8) -> HealthSeverity {
    if rfr_severity & SEVERITY_VALID_MASK != 0 {
        HealthSeverity::from_raw(rfr_severity & SEVERITY_MASK)
    } else {
        HealthSeverity::Error
    }
}

/// The counter bits of a `health_counter` read.
pub const fn health_counter(reg: u32) -> u32 {
    reg & HEALTH_COUNTER_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndromes_match_mlx5_ifc_h() {
        assert_eq!(HealthSyndrome::FwInternalError.to_raw(), 0x1);
        assert_eq!(HealthSyndrome::DeadIrisc.to_raw(), 0x7);
        assert_eq!(HealthSyndrome::HighTemperature.to_raw(), 0x10);
        assert_eq!(HealthSyndrome::IcmPciPoisoned.to_raw(), 0x12);
        assert_eq!(
            HealthSyndrome::from(0x0cu8).name(),
            "async EQ buffer overrun"
        );
        assert_eq!(
            HealthSyndrome::EqInvalid.to_string(),
            "Invalid EQ referenced(0xe)"
        );
        assert_eq!(
            HealthSyndrome::from(0x11u8).to_string(),
            "unrecognized error(0x11)"
        );
        for s in HealthSyndrome::ALL {
            assert_eq!(HealthSyndrome::from(u8::from(*s)), *s);
            assert!(!s.name().ends_with('\n'));
        }
    }

    #[test]
    fn rfr_and_severity() {
        assert!(rfr(0x80));
        assert!(!rfr(0x7f));
        assert_eq!(severity(0x8 | 2), HealthSeverity::Critical);
        assert_eq!(severity(0x2), HealthSeverity::Error);
        assert_eq!(severity(0x80 | 0x8 | 7).name(), "DEBUG");
        assert_eq!(health_counter(0xab12_3456), 0x12_3456);
    }
}
