//! `mlx5 devinfo -d ADDR` on a function mlx5 does not drive (issue 15):
//! refused by vendor and device, with no recipe to rebind it.

use std::os::unix::fs::symlink;
use std::path::PathBuf;

/// A fake sysfs with one device, laid out as the kernel does.
struct Fake {
    root: PathBuf,
}

impl Fake {
    fn new(addr: &str, id: (u16, u16), class: u32, driver: &str) -> Self {
        let root =
            std::env::temp_dir().join(format!("mlx5-fake-sysfs-{}-{addr}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let real = root.join("devices/pci0000:00").join(addr);
        std::fs::create_dir_all(&real).unwrap();
        std::fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
        std::fs::write(real.join("vendor"), format!("0x{:04x}\n", id.0)).unwrap();
        std::fs::write(real.join("device"), format!("0x{:04x}\n", id.1)).unwrap();
        std::fs::write(real.join("class"), format!("0x{class:06x}\n")).unwrap();
        symlink(&real, root.join("bus/pci/devices").join(addr)).unwrap();
        let drv = root.join("bus/pci/drivers").join(driver);
        std::fs::create_dir_all(&drv).unwrap();
        symlink(&drv, real.join("driver")).unwrap();
        let g = root.join("kernel/iommu_groups/3");
        std::fs::create_dir_all(g.join("devices")).unwrap();
        symlink(&g, real.join("iommu_group")).unwrap();
        symlink(&real, g.join("devices").join(addr)).unwrap();
        Fake { root }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

#[test]
fn a_virtio_disk_is_refused_without_a_rebind_recipe() {
    let fake = Fake::new("0000:00:02.0", (0x1af4, 0x1001), 0x010000, "virtio-pci");
    let e = tools::dev::open_pci_in("0000:00:02.0", Some(fake.root.clone())).unwrap_err();
    assert!(e.contains("1af4:1001"), "{e}");
    assert!(e.contains("not a function mlx5 drives"), "{e}");
    for recipe in ["vfio-pci", "unbind", "driver_override", "modprobe"] {
        assert!(
            !e.contains(recipe),
            "no rebind advice for a foreign device: {e}"
        );
    }
}

#[test]
fn a_connectx_bound_elsewhere_still_gets_the_recipe() {
    let fake = Fake::new("0000:00:03.0", (0x15b3, 0x1015), 0x020000, "mlx5_core");
    let e = tools::dev::open_pci_in("0000:00:03.0", Some(fake.root.clone())).unwrap_err();
    assert!(e.contains("mlx5_core") && e.contains("vfio-pci"), "{e}");
}
