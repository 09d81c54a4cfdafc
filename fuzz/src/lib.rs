//! Coverage-guided fuzz targets over the project's real parsers and
//! engines, and the corpora they keep (`fuzz/corpus/<target>/`).
//!
//! Each target is a function over bytes that must never panic or hang,
//! whatever the bytes; it drives the component as its real peer does (a
//! vfio-user client, a driver, a device, a user on the command line):
//!
//! | target | what it feeds |
//! |---|---|
//! | `vfio_user` | a client's byte stream to the vfio-user server serving the model ([`vfio_user`]) |
//! | `cmd_engine` | command entries and mailbox chains to the model's command engine ([`cmd_engine`]) |
//! | `wqe` | send-queue bytes and doorbells to the model's data path ([`wqe`]) |
//! | `driver_decode` | command outputs, CQEs, EQEs and capability pages to the driver's decoders ([`driver_decode`]) |
//! | `prm_decode` | buffers to the PRM registry decoder and text to the trace codec ([`prm_decode`]) |
//! | `perf_flags` | argv to `mlx5-perf`'s flag parsing and checks ([`perf_flags`]) |
//!
//! `tests/corpora.rs` replays every corpus under `cargo test`;
//! `scripts/fuzz.sh` installs cargo-afl and fuzzes each target for a time
//! box (see docs/ARCHITECTURE.md, "Fuzzing").
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cmd_engine;
pub mod driver_decode;
pub mod perf_flags;
pub mod prm_decode;
pub mod rig;
pub mod seeds;
pub mod vfio_user;
pub mod wqe;

use std::path::PathBuf;

/// One fuzz target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Its name (the corpus directory's too).
    pub name: &'static str,
    /// Runs one input; panics on a defect.
    pub run: fn(&[u8]),
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "vfio_user",
        run: vfio_user::run,
    },
    Target {
        name: "cmd_engine",
        run: cmd_engine::run,
    },
    Target {
        name: "wqe",
        run: wqe::run,
    },
    Target {
        name: "driver_decode",
        run: driver_decode::run,
    },
    Target {
        name: "prm_decode",
        run: prm_decode::run,
    },
    Target {
        name: "perf_flags",
        run: perf_flags::run,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The corpus directory of target `name` in the source tree.
pub fn corpus_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name)
}
