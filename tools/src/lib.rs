//! The `mlx5` command-line tool's subcommands, as a library so tests can run
//! them without a process.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod caps;
pub mod cmd;
pub mod dev;
pub mod devinfo;
pub mod health;
pub mod layouts;
pub mod list;
pub mod perf;
pub mod pkt;
pub mod reset;
