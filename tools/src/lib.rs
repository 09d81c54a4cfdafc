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

/// Logs to stderr through `tracing`, filtered by `RUST_LOG` or else at
/// `default` (`"warn"`, `"info"`): what every program here starts with.
pub fn init_tracing(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
}
