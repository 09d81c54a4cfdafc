//! The `DEV` argument of every subcommand: which function to open.
//!
//! - `emu` or `emu:PROFILE` (`cx4lx`, `cx5`, `cx6`, `cx7`): the built-in device
//!   model, in this process. The default when `-d` is absent.
//! - `DDDD:BB:DD.F`: a PCI function bound to vfio-pci (kernel VFIO backend).
//! - `vfio-user:PATH`: a device served over vfio-user.

use std::sync::Arc;

use mlx5_emu::Profile;
use verbs::device::{DevSpec, Provider};
use vfio::PciFunction;

/// A parsed `DEV`, with the device model's profile resolved.
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
    /// Parses `DEV` (`None`: the built-in model, the traced ConnectX-4 Lx). The syntax is
    /// `verbs::device::DevSpec`'s, so the tools and verbs programs agree.
    pub fn parse(s: Option<&str>) -> Result<Self, String> {
        let spec = DevSpec::parse(s).map_err(|e| match s {
            Some(s) => format!("{s:?}: {e}"),
            None => e.to_string(),
        })?;
        Self::from_spec(&spec)
    }

    /// Resolves a parsed `DevSpec` (the profile of `emu:PROFILE`).
    pub fn from_spec(spec: &DevSpec) -> Result<Self, String> {
        Ok(match spec {
            DevSpec::Emu(p) => Dev::Emu(profile(p)?),
            DevSpec::Pci(a) => Dev::Pci(a.clone()),
            DevSpec::VfioUser(p) => Dev::VfioUser(p.clone()),
        })
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

/// The device-model profile `emu:NAME` names (`""`: the traced ConnectX-4 Lx).
fn profile(name: &str) -> Result<Profile, String> {
    Ok(match name {
        "" | "cx4lx" | "cx4" | "connectx4lx" | "connectx-4lx" => Profile::ConnectX4Lx,
        "cx5" | "connectx5" | "connectx-5" => Profile::ConnectX5,
        "cx6" | "connectx6" | "connectx-6" => Profile::ConnectX6,
        "cx7" | "connectx7" | "connectx-7" => Profile::ConnectX7,
        _ => {
            return Err(format!(
                "unknown device-model profile {name:?}: use cx4lx, cx5, cx6 or cx7"
            ))
        }
    })
}

/// The tools' [`Provider`]: lets `verbs::device::device_list` open every
/// `DEV` form, the device model included (verbs itself never links it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tools;

impl Provider for Tools {
    fn open(&self, spec: &DevSpec) -> verbs::Result<Arc<dyn PciFunction>> {
        Dev::from_spec(spec)
            .and_then(|d| d.open())
            .map_err(verbs::Error::Open)
    }
}

/// A Mellanox function bound to vfio-pci, through the kernel's VFIO
/// (iommufd cdev when the kernel has it, else the group): the driver runs
/// on it unchanged.
fn open_pci(addr: &str) -> Result<Arc<dyn PciFunction>, String> {
    open_pci_in(addr, None)
}

/// Opens the PCI function at `addr` (as `-d` names it) with sysfs at `sysfs_root` (`None`: `/sys`). Vendor and
/// device are checked first: a function mlx5 does not drive is refused
/// without any advice to rebind it.
pub fn open_pci_in(
    addr: &str,
    sysfs_root: Option<std::path::PathBuf>,
) -> Result<Arc<dyn PciFunction>, String> {
    let addr: vfio::kernel::PciAddress = addr.parse().map_err(|e: vfio::Error| e.to_string())?;
    let opts = vfio::kernel::OpenOptions {
        sysfs_root,
        accept: Some(vfio::kernel::Accept {
            id: |v, d| crate::list::mlx5_name(v, d).is_some(),
            what: "a function mlx5 drives (a Mellanox ConnectX; `mlx5 list` shows them)",
        }),
        ..vfio::kernel::OpenOptions::default()
    };
    let f = vfio::kernel::open(addr, &opts).map_err(|e| e.to_string())?;
    Ok(Arc::new(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form() {
        assert_eq!(Dev::parse(None).unwrap(), Dev::Emu(Profile::ConnectX4Lx));
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
        assert!(Dev::parse(Some("emu:cx9")).unwrap_err().contains("cx4lx"));
        assert_eq!(
            Dev::parse(Some("emu")).unwrap(),
            Dev::Emu(Profile::ConnectX4Lx)
        );
        assert!(Dev::parse(Some("mlx5_0")).is_err());
    }

    #[test]
    fn verbs_device_list_opens_the_model_through_the_tools_provider() {
        let devs = verbs::device::device_list(&["emu:cx5"], &Tools).unwrap();
        assert_eq!(devs.len(), 1);
        assert_eq!(devs[0].name(), "emu:cx5");
        let e = verbs::device::device_list(&["emu:cx9"], &Tools).unwrap_err();
        assert!(
            e.to_string().contains("unknown device-model profile"),
            "{e}"
        );
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
