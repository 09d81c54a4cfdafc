//! `mlx5 caps`: capability pages decoded field by field.

use std::fmt::Write;

use mlx5_hw::registry;
use verbs::caps::{CapPage, Caps};

/// Capability page names, the layout that decodes each, and where `Caps` keeps it.
pub const PAGES: &[(&str, &str)] = &[
    ("general", "cmd_hca_cap"),
    ("general_2", "cmd_hca_cap_2"),
    ("atomic", "atomic_caps"),
    ("roce", "roce_cap"),
    ("odp", "odp_cap"),
    ("device_mem", "device_mem_cap"),
];

fn page<'a>(caps: &'a Caps, name: &str) -> Option<&'a CapPage> {
    match name {
        "general" => Some(&caps.general),
        "general_2" => caps.general_2.as_ref(),
        "atomic" => caps.atomic.as_ref(),
        "roce" => caps.roce.as_ref(),
        "odp" => caps.odp.as_ref(),
        "device_mem" => caps.device_mem.as_ref(),
        _ => None,
    }
}

/// Decodes `which` (every page when `None`), current or max values.
pub fn render(caps: &Caps, which: Option<&str>, max: bool) -> Result<String, String> {
    if let Some(w) = which {
        if !PAGES.iter().any(|(n, _)| *n == w) {
            let names: Vec<&str> = PAGES.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "unknown capability page {w:?}: one of {}",
                names.join(", ")
            ));
        }
    }
    let mut o = String::new();
    for (name, layout) in PAGES {
        if which.is_some_and(|w| w != *name) {
            continue;
        }
        let Some(p) = page(caps, name) else {
            let _ = writeln!(o, "{name}: not offered by this device\n");
            continue;
        };
        let Some(info) = registry::layout(layout) else {
            continue;
        };
        let _ = writeln!(
            o,
            "{name} ({layout}, {}):",
            if max { "max" } else { "current" }
        );
        let bytes = if max { &p.max } else { &p.current };
        for f in registry::decode(info, bytes) {
            match (f.value, f.bytes) {
                (Some(v), _) => {
                    let _ = writeln!(o, "  {:<44} {v:#x}", f.path);
                }
                (None, Some(b)) => {
                    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                    let _ = writeln!(o, "  {:<44} {hex}", f.path);
                }
                _ => {}
            }
        }
        o.push('\n');
    }
    Ok(o)
}
