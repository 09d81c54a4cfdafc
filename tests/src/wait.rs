//! Waiting for what another thread does (the model's worker, the driver's
//! page worker or event loop): until it has happened, with a hang guard.
//!
//! Time in the suites is a `vfio::clock::ManualClock` where a timeout, a
//! delay or a poll interval matters: nothing there waits for time to pass.
//! What remains is waiting for real threads to get round to their work,
//! which on a loaded machine takes as long as it takes; [`HANG_GUARD`] only
//! turns a hang into a failure and is never the thing a test measures.

use std::time::{Duration, Instant};

/// How long a test waits for another thread before calling it a hang (a
/// machine saturated by other jobs has been seen to need a minute for a
/// suite that takes ten seconds alone).
pub const HANG_GUARD: Duration = Duration::from_secs(180);

/// Looks at `cond` until it holds (yielding, then pausing 1 ms between
/// looks); panics naming `what` if [`HANG_GUARD`] passes first.
pub fn until(what: &str, cond: impl FnMut() -> bool) {
    until_state(what, cond, String::new);
}

/// [`until`], and the panic after the hang guard shows `state()` (what the
/// test would need to know why nothing happened).
pub fn until_state(what: &str, mut cond: impl FnMut() -> bool, state: impl Fn() -> String) {
    let give_up = Instant::now() + HANG_GUARD;
    let mut looks = 0u32;
    while !cond() {
        assert!(
            Instant::now() < give_up,
            "{what}: did not happen within {HANG_GUARD:?} (hang guard); {}",
            state()
        );
        looks += 1;
        if looks < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
