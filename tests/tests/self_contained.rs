//! The suite needs nothing beside the clone (issue 15): the firmware trace
//! it replays is in the repo, and no test source reaches out of it.

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .canonicalize()
        .unwrap()
}

#[test]
fn the_trace_is_in_the_repo_with_its_provenance() {
    let t = tests::connectx4_trace_in_repo().canonicalize().unwrap();
    assert!(
        t.starts_with(workspace()),
        "{} is outside the clone",
        t.display()
    );
    let readme = std::fs::read_to_string(t.with_file_name("README.md")).unwrap();
    assert!(readme.contains("Snabb") && readme.contains("Apache-2.0"));
    assert!(!tests::connectx4_trace().is_empty());
}

/// No test source names a path above the workspace (the shared folder
/// beside the clone, the machine's `/work`).
#[test]
fn no_test_reads_beside_the_clone() {
    let root = workspace().join("tests");
    let mut bad = Vec::new();
    for dir in ["src", "tests", "src/bin"] {
        for e in std::fs::read_dir(root.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "rs")
                && p.file_name().is_some_and(|n| n != "self_contained.rs")
            {
                let text = std::fs::read_to_string(&p).unwrap();
                // Spelled in pieces, so that this file does not name them.
                let shared = concat!("..", "/", "shared");
                for needle in [shared, "/../../", "\"/work/"] {
                    if text.contains(needle) {
                        bad.push(format!("{} names {needle}", p.display()));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
