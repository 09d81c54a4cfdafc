//! `mlx5-perf`: perftest's benchmarks (`write_bw`, `read_lat`, ...) over
//! the user-space mlx5 driver. `mlx5-perf write_bw` alone runs both sides
//! here on two cabled device-model functions; `mlx5-perf write_bw -d DEV`
//! waits for a client, `mlx5-perf write_bw -d DEV HOST` is one.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tools::perf::params::{Flags, Params, Test};

#[derive(Parser, Debug)]
#[command(
    name = "mlx5-perf",
    version,
    about = "perftest-compatible RDMA benchmarks over the user-space mlx5 driver"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// RDMA WRITE bandwidth (ib_write_bw).
    #[command(name = "write_bw")]
    WriteBw(Flags),
    /// RDMA WRITE latency, half round trip (ib_write_lat).
    #[command(name = "write_lat")]
    WriteLat(Flags),
    /// RDMA READ bandwidth (ib_read_bw).
    #[command(name = "read_bw")]
    ReadBw(Flags),
    /// RDMA READ latency, round trip (ib_read_lat).
    #[command(name = "read_lat")]
    ReadLat(Flags),
    /// SEND bandwidth (ib_send_bw).
    #[command(name = "send_bw")]
    SendBw(Flags),
    /// SEND latency, half round trip (ib_send_lat).
    #[command(name = "send_lat")]
    SendLat(Flags),
    /// Atomic bandwidth (ib_atomic_bw).
    #[command(name = "atomic_bw")]
    AtomicBw(Flags),
    /// Atomic latency, round trip (ib_atomic_lat).
    #[command(name = "atomic_lat")]
    AtomicLat(Flags),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let (name, flags) = match cli.cmd {
        Cmd::WriteBw(f) => ("write_bw", f),
        Cmd::WriteLat(f) => ("write_lat", f),
        Cmd::ReadBw(f) => ("read_bw", f),
        Cmd::ReadLat(f) => ("read_lat", f),
        Cmd::SendBw(f) => ("send_bw", f),
        Cmd::SendLat(f) => ("send_lat", f),
        Cmd::AtomicBw(f) => ("atomic_bw", f),
        Cmd::AtomicLat(f) => ("atomic_lat", f),
    };
    let test = Test::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .expect("every subcommand is in Test::ALL");
    let r = Params::new(test, flags).and_then(|p| tools::perf::run(&p, &mut std::io::stdout()));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mlx5-perf {name}: {e}");
            ExitCode::FAILURE
        }
    }
}
