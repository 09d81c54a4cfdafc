//! The PRM contract lives in one place: `mlx5-hw`.
//!
//! Every PRM offset, size and layout the driver (`verbs`) and the device
//! model (`mlx5-emu`) use comes from `mlx5-hw` (the generated views of
//! `mlx5-hw/ifc/*.ifc` and the constants of `mlx5_hw::init`, `cqe`, `event`,
//! `qp`, `wqe`), so a layout mistake shows on both sides of every test
//! instead of hiding between two private copies. This test keeps it so: it
//! scans the non-test code of `verbs/src` and `mlx5-emu/src` for
//!
//! - a byte offset or size of their own: `const NAME: usize = <literal>;`
//!   (derive it from a view instead: `cqe64::OP_OWN.off / 8`,
//!   `offset_of!(CmdLayout, status_own)`, `init_seg::SIZE_BYTES`);
//! - literal byte indexing of a PRM structure: `e[0x3f]`, `b[0x200..]`,
//!   `be32(&b, 0x238)` (read the field through its view instead);
//!
//! and fails on any hit that [`ALLOWED`] does not name, with a reason. An
//! allow-list entry that no longer matches anything fails too, so the list
//! stays short and true.
//!
//! Test code (`#[cfg(test)]` modules at the end of a file, `tests.rs`,
//! `*_tests.rs`, `tests/` directories) is not scanned: golden bytes from
//! real traces belong there. `vfio` is not scanned: it holds PCI, VFIO and
//! vfio-user layouts, none of the PRM's.

use std::path::{Path, PathBuf};

use regex::Regex;

/// The trees whose code must take every PRM number from `mlx5-hw`.
const SCANNED: &[&str] = &["verbs/src", "mlx5-emu/src"];

/// Hits that are not PRM numbers: `(file, text on the line, why)`.
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "verbs/src/qp.rs",
        "pub const MAX_SGE: usize",
        "a limit the driver offers (ibv_qp_cap), not a device layout",
    ),
    (
        "verbs/src/qp.rs",
        "pub const MAX_INLINE: usize",
        "a limit the driver offers (ibv_qp_cap), not a device layout",
    ),
    (
        "verbs/src/raw_eth/mod.rs",
        "pub const MAX_EMPW_INLINE: usize",
        "the largest frame the driver copies into an eMPW WQE (DPDK's txq_inline_mpw): driver policy",
    ),
    (
        "verbs/src/dbrec.rs",
        "pub const DBREC_STRIDE: usize",
        "how far apart the driver places doorbell records (a cache line each, as Linux's mlx5_db_alloc): driver policy",
    ),
    (
        "verbs/src/pagealloc.rs",
        "pub const PAGES_PER_CMD: usize",
        "how many pages the driver puts in one MANAGE_PAGES: driver policy",
    ),
    (
        "mlx5-emu/src/transport/mod.rs",
        "const COUNTERS: usize",
        "how many data-path counters the model keeps across resets (Counters::all): model bookkeeping, not a device layout",
    ),
    (
        "mlx5-emu/src/vsc.rs",
        "pub const VSC_",
        "the PCI vendor-specific capability (Linux lib/pci_vsc.c): config space, not the PRM; the driver does not use it",
    ),
    (
        "mlx5-emu/src/config.rs",
        "",
        "the model's PCI configuration space (PCI spec offsets), not the PRM",
    ),
    (
        "mlx5-emu/src/lib.rs",
        "pub const TRAPPED_DOORBELLS_MAX: usize",
        "model bookkeeping capacity",
    ),
    (
        "verbs/src/umr.rs",
        "pub const UMR_INLINE_MTT_MAX: usize",
        "how much translation the driver puts inline in one UMR: driver policy (larger rereg takes a new key)",
    ),
    (
        "mlx5-emu/src/lib.rs",
        "pub const CMD_LOG_CAPACITY: usize",
        "model bookkeeping capacity",
    ),
    (
        "mlx5-emu/src/fw/reg.rs",
        "pub(crate) const NODE_DESC_BYTES: usize",
        "the NODE_DESC register's 64-byte text; mlx5_ifc.h has no register layout for it",
    ),
    (
        "mlx5-emu/src/transport/packet.rs",
        "",
        "Ethernet/IP/UDP and IBTA headers on the wire (header lengths), not the PRM",
    ),
    (
        "mlx5-emu/src/transport/mod.rs",
        "pub const GID_TABLE_LEN: usize",
        "the model's GID table size (reported through the caps)",
    ),
    (
        "mlx5-emu/src/transport/mod.rs",
        "const UAR_SCAN_CHUNK: usize",
        "how many UAR pages the model scans per pass",
    ),
    (
        "mlx5-emu/src/transport/mod.rs",
        "pub const SWEEP_CHUNK: usize",
        "how many doorbell records the model's sweep reads at a time",
    ),
    (
        "mlx5-emu/src/transport/mod.rs",
        "pub const TRAPPED_CQ_DOORBELLS_MAX: usize",
        "how many trapped CQ doorbells the model queues",
    ),
    (
        "mlx5-emu/src/wire/impair.rs",
        "pub const HELD_MAX: usize",
        "how many frames the wire's faults hold back (model policy)",
    ),
    (
        "mlx5-emu/src/wire/mod.rs",
        "pub const MAX_FRAME: usize",
        "the largest frame the wire takes from a socket (QEMU's netdev limit)",
    ),
    (
        "mlx5-emu/src/wire/mod.rs",
        "pub const MAILBOX_MAX: usize",
        "how many responses from the wire wait for their send queue",
    ),
    (
        "mlx5-emu/src/wire/mod.rs",
        "pub const WINDOW: usize",
        "RC messages in flight across the wire before the send queue waits",
    ),
    (
        "verbs/src/uffd.rs",
        "const MSG: usize",
        "the size of Linux's struct uffd_msg (userfaultfd), not a device layout",
    ),
];

/// One hit: file (relative to the workspace), line number, the line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hit {
    file: String,
    line: usize,
    text: String,
}

/// The patterns a PRM copy shows as.
struct Patterns {
    own_offset: Regex,
    literal_index: Regex,
}

impl Patterns {
    fn new() -> Self {
        Self {
            own_offset: Regex::new(
                r"\bconst\s+[A-Z][A-Z0-9_]*\s*:\s*usize\s*=\s*(0x[0-9a-fA-F_]+|[0-9][0-9_]*)\s*;",
            )
            .expect("offset pattern"),
            literal_index: Regex::new(
                r"\[\s*0x[0-9a-fA-F_]+\s*(\]|\.\.)|\bbe(16|32|64)\((?:[^()]|\([^()]*\))*,\s*0x[0-9a-fA-F_]+\s*\)",
            )
            .expect("index pattern"),
        }
    }

    /// The hits in one file's text: code lines up to its test module.
    fn scan(&self, file: &str, text: &str) -> Vec<Hit> {
        let mut hits = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("#[cfg(test)]") {
                break;
            }
            if t.starts_with("//") {
                continue;
            }
            if self.own_offset.is_match(line) || self.literal_index.is_match(line) {
                hits.push(Hit {
                    file: file.to_string(),
                    line: i + 1,
                    text: line.trim().to_string(),
                });
            }
        }
        hits
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every non-test `.rs` file under `dir`, relative to the workspace.
fn sources(dir: &str, out: &mut Vec<String>) {
    let root = workspace();
    let mut stack = vec![root.join(dir)];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for e in entries {
            let p = e.expect("directory entry").path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if p.is_dir() {
                if name != "tests" {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                let rel = p.strip_prefix(&root).expect("under the workspace");
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
}

fn allowed(h: &Hit) -> Option<usize> {
    ALLOWED
        .iter()
        .position(|(file, needle, _)| h.file == *file && h.text.contains(needle))
}

#[test]
fn no_prm_offsets_outside_mlx5_hw() {
    let pats = Patterns::new();
    let mut files = Vec::new();
    for dir in SCANNED {
        sources(dir, &mut files);
    }
    files.sort();
    assert!(
        files.iter().any(|f| f == "verbs/src/cmd.rs")
            && files.iter().any(|f| f == "mlx5-emu/src/cmdq.rs"),
        "the scan found the command queue code on neither side: {files:?}"
    );
    let mut used = vec![false; ALLOWED.len()];
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(workspace().join(f)).expect("source file");
        for h in pats.scan(f, &text) {
            match allowed(&h) {
                Some(i) => used[i] = true,
                None => bad.push(h),
            }
        }
    }
    let stale: Vec<_> = ALLOWED
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(a, _)| a)
        .collect();
    let mut msg = String::new();
    for h in &bad {
        msg.push_str(&format!(
            "{}:{}: a PRM offset or literal PRM indexing outside mlx5-hw: `{}`\n",
            h.file, h.line, h.text
        ));
    }
    for (file, needle, why) in &stale {
        msg.push_str(&format!(
            "allow-list entry matches nothing any more (remove it): {file} `{needle}` ({why})\n"
        ));
    }
    assert!(
        msg.is_empty(),
        "{msg}Take the number from mlx5-hw (a generated view or mlx5_hw::init/cqe/event/qp/wqe), \
         or add an ALLOWED entry that says why it is not a PRM number."
    );
    eprintln!(
        "prm_contract: {} files scanned, {} allowed hits",
        files.len(),
        used.iter().filter(|u| **u).count()
    );
}

/// The scanner itself: the copies this crate once had are found, derived
/// declarations and test modules are not.
#[test]
fn the_scan_finds_the_copies_that_were_removed() {
    let pats = Patterns::new();
    let copies = "\
mod ent {
    pub const STATUS_OWN: usize = 0x3f;
}
pub const INLINE: usize = 16;
fn f(e: &[u8], b: &[u8]) -> bool {
    let own = e[0x3f] & 1;
    let out = &e[0x20..0x30];
    be32(&b, 0x238) == 0 && own == 0 && out.is_empty()
}
let n = be32(b.as_bytes(), 0x238);
";
    let hits = pats.scan("verbs/src/cmd.rs", copies);
    let lines: Vec<usize> = hits.iter().map(|h| h.line).collect();
    assert_eq!(lines, [2, 4, 6, 7, 8, 10], "{hits:#?}");
    assert!(hits.iter().all(|h| allowed(h).is_none()));

    let derived = "\
const STATUS_OWN: usize = core::mem::offset_of!(CmdLayout, status_own);
const OP_OWN: usize = cqe64::OP_OWN.off / 8;
pub const ENTRY_SIZE: usize = hw::CMD_ENTRY_SIZE;
let x = v[i];
// e[0x3f] in a comment
#[cfg(test)]
mod tests {
    const GOLDEN: usize = 0x38;
    fn t(e: &[u8]) -> u8 { e[0x3f] }
}
";
    assert_eq!(pats.scan("verbs/src/cmd.rs", derived), []);
}

/// The driver's QP files, where QPC and WQE values are written.
const QP_FILES: &[&str] = &[
    "verbs/src/qp.rs",
    "verbs/src/wr.rs",
    "verbs/src/wqe.rs",
    "verbs/src/rq.rs",
    "verbs/src/wq.rs",
];

/// A QPC or WQE field set from a bare number (`.set_rq_type(3)`,
/// `.set_pm_state(3)`, `.set_atomic_mode(1)`) hides a PRM value the model
/// has to agree with: it must be a named `mlx5_hw::qp` / `mlx5_hw::wqe`
/// value. The one exception: `vhca_port_num(1)`, the port number of a
/// one-port function, which is not a PRM enum.
#[test]
fn qp_fields_are_set_from_named_prm_values() {
    let setter = Regex::new(r"\.set_([a-z_0-9]+)\(\s*(0x[0-9a-fA-F_]+|[1-9][0-9_]*)\s*\)")
        .expect("setter pattern");
    let mut bad = Vec::new();
    for f in QP_FILES {
        let text = std::fs::read_to_string(workspace().join(f))
            .unwrap_or_else(|e| panic!("{f}: {e} (update QP_FILES if the QP code moved)"));
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("#[cfg(test)]") {
                break;
            }
            for c in setter.captures_iter(line) {
                if &c[1] != "vhca_port_num" {
                    bad.push(format!("{f}:{}: `{}`", i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "a QP field set from a bare number; name it in mlx5_hw::qp or mlx5_hw::wqe:\n{}",
        bad.join("\n")
    );
    assert!(
        setter.is_match("q.set_rq_type(3); // MLX5_ZERO_LEN_RQ")
            && setter.is_match(".set_pm_state(0x3)")
            && !setter.is_match(".set_rq_type(ZERO_LEN_RQ)")
            && !setter.is_match(".set_pd(0)"),
        "the setter pattern"
    );
}
