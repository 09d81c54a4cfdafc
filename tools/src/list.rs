//! `mlx5 list`: the functions this tool can open: PCI functions bound to
//! vfio-pci (address, vendor:device, IOMMU group, whether mlx5 drives it)
//! and the built-in device model's profiles.

use std::fmt::Write;

use mlx5_emu::Profile;
use vfio::kernel::{PciDeviceInfo, Sysfs};

/// Mellanox's PCI vendor ID.
pub const MELLANOX: u16 = 0x15b3;

/// The mlx5 name of a device ID, as Linux 6.12's mlx5_core PCI table lists
/// them (`drivers/net/ethernet/mellanox/mlx5/core/main.c`), `None` if
/// mlx5 does not drive it.
pub fn mlx5_name(vendor: u16, device: u16) -> Option<&'static str> {
    if vendor != MELLANOX {
        return None;
    }
    Some(match device {
        0x1011 => "Connect-IB",
        0x1012 => "Connect-IB VF",
        0x1013 => "ConnectX-4",
        0x1014 => "ConnectX-4 VF",
        0x1015 => "ConnectX-4 Lx",
        0x1016 => "ConnectX-4 Lx VF",
        0x1017 => "ConnectX-5",
        0x1018 => "ConnectX-5 VF",
        0x1019 => "ConnectX-5 Ex",
        0x101a => "ConnectX-5 Ex VF",
        0x101b => "ConnectX-6",
        0x101c => "ConnectX-6 VF",
        0x101d => "ConnectX-6 Dx",
        0x101e => "ConnectX VF",
        0x101f => "ConnectX-6 Lx",
        0x1021 => "ConnectX-7",
        0x1023 => "ConnectX-8",
        0x1025 => "ConnectX-9",
        0x1027 => "ConnectX-10",
        0x2101 => "ConnectX-10 NVLink-C2C",
        0xa2d2 => "BlueField ConnectX-5",
        0xa2d3 => "BlueField ConnectX-5 VF",
        0xa2d6 => "BlueField-2 ConnectX-6 Dx",
        0xa2dc => "BlueField-3 ConnectX-7",
        0xa2df => "BlueField-4 ConnectX-8",
        _ => return None,
    })
}

/// The table: `functions` (from sysfs) first, then the device model.
pub fn render(functions: &[PciDeviceInfo]) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<14} {:<11} {:<6} {:<10} MLX5",
        "DEV", "ID", "GROUP", "DRIVER"
    );
    for f in functions {
        let _ = writeln!(
            o,
            "{:<14} {:<11} {:<6} {:<10} {}",
            f.address.to_string(),
            format!("{:04x}:{:04x}", f.vendor, f.device),
            f.iommu_group.map_or("-".to_string(), |g| g.to_string()),
            f.driver.as_deref().unwrap_or("-"),
            mlx5_name(f.vendor, f.device).unwrap_or("no")
        );
    }
    for p in Profile::ALL {
        let dev = format!("emu:{}", p.short());
        let _ = writeln!(
            o,
            "{:<14} {:<11} {:<6} {:<10} {} (device model)",
            dev,
            format!("{MELLANOX:04x}:{:04x}", p.device_id()),
            "-",
            "-",
            p.name()
        );
    }
    o.trim_end().to_string()
}

/// `mlx5 list` on this machine's sysfs.
pub fn run() -> String {
    render(&Sysfs::default().vfio_functions())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_bound_functions_then_the_model() {
        let f = PciDeviceInfo {
            address: "0000:3b:00.1".parse().unwrap(),
            vendor: 0x15b3,
            device: 0x1017,
            class: 0x020000,
            driver: Some("vfio-pci".into()),
            iommu_group: Some(42),
        };
        let other = PciDeviceInfo {
            address: "0000:00:03.0".parse().unwrap(),
            vendor: 0x1234,
            device: 0x11e8,
            driver: Some("vfio-pci".into()),
            iommu_group: None,
            ..f.clone()
        };
        let out = render(&[f, other]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("DEV"));
        assert!(lines[1].starts_with("0000:3b:00.1   15b3:1017   42     vfio-pci   ConnectX-5"));
        assert!(lines[2].starts_with("0000:00:03.0   1234:11e8   -      vfio-pci   no"));
        assert!(lines[3].starts_with("emu:cx4lx      15b3:1015   -"));
        assert!(lines[6].contains("ConnectX-7 (device model)"));
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn mlx5_ids_follow_the_kernel_table() {
        assert_eq!(mlx5_name(0x15b3, 0x1013), Some("ConnectX-4"));
        assert_eq!(mlx5_name(0x15b3, 0xa2dc), Some("BlueField-3 ConnectX-7"));
        assert_eq!(mlx5_name(0x15b3, 0x1003), None, "ConnectX-3 is mlx4");
        assert_eq!(mlx5_name(0x8086, 0x1013), None);
    }
}
