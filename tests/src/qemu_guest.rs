//! The Debian trixie QEMU guest of `scripts/qemu-guest/build.sh` (issue
//! 17), cached outside the repo by content hash, for the tests that boot it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from(".."), Path::to_path_buf)
}

/// The cached guest, built now if missing and buildable (root, Debian's
/// registry reachable; about 7 minutes). The error says why there is none.
pub fn cached_or_built() -> Result<PathBuf, String> {
    let script = repo().join("scripts/qemu-guest/build.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("--path")
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.join("initrd.gz").is_file() {
        return Ok(path);
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "no cached guest at {} and building it needs root (scripts/qemu-guest/build.sh)",
            path.display()
        ));
    }
    println!("building the QEMU guest into {} (once)", path.display());
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() || !path.join("initrd.gz").is_file() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(format!(
            "no cached guest at {} and scripts/qemu-guest/build.sh failed ({}): {}",
            path.display(),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    Ok(path)
}

/// The lines of `console` that start with `prefix`, without it.
pub fn tagged<'a>(console: &'a str, prefix: &str) -> Vec<&'a str> {
    console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix(prefix))
        .collect()
}
