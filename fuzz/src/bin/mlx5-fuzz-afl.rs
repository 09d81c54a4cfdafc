//! The AFL++ harness: `mlx5-fuzz-afl TARGET`, built by `cargo afl build`
//! and run under `cargo afl fuzz` (scripts/fuzz.sh), in persistent mode.

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    let Some(t) = mlx5_fuzz::target(&name) else {
        let names: Vec<&str> = mlx5_fuzz::TARGETS.iter().map(|t| t.name).collect();
        eprintln!("usage: mlx5-fuzz-afl TARGET (one of {})", names.join(", "));
        std::process::exit(2);
    };
    let run = t.run;
    afl::fuzz!(|data: &[u8]| run(data));
}
