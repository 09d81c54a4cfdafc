//! Finding a PCI function in sysfs and checking that VFIO may take it.
//!
//! Before opening anything the backend reads `/sys/bus/pci/devices/ADDR`:
//! vendor and device IDs, the driver it is bound to, its IOMMU group and the
//! other devices of that group. VFIO hands out a group only when every
//! device in it is bound to vfio-pci (or a driver that leaves DMA to its
//! owner: pci-stub, pcieport) or to nothing, so each refusal names the
//! device in the way and the commands that move it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::{Error, Result};

/// A PCI address, `domain:bus:device.function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI segment (domain).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device (slot), 0..32.
    pub device: u8,
    /// Function, 0..8.
    pub function: u8,
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddress {
    type Err = Error;

    /// Parses `0000:3b:00.0` or `3b:00.0` (domain 0).
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::Setup {
            device: s.to_string(),
            problem: format!("not a PCI address ({why})"),
            fix: "write it as DOMAIN:BUS:DEVICE.FUNCTION in hex, e.g. 0000:3b:00.0".into(),
        };
        let (head, func) = s.rsplit_once('.').ok_or_else(|| bad("no '.FUNCTION'"))?;
        let parts: Vec<&str> = head.split(':').collect();
        let (dom, bus, dev) = match parts.as_slice() {
            [d, b, v] => (*d, *b, *v),
            [b, v] => ("0", *b, *v),
            _ => return Err(bad("expected DOMAIN:BUS:DEVICE")),
        };
        let hex = |x: &str, max: u32, what: &str| {
            u32::from_str_radix(x, 16)
                .ok()
                .filter(|v| *v <= max && !x.is_empty() && x.len() <= 4)
                .ok_or_else(|| bad(what))
        };
        Ok(PciAddress {
            domain: hex(dom, 0xffff, "domain")? as u16,
            bus: hex(bus, 0xff, "bus")? as u8,
            device: hex(dev, 0x1f, "device above 1f")? as u8,
            function: hex(func, 7, "function above 7")? as u8,
        })
    }
}

/// What sysfs says about one PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDeviceInfo {
    /// Its address.
    pub address: PciAddress,
    /// Vendor ID.
    pub vendor: u16,
    /// Device ID.
    pub device: u16,
    /// Class code (24 bits).
    pub class: u32,
    /// The driver it is bound to, if any.
    pub driver: Option<String>,
    /// Its IOMMU group, if it has one.
    pub iommu_group: Option<u32>,
}

impl PciDeviceInfo {
    /// Whether VFIO owns it (vfio-pci or a vendor variant like mlx5_vfio_pci).
    pub fn bound_to_vfio(&self) -> bool {
        self.driver.as_deref().is_some_and(is_vfio_driver)
    }
}

/// vfio-pci and its vendor variants (`mlx5_vfio_pci`, `vfio-pci-igd`, ...).
pub fn is_vfio_driver(name: &str) -> bool {
    name == "vfio-pci" || name.contains("vfio")
}

/// Drivers that leave a device's DMA to whoever owns its group
/// (`driver_managed_dma` in the kernel), so they do not block VFIO.
fn leaves_group_viable(name: &str) -> bool {
    is_vfio_driver(name) || name == "pci-stub" || name == "pcieport"
}

/// A sysfs tree (`/sys`, or a fake one in tests).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new("/sys")
    }
}

impl Sysfs {
    /// The sysfs mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn device_dir(&self, addr: PciAddress) -> PathBuf {
        self.root.join("bus/pci/devices").join(addr.to_string())
    }

    fn read_hex(path: &Path) -> Option<u32> {
        let s = std::fs::read_to_string(path).ok()?;
        let s = s.trim();
        u32::from_str_radix(s.strip_prefix("0x").unwrap_or(s), 16).ok()
    }

    fn link_name(path: &Path) -> Option<String> {
        let target = std::fs::read_link(path).ok()?;
        Some(target.file_name()?.to_string_lossy().into_owned())
    }

    /// Reads what sysfs says about `addr`.
    pub fn describe(&self, addr: PciAddress) -> Result<PciDeviceInfo> {
        let dir = self.device_dir(addr);
        let vendor = Self::read_hex(&dir.join("vendor")).ok_or_else(|| Error::Setup {
            device: addr.to_string(),
            problem: "no such PCI function".into(),
            fix: format!(
                "check the address: `ls {}` lists the functions this machine has",
                self.root.join("bus/pci/devices").display()
            ),
        })?;
        let device = Self::read_hex(&dir.join("device")).unwrap_or(0);
        let class = Self::read_hex(&dir.join("class")).unwrap_or(0);
        let driver = Self::link_name(&dir.join("driver"));
        let iommu_group =
            Self::link_name(&dir.join("iommu_group")).and_then(|g| g.parse::<u32>().ok());
        Ok(PciDeviceInfo {
            address: addr,
            vendor: vendor as u16,
            device: device as u16,
            class,
            driver,
            iommu_group,
        })
    }

    /// The devices of IOMMU group `group` and the drivers they are bound to.
    pub fn group_members(&self, group: u32) -> Vec<(String, Option<String>)> {
        let dir = self
            .root
            .join("kernel/iommu_groups")
            .join(group.to_string())
            .join("devices");
        let mut out: Vec<(String, Option<String>)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let driver = Self::link_name(&e.path().join("driver"));
                (name, driver)
            })
            .collect();
        out.sort();
        out
    }

    /// The VFIO device cdev name (`vfio3`) of `addr`, when the kernel has
    /// VFIO_DEVICE_CDEV.
    pub fn cdev_name(&self, addr: PciAddress) -> Option<String> {
        let dir = self.device_dir(addr).join("vfio-dev");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("vfio"))
            .collect();
        names.sort();
        names.into_iter().next()
    }

    /// Checks that VFIO may take `addr`: it exists, is bound to vfio-pci,
    /// has an IOMMU group, and every other device of the group is bound to
    /// vfio-pci, a driver that leaves DMA alone, or nothing. `expect`
    /// (vendor, device) refuses another function.
    pub fn check_for_vfio(
        &self,
        addr: PciAddress,
        expect: Option<(u16, u16)>,
    ) -> Result<PciDeviceInfo> {
        let info = self.describe(addr)?;
        let dev = self.device_dir(addr);
        let bind_cmds = format!(
            "echo vfio-pci > {d}/driver_override; echo {addr} > {p}/drivers_probe",
            d = dev.display(),
            p = self.root.join("bus/pci").display()
        );
        if let Some((v, d)) = expect {
            if (info.vendor, info.device) != (v, d) {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: format!(
                        "is {:04x}:{:04x}, not the {v:04x}:{d:04x} asked for",
                        info.vendor, info.device
                    ),
                    fix: "check the address (`mlx5 list` shows what is bound to vfio-pci)".into(),
                });
            }
        }
        match info.driver.as_deref() {
            Some(d) if is_vfio_driver(d) => {}
            Some(other) => {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: format!("is bound to {other}, not vfio-pci"),
                    fix: format!(
                        "as root: modprobe vfio-pci; echo {addr} > {d}/driver/unbind; {bind_cmds}",
                        d = dev.display()
                    ),
                })
            }
            None => {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: "is bound to no driver".into(),
                    fix: format!("as root: modprobe vfio-pci; {bind_cmds}"),
                })
            }
        }
        let Some(group) = info.iommu_group else {
            return Err(Error::Setup {
                device: addr.to_string(),
                problem: "has no IOMMU group".into(),
                fix: "turn the IOMMU on (boot with intel_iommu=on or amd_iommu=on, \
                      and VT-d/AMD-Vi in the firmware), or without an IOMMU load vfio \
                      with enable_unsafe_noiommu_mode=1 and ask for no-IOMMU mode"
                    .into(),
            });
        };
        for (member, driver) in self.group_members(group) {
            if member == addr.to_string() {
                continue;
            }
            if let Some(d) = driver.as_deref().filter(|d| !leaves_group_viable(d)) {
                return Err(Error::Setup {
                    device: addr.to_string(),
                    problem: format!(
                        "IOMMU group {group} also holds {member}, bound to {d}; VFIO needs \
                         every device of the group bound to vfio-pci or to no driver"
                    ),
                    fix: format!(
                        "as root: echo {member} > {r}/bus/pci/devices/{member}/driver/unbind \
                         (or bind it to vfio-pci too)",
                        r = self.root.display()
                    ),
                });
            }
        }
        Ok(info)
    }

    /// Every PCI function bound to a VFIO driver, by address.
    pub fn vfio_functions(&self) -> Vec<PciDeviceInfo> {
        let mut out: Vec<PciDeviceInfo> = std::fs::read_dir(self.root.join("bus/pci/devices"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<PciAddress>().ok())
            .filter_map(|a| self.describe(a).ok())
            .filter(PciDeviceInfo::bound_to_vfio)
            .collect();
        out.sort_by_key(|i| i.address);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fake sysfs: devices, drivers and IOMMU groups as the kernel lays them out.
    struct Fake {
        root: PathBuf,
    }

    impl Fake {
        fn new(tag: &str) -> Self {
            let root =
                std::env::temp_dir().join(format!("vfio-sysfs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
            Fake { root }
        }

        fn device(&self, addr: &str, id: (u16, u16), driver: Option<&str>, group: Option<u32>) {
            let real = self.root.join("devices/pci0000:00").join(addr);
            std::fs::create_dir_all(&real).unwrap();
            std::fs::write(real.join("vendor"), format!("0x{:04x}\n", id.0)).unwrap();
            std::fs::write(real.join("device"), format!("0x{:04x}\n", id.1)).unwrap();
            std::fs::write(real.join("class"), "0x020000\n").unwrap();
            symlink(&real, self.root.join("bus/pci/devices").join(addr)).unwrap();
            if let Some(d) = driver {
                let drv = self.root.join("bus/pci/drivers").join(d);
                std::fs::create_dir_all(&drv).unwrap();
                symlink(&drv, real.join("driver")).unwrap();
            }
            if let Some(g) = group {
                let gdir = self.root.join("kernel/iommu_groups").join(g.to_string());
                std::fs::create_dir_all(gdir.join("devices")).unwrap();
                symlink(&gdir, real.join("iommu_group")).unwrap();
                symlink(&real, gdir.join("devices").join(addr)).unwrap();
            }
        }

        fn sysfs(&self) -> Sysfs {
            Sysfs::new(&self.root)
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    fn addr(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_parse_and_print() {
        assert_eq!(addr("3b:00.1").to_string(), "0000:3b:00.1");
        assert_eq!(addr("0001:3B:1f.7").to_string(), "0001:3b:1f.7");
        for bad in [
            "",
            "3b:00",
            "3b:20.0",
            "3b:00.8",
            "x:00.0",
            "1:2:3:4.0",
            "12345:00:00.0",
        ] {
            let e = bad.parse::<PciAddress>().unwrap_err().to_string();
            assert!(e.contains("DOMAIN:BUS:DEVICE.FUNCTION"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_function_ready_for_vfio_passes() {
        let f = Fake::new("ok");
        f.device("0000:00:03.0", (0x15b3, 0x1013), Some("vfio-pci"), Some(7));
        f.device("0000:00:03.1", (0x15b3, 0x1013), None, Some(7));
        f.device("0000:00:01.0", (0x8086, 0x1234), Some("pcieport"), Some(7));
        let info = f
            .sysfs()
            .check_for_vfio(addr("0000:00:03.0"), Some((0x15b3, 0x1013)))
            .unwrap();
        assert_eq!(info.iommu_group, Some(7));
        assert_eq!(info.driver.as_deref(), Some("vfio-pci"));
        assert_eq!(
            f.sysfs()
                .vfio_functions()
                .iter()
                .map(|i| i.address)
                .collect::<Vec<_>>(),
            vec![addr("0000:00:03.0")]
        );
    }

    #[test]
    fn discovery_errors_say_what_to_do() {
        let f = Fake::new("errors");
        f.device("0000:00:04.0", (0x15b3, 0x1017), Some("mlx5_core"), Some(3));
        f.device("0000:00:05.0", (0x15b3, 0x1017), None, Some(4));
        f.device("0000:00:06.0", (0x15b3, 0x1017), Some("vfio-pci"), None);
        f.device("0000:00:07.0", (0x15b3, 0x1017), Some("vfio-pci"), Some(9));
        f.device("0000:00:07.1", (0x8086, 0x0001), Some("xhci_hcd"), Some(9));
        let s = f.sysfs();
        let err = |a: &str, expect| s.check_for_vfio(addr(a), expect).unwrap_err().to_string();

        let e = err("0000:00:09.0", None);
        assert!(
            e.contains("no such PCI function") && e.contains("ls "),
            "{e}"
        );
        let e = err("0000:00:04.0", None);
        assert!(e.contains("bound to mlx5_core"), "{e}");
        assert!(
            e.contains("0000:00:04.0/driver/unbind") && e.contains("driver_override"),
            "{e}"
        );
        let e = err("0000:00:05.0", None);
        assert!(
            e.contains("no driver") && e.contains("drivers_probe"),
            "{e}"
        );
        let e = err("0000:00:06.0", None);
        assert!(
            e.contains("no IOMMU group") && e.contains("intel_iommu=on"),
            "{e}"
        );
        assert!(e.contains("enable_unsafe_noiommu_mode"), "{e}");
        let e = err("0000:00:07.0", None);
        assert!(
            e.contains("group 9 also holds 0000:00:07.1, bound to xhci_hcd"),
            "{e}"
        );
        assert!(e.contains("0000:00:07.1/driver/unbind"), "{e}");
        let e = err("0000:00:07.0", Some((0x1234, 0x11e8)));
        assert!(e.contains("is 15b3:1017, not the 1234:11e8"), "{e}");
    }
}
