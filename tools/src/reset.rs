//! `mlx5 reset -d DEV`: a function-level reset (VFIO_DEVICE_RESET on the
//! kernel backend; the device model's reset for `emu`).

use vfio::PciFunction;

/// Resets `func` and says so.
pub fn run(func: &dyn PciFunction) -> Result<String, String> {
    func.reset()
        .map_err(|e| format!("{}: reset failed: {e}", func.name()))?;
    Ok(format!("{}: function reset done", func.name()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use vfio::pci;

    #[test]
    fn resets_the_model() {
        let f = mlx5_emu::emulated(mlx5_emu::Profile::ConnectX4Lx);
        let cmd = pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER;
        f.config_write(pci::COMMAND, &cmd.to_le_bytes()).unwrap();
        let out = run(&f).unwrap();
        assert_eq!(out, "emu:cx4lx: function reset done");
        // A function-level reset clears the command register.
        let mut b = [0u8; 2];
        f.config_read(pci::COMMAND, &mut b).unwrap();
        assert_eq!(u16::from_le_bytes(b) & cmd, 0);
    }
}
