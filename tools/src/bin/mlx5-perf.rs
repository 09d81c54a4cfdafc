//! `mlx5-perf`: perftest's benchmarks (`write_bw`, `read_lat`, ...) over
//! the user-space mlx5 driver. `mlx5-perf write_bw` alone runs both sides
//! here on two cabled device-model functions; `mlx5-perf write_bw -d DEV`
//! waits for a client, `mlx5-perf write_bw -d DEV HOST` is one.

use std::process::ExitCode;

use clap::Parser;
use tools::perf::cli::{run_cli, Cli};

fn main() -> ExitCode {
    tools::init_tracing("warn");
    match run_cli(Cli::parse(), &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mlx5-perf {e}");
            ExitCode::FAILURE
        }
    }
}
