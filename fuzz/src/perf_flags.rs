//! `mlx5-perf`'s command line: clap's parse of an argv built from the
//! input, then [`Params::new`]'s checks and defaults, exactly as the binary
//! runs them before it opens a device.
//!
//! Input: the arguments after the program name, separated by NUL bytes
//! (invalid UTF-8 replaced, at most [`MAX_ARGS`] of them).

use tools::perf::cli::Cli;
use tools::perf::params::{Params, Test};

/// Arguments taken from one input at most.
pub const MAX_ARGS: usize = 64;

/// Runs one input.
pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let args: Vec<&str> = text.split('\0').take(MAX_ARGS).collect();
    // `try_parse_from` never prints or exits: --help and --version come back
    // as errors too.
    let Ok(cli) = <Cli as clap::Parser>::try_parse_from(
        std::iter::once("mlx5-perf").chain(args.iter().copied()),
    ) else {
        return;
    };
    let (name, flags) = cli.into_parts();
    let Some(test) = Test::ALL.iter().find(|(n, _)| *n == name).map(|(_, t)| *t) else {
        panic!("clap accepted a program {name} that Test::ALL lacks");
    };
    if let Ok(p) = Params::new(test, flags) {
        let _ = p.json_file();
        let _ = format!("{p:?}");
    }
}
