//! The checks of a test binary with its own `main` (a guest boot that
//! yields many named results): each printed as libtest prints a test, a
//! skip never counted as a pass, and the exit status failing when a check
//! failed.

/// Counts of the checks printed so far.
#[derive(Debug, Default)]
pub struct Tally {
    /// Checks that held.
    pub passed: usize,
    /// Checks that failed.
    pub failed: usize,
    /// Checks that did not run (said why).
    pub skipped: usize,
}

impl Tally {
    /// Prints `name` as passed or failed with the reason.
    pub fn check(&mut self, name: &str, r: Result<(), String>) {
        match r {
            Ok(()) => {
                println!("test {name} ... ok");
                self.passed += 1;
            }
            Err(why) => {
                println!("test {name} ... FAILED: {why}");
                self.failed += 1;
            }
        }
    }

    /// A check that cannot run here, said loudly; not a pass.
    pub fn not_run(&mut self, name: &str, why: &str) {
        println!("test {name} ... NOT RUN: {why}");
        self.skipped += 1;
    }

    /// Every one of `checks` skipped for `why`, or failed when the run
    /// `required` them.
    pub fn skip_all(&mut self, checks: &[&str], why: &str, required: bool) {
        for c in checks {
            if required {
                self.check(c, Err(why.to_string()));
            } else {
                println!("test {c} ... skipped: {why}");
                self.skipped += 1;
            }
        }
    }

    /// Prints the summary line and exits 1 if a check failed.
    pub fn finish(&self, secs: f64) {
        println!(
            "\ntest result: {}. {} passed; {} failed; {} skipped; finished in {secs:.1}s",
            if self.failed == 0 { "ok" } else { "FAILED" },
            self.passed,
            self.failed,
            self.skipped
        );
        if self.failed > 0 {
            std::process::exit(1);
        }
    }
}
