//! The `DEV` argument of every subcommand: which function to open.
//!
//! - `emu` or `emu:PROFILE` (`cx4`, `cx5`, `cx6`, `cx7`): the built-in device
//!   model, in this process. The default when `-d` is absent.
//! - `DDDD:BB:DD.F`: a PCI function bound to vfio-pci (kernel VFIO backend).
//! - `vfio-user:PATH`: a device served over vfio-user.

use std::sync::Arc;

use mlx5_emu::Profile;
use vfio::PciFunction;

/// A parsed `DEV`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dev {
    /// The built-in device model.
    Emu(Profile),
    /// A PCI address.
    Pci(String),
    /// A vfio-user socket.
    VfioUser(String),
}

impl Dev {
    /// Parses `DEV` (`None`: the built-in model, ConnectX-4).
    pub fn parse(s: Option<&str>) -> Result<Self, String> {
        let Some(s) = s else {
            return Ok(Dev::Emu(Profile::ConnectX4));
        };
        if s == "emu" {
            return Ok(Dev::Emu(Profile::ConnectX4));
        }
        if let Some(p) = s.strip_prefix("emu:") {
            let profile = match p.to_ascii_lowercase().as_str() {
                "cx4" | "connectx4" | "connectx-4" => Profile::ConnectX4,
                "cx5" | "connectx5" | "connectx-5" => Profile::ConnectX5,
                "cx6" | "connectx6" | "connectx-6" => Profile::ConnectX6,
                "cx7" | "connectx7" | "connectx-7" => Profile::ConnectX7,
                _ => {
                    return Err(format!(
                        "unknown device-model profile {p:?}: use cx4, cx5, cx6 or cx7"
                    ))
                }
            };
            return Ok(Dev::Emu(profile));
        }
        if let Some(p) = s.strip_prefix("vfio-user:") {
            return Ok(Dev::VfioUser(p.to_string()));
        }
        if is_pci_address(s) {
            return Ok(Dev::Pci(s.to_string()));
        }
        Err(format!(
            "{s:?} is not a device: use a PCI address (0000:3b:00.0), emu[:cx4|cx5|cx6|cx7] or vfio-user:PATH"
        ))
    }

    /// Opens the function.
    pub fn open(&self) -> Result<Arc<dyn PciFunction>, String> {
        match self {
            Dev::Emu(p) => Ok(Arc::new(mlx5_emu::emulated(*p))),
            Dev::Pci(a) => open_pci(a),
            Dev::VfioUser(p) => vfio::user::VfioUserFunction::connect(p)
                .map(|f| Arc::new(f) as Arc<dyn PciFunction>)
                .map_err(|e| format!("vfio-user:{p}: {e}")),
        }
    }
}

/// A Mellanox function bound to vfio-pci, through the kernel's VFIO
/// (iommufd cdev when the kernel has it, else the group): the driver runs
/// on it unchanged.
fn open_pci(addr: &str) -> Result<Arc<dyn PciFunction>, String> {
    let addr: vfio::kernel::PciAddress = addr.parse().map_err(|e: vfio::Error| e.to_string())?;
    let f = vfio::kernel::open(addr, &vfio::kernel::OpenOptions::default())
        .map_err(|e| e.to_string())?;
    let info = f.info();
    if crate::list::mlx5_name(info.vendor, info.device).is_none() {
        return Err(format!(
            "{addr}: is {:04x}:{:04x}, not a function mlx5 drives (`mlx5 list` shows them)",
            info.vendor, info.device
        ));
    }
    Ok(Arc::new(f))
}

/// `DDDD:BB:DD.F` in hex.
fn is_pci_address(s: &str) -> bool {
    let parts: Vec<&str> = s.split([':', '.']).collect();
    parts.len() == 4
        && [4, 2, 2, 1]
            .iter()
            .zip(&parts)
            .all(|(n, p)| p.len() == *n && p.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(Dev::parse(None).unwrap(), Dev::Emu(Profile::ConnectX4));
        assert_eq!(
            Dev::parse(Some("emu:cx6")).unwrap(),
            Dev::Emu(Profile::ConnectX6)
        );
        assert_eq!(
            Dev::parse(Some("0000:3b:00.0")).unwrap(),
            Dev::Pci("0000:3b:00.0".into())
        );
        assert_eq!(
            Dev::parse(Some("vfio-user:/tmp/x")).unwrap(),
            Dev::VfioUser("/tmp/x".into())
        );
        assert!(Dev::parse(Some("emu:cx9")).unwrap_err().contains("cx4"));
        assert!(Dev::parse(Some("mlx5_0")).is_err());
    }

    #[test]
    fn a_pci_address_goes_to_the_kernel_backend() {
        // No machine has this function: the kernel backend's sysfs check says so.
        let e = Dev::parse(Some("0000:ff:1f.7"))
            .unwrap()
            .open()
            .unwrap_err();
        assert!(e.contains("0000:ff:1f.7: no such PCI function"), "{e}");
    }
}
