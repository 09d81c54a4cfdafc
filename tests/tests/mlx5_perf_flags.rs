//! `mlx5-perf` command lines a new user tries (issue 15): refused with a
//! message, never a panic, and the corrected ones run.

fn refused(args: &[&str], what: &str) {
    let mut out = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tools::perf::cli::main_with(args, &mut out)
    }));
    match r {
        Ok(Err(e)) => assert!(e.contains(what), "mlx5-perf {}: {e}", args.join(" ")),
        Ok(Ok(())) => panic!("mlx5-perf {} ran; expected a refusal", args.join(" ")),
        Err(_) => panic!("mlx5-perf {} panicked", args.join(" ")),
    }
}

fn runs(args: &[&str]) -> String {
    let mut out = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tools::perf::cli::main_with(args, &mut out)
    }));
    match r {
        Ok(Ok(())) => String::from_utf8(out).expect("text"),
        Ok(Err(e)) => panic!("mlx5-perf {}: {e}", args.join(" ")),
        Err(_) => panic!("mlx5-perf {} panicked", args.join(" ")),
    }
}

/// perftest: "Number of iterations must be a multiple of post list size".
#[test]
fn iterations_not_a_multiple_of_the_post_list_are_refused() {
    for args in [
        &["write_bw", "-l", "16"][..],
        &["atomic_bw", "-q", "3", "-l", "7", "-n", "50"],
        &["write_bw", "-b", "-l", "3", "-n", "10"],
    ] {
        refused(args, "multiple of the post list size");
    }
}

/// The same lists with a count that fits them run, also where the TX
/// depth is not a multiple of the list.
#[test]
fn post_lists_that_fit_the_iterations_run() {
    for args in [
        &["write_bw", "-l", "16", "-n", "160", "-s", "64"][..],
        &["atomic_bw", "-q", "3", "-l", "7", "-n", "49"],
        &["write_bw", "-b", "-l", "3", "-n", "12", "-s", "64"],
        &["write_bw", "-l", "3", "-n", "300", "-s", "64"],
    ] {
        let text = runs(args);
        assert!(text.contains("#bytes"), "{}: {text}", args.join(" "));
    }
}

/// `--use_udmabuf`: the buffers registered as a dma-buf. Where the host
/// has no udmabuf (the suite's hosts) the refusal names what is missing;
/// where it has one, the run completes through the dma-buf MRs (the QEMU
/// guest's kernel has one: qemu_mlx5's VFIO boot runs it there).
#[test]
fn use_udmabuf_runs_or_names_the_missing_exporter() {
    let args = &["write_bw", "--use_udmabuf", "-s", "4096", "-n", "50"];
    if std::path::Path::new("/dev/udmabuf").exists() {
        let text = runs(args);
        assert!(text.contains("#bytes"), "{text}");
    } else {
        refused(args, "no /dev/udmabuf");
    }
}
