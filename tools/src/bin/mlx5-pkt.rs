//! `mlx5-pkt`: testpmd-style packet forwarding over raw packet QPs
//! (`tools::pkt`). `mlx5-pkt rxonly` alone runs both ports here on two
//! cabled device-model functions.

use std::process::ExitCode;

use clap::Parser;
use tools::pkt::{run, Cli};

fn main() -> ExitCode {
    tools::init_tracing("warn");
    match run(&Cli::parse(), &mut std::io::stdout()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mlx5-pkt: {e}");
            ExitCode::FAILURE
        }
    }
}
