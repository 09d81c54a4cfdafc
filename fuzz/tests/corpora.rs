//! Every corpus replayed: each input the fuzzer kept (seeds, its finds and
//! the inputs of crashes fixed since) runs through its target again and
//! must neither panic nor hang.

use std::path::PathBuf;

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = mlx5_fuzz::corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: empty corpus", dir.display());
    files
}

/// A panic on any thread (the model's worker, the server's sessions)
/// ends the process, as it does under the fuzzer: a panic that only ended
/// a background thread would otherwise pass unseen.
fn abort_on_any_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            // The test harness captures the default hook's output and
            // loses it at the abort: the message straight to stderr too.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "aborting on a panic: {info}");
            std::process::abort();
        }));
    });
}

fn replay(target: &str) {
    abort_on_any_panic();
    let t = mlx5_fuzz::target(target).unwrap_or_else(|| panic!("no target {target}"));
    for f in inputs(target) {
        let data = std::fs::read(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        eprintln!("replay {target}: {}", f.display());
        (t.run)(&data);
    }
}

#[test]
fn vfio_user_corpus_replays() {
    replay("vfio_user");
}

#[test]
fn cmd_engine_corpus_replays() {
    replay("cmd_engine");
}

#[test]
fn wqe_corpus_replays() {
    replay("wqe");
}

#[test]
fn driver_decode_corpus_replays() {
    replay("driver_decode");
}

#[test]
fn prm_decode_corpus_replays() {
    replay("prm_decode");
}

#[test]
fn perf_flags_corpus_replays() {
    replay("perf_flags");
}

/// The corpora hold the current seeds (`mlx5-fuzz seeds` rewrites them).
#[test]
fn corpora_hold_every_seed() {
    for t in mlx5_fuzz::TARGETS {
        for (name, bytes) in mlx5_fuzz::seeds::seeds(t.name) {
            let p = mlx5_fuzz::corpus_dir(t.name).join(format!("seed-{name}"));
            let kept = std::fs::read(&p).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (run `cargo run -p mlx5-fuzz -- seeds`)",
                    p.display()
                )
            });
            assert!(
                kept == bytes,
                "{} differs from its seed (a layout or flag changed: run `cargo run -p mlx5-fuzz -- seeds`)",
                p.display()
            );
        }
    }
}
