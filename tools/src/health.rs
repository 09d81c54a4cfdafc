//! `mlx5 health`: the decoded health buffer, read from the initialization
//! segment without bringing the function up (so it works on firmware that
//! is stuck initializing, the moment a bring-up engineer needs it).

use std::fmt::Write;

use mlx5_hw::health::HealthSyndrome;
use verbs::health::{HealthSnapshot, InitSegment};
use vfio::PciFunction;

/// `mlx5 health` on `func`: the init segment's firmware version and
/// `initializing`, then the health buffer; no command is sent.
pub fn report(func: &dyn PciFunction) -> Result<String, String> {
    let seg = InitSegment::read(func).map_err(|e| format!("{}: {e}", func.name()))?;
    let mut o = render(&seg.health, func.name());
    let _ = write!(
        o,
        "\nfw_rev:          {} (command interface {})\ninitializing:    {}",
        seg.fw,
        seg.cmdif_rev,
        if seg.initializing {
            "yes (firmware has not finished starting)"
        } else {
            "no"
        }
    );
    Ok(o)
}

/// The health buffer, decoded as the kernel's `print_health_info` does.
pub fn render(s: &HealthSnapshot, name: &str) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "device:          {name}");
    let b = &s.buffer;
    for (i, v) in b.assert_var.iter().enumerate() {
        let _ = writeln!(o, "assert_var[{i}]:   0x{:08x}", v.get());
    }
    let _ = writeln!(o, "assert_exit_ptr: 0x{:08x}", b.assert_exit_ptr.get());
    let _ = writeln!(o, "assert_callra:   0x{:08x}", b.assert_callra.get());
    let fw = s.fw_ver();
    let _ = writeln!(
        o,
        "fw_ver:          {}.{}.{}",
        fw >> 24,
        (fw >> 16) & 0xff,
        fw & 0xffff
    );
    let _ = writeln!(o, "hw_id:           0x{:08x}", b.hw_id.get());
    let _ = writeln!(o, "rfr:             {}", u8::from(s.rfr()));
    let _ = writeln!(o, "irisc_index:     {}", b.irisc_index);
    let synd = HealthSyndrome::from_raw(s.synd());
    let _ = writeln!(
        o,
        "synd:            0x{:x}: {}",
        s.synd(),
        if s.synd() == 0 { "none" } else { synd.name() }
    );
    let _ = writeln!(o, "ext_synd:        0x{:04x}", b.ext_synd.get());
    let _ = writeln!(o, "health_counter:  0x{:06x}", s.counter());
    let _ = writeln!(o, "nic_interface:   {}", s.nic_interface().to_raw());
    let _ = write!(
        o,
        "verdict:         {}",
        match s.fatal() {
            None => "healthy".to_string(),
            Some(c) => format!("FATAL: {c:?}"),
        }
    );
    o
}
