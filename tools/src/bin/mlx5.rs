//! `mlx5`: inspect, bring up and exercise mlx5 functions from user space.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(name = "mlx5", version, about = "User-space mlx5 (ConnectX) driver tool")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the PRM layouts this build knows (every field's bit offset and width).
    Layouts {
        /// Print JSON: {"name": {"size": bits, "fields": {"field": [bit_offset, width]}}}.
        #[arg(long)]
        json: bool,
        /// Print only this layout (e.g. create_cq_in).
        name: Option<String>,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let out = match cli.cmd {
        Cmd::Layouts { json, name } => tools::layouts::run(json, name.as_deref()),
    };
    match out {
        Ok(text) => {
            use std::io::Write;
            // A closed pipe (`mlx5 layouts | head`) is not an error worth a panic.
            let _ = writeln!(std::io::stdout().lock(), "{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mlx5: {e}");
            ExitCode::FAILURE
        }
    }
}
