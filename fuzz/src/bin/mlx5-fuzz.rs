//! Corpus tools without a fuzzer: `mlx5-fuzz seeds` writes every target's
//! seeds into its corpus; `mlx5-fuzz run TARGET FILE...` runs inputs (a
//! crash the fuzzer found, with a backtrace under RUST_BACKTRACE=1).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "mlx5-fuzz", about = "Seeds and replays of the fuzz targets")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Writes the seeds of every target (or of one) into fuzz/corpus/.
    Seeds {
        /// Only this target.
        #[arg(long)]
        target: Option<String>,
    },
    /// Runs TARGET on each FILE.
    Run {
        /// The target.
        target: String,
        /// Inputs.
        files: Vec<PathBuf>,
    },
    /// Lists the targets.
    List,
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::List => {
            for t in mlx5_fuzz::TARGETS {
                println!("{}", t.name);
            }
        }
        Cmd::Seeds { target } => {
            for t in mlx5_fuzz::TARGETS {
                if target.as_deref().is_some_and(|n| n != t.name) {
                    continue;
                }
                let dir = mlx5_fuzz::corpus_dir(t.name);
                if let Err(e) = std::fs::create_dir_all(&dir) {
                    eprintln!("{}: {e}", dir.display());
                    std::process::exit(1);
                }
                for (name, bytes) in mlx5_fuzz::seeds::seeds(t.name) {
                    let p = dir.join(format!("seed-{name}"));
                    if let Err(e) = std::fs::write(&p, bytes) {
                        eprintln!("{}: {e}", p.display());
                        std::process::exit(1);
                    }
                    println!("{}", p.display());
                }
            }
        }
        Cmd::Run { target, files } => {
            let Some(t) = mlx5_fuzz::target(&target) else {
                eprintln!("no target {target}");
                std::process::exit(2);
            };
            for f in files {
                match std::fs::read(&f) {
                    Ok(data) => {
                        eprintln!("{}: {} bytes", f.display(), data.len());
                        (t.run)(&data);
                    }
                    Err(e) => {
                        eprintln!("{}: {e}", f.display());
                        std::process::exit(1);
                    }
                }
            }
        }
    }
}
