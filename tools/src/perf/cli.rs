//! The `mlx5-perf` command line: one subcommand per perftest program, each
//! taking [`Flags`]. The binary and the tests both go through [`main_with`].

use std::io::Write;

use clap::{Parser, Subcommand};

use super::params::{Flags, Params, Test};

/// `mlx5-perf`.
#[derive(Parser, Debug)]
#[command(
    name = "mlx5-perf",
    version,
    about = "perftest-compatible RDMA benchmarks over the user-space mlx5 driver"
)]
pub struct Cli {
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

impl Cli {
    /// The program and its flags.
    pub fn into_parts(self) -> (&'static str, Flags) {
        match self.cmd {
            Cmd::WriteBw(f) => ("write_bw", f),
            Cmd::WriteLat(f) => ("write_lat", f),
            Cmd::ReadBw(f) => ("read_bw", f),
            Cmd::ReadLat(f) => ("read_lat", f),
            Cmd::SendBw(f) => ("send_bw", f),
            Cmd::SendLat(f) => ("send_lat", f),
            Cmd::AtomicBw(f) => ("atomic_bw", f),
            Cmd::AtomicLat(f) => ("atomic_lat", f),
        }
    }
}

/// Runs a parsed command line; the report goes to `out`.
pub fn run_cli(cli: Cli, out: &mut dyn Write) -> Result<(), String> {
    let (name, flags) = cli.into_parts();
    let test = Test::ALL
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| format!("{name}: no such program"))?;
    let p = Params::new(test, flags).map_err(|e| format!("{name}: {e}"))?;
    super::run(&p, out).map_err(|e| format!("{name}: {e}"))
}

/// Parses `args` (without the program name) and runs them.
pub fn main_with(args: &[&str], out: &mut dyn Write) -> Result<(), String> {
    let cli = Cli::try_parse_from(std::iter::once("mlx5-perf").chain(args.iter().copied()))
        .map_err(|e| e.to_string())?;
    run_cli(cli, out)
}
