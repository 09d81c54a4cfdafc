//! Time as an input: the clock a driver and a device model are handed.
//!
//! Everything in the driver (`verbs`) and the model (`mlx5-emu`) that
//! measures time (command and bring-up timeouts, the health poll interval,
//! firmware start-up delays, ACK timeouts and RNR retries) reads a
//! [`Clock`] it was given instead of `Instant::now()`. Two exist:
//!
//! - [`SystemClock`], the monotonic clock, the default everywhere;
//! - [`ManualClock`], for tests: it stands still until the test advances it,
//!   so a timeout fires exactly when the test says and never because the
//!   machine was busy. Waits on it wake when it is advanced.
//!
//! Time is still a [`std::time::Instant`] (the manual clock counts from the
//! instant it was made), so deadlines and durations keep their usual types.
//!
//! A wait with a deadline is a [`Deadline`]: while one lives, the manual
//! clock lists it ([`ManualClock::wait_armed`]), which is how a test knows
//! the code under test has started waiting before it moves time past the
//! deadline. Two kinds of wait exist and both keep their deadline on the
//! clock:
//!
//! - between two looks at device memory (a poll), [`Deadline::pause`]
//!   parks the thread for at most a short real-time pause (the poll's pace,
//!   which measures nothing) or until the clock passes the deadline;
//! - on a condition variable or a channel, [`Deadline::slice`] says how long
//!   the wait may block in real time before it must look at the clock again.
//!
//! No crate offers this: `quanta`'s and `mock_instant`'s mocks move time but
//! cannot wake a thread waiting for it, nor say who waits.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A source of time that can also park a thread until a deadline.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time on this clock.
    fn now(&self) -> Instant;

    /// Parks the calling thread until this clock reads `deadline`, for at
    /// most `most` of real time. Returns earlier when the thread is
    /// unparked ([`Thread::unpark`]) or spuriously: callers re-check what
    /// they wait for.
    fn park_until(&self, deadline: Instant, most: Duration);

    /// How long a wait on something else (a condition variable, a channel)
    /// may block in real time, at most `most`, before it must look at this
    /// clock again to see `deadline` pass. Zero once it has passed.
    fn slice(&self, deadline: Instant, most: Duration) -> Duration;

    /// Records that a wait until `at` has begun (`what` names it);
    /// returns a token for [`Clock::disarm`]. Only a clock a test drives
    /// keeps the record.
    fn arm(&self, _at: Instant, _what: &'static str) -> u64 {
        0
    }

    /// The wait of [`Clock::arm`]'s token is over.
    fn disarm(&self, _token: u64) {}
}

/// A clock shared by the threads of a driver or a model.
pub type SharedClock = Arc<dyn Clock>;

/// The monotonic clock, as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// `start + d`, or a year on if that overflows (an absurd timeout is a
/// long one, never a panic).
pub fn later(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .or_else(|| start.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(start)
}

/// The monotonic clock (`Instant::now()`).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn park_until(&self, deadline: Instant, most: Duration) {
        let d = self.slice(deadline, most);
        if !d.is_zero() {
            std::thread::park_timeout(d);
        }
    }

    fn slice(&self, deadline: Instant, most: Duration) -> Duration {
        deadline.saturating_duration_since(Instant::now()).min(most)
    }
}

/// A wait until a point on a clock: made when the wait begins, dropped
/// when it ends.
#[derive(Debug)]
pub struct Deadline {
    clock: SharedClock,
    start: Instant,
    at: Instant,
    token: u64,
}

impl Deadline {
    /// A wait of `timeout` from now on `clock`; `what` names it (for
    /// [`ManualClock::wait_armed`]).
    pub fn after(clock: &SharedClock, timeout: Duration, what: &'static str) -> Self {
        let start = clock.now();
        let at = later(start, timeout);
        Self {
            token: clock.arm(at, what),
            clock: clock.clone(),
            start,
            at,
        }
    }

    /// A wait until `at` on `clock` (which may already have passed).
    pub fn until(clock: &SharedClock, at: Instant, what: &'static str) -> Self {
        Self {
            token: clock.arm(at, what),
            clock: clock.clone(),
            start: clock.now(),
            at,
        }
    }

    /// When it passes.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// Whether the clock has reached it.
    pub fn passed(&self) -> bool {
        self.clock.now() >= self.at
    }

    /// Time on the clock since the wait began.
    pub fn waited(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.start)
    }

    /// Between two polls: parks for at most `pace` of real time, less if
    /// the deadline passes first.
    pub fn pause(&self, pace: Duration) {
        self.clock.park_until(self.at, pace);
    }

    /// How long a condition-variable or channel wait may block before
    /// looking at the clock again (at most `most`; zero once passed).
    pub fn slice(&self, most: Duration) -> Duration {
        self.clock.slice(self.at, most)
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.clock.disarm(self.token);
    }
}

/// The longest a condition-variable or channel wait blocks in real time on
/// a [`ManualClock`] before it looks at the clock again.
pub const MANUAL_SLICE: Duration = Duration::from_millis(2);

/// A clock that moves only when told: [`ManualClock::advance`]. Made with
/// [`ManualClock::new`]; hand [`ManualClock::shared`] to the code under
/// test.
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    state: Mutex<ManualState>,
    /// Signalled on every advance, arm and disarm.
    changed: Condvar,
}

#[derive(Debug, Default)]
struct ManualState {
    offset: Duration,
    next_token: u64,
    armed: BTreeMap<u64, (Instant, &'static str)>,
    parked: BTreeMap<u64, Thread>,
}

impl ManualClock {
    /// A clock standing at the present instant.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            base: Instant::now(),
            state: Mutex::new(ManualState::default()),
            changed: Condvar::new(),
        })
    }

    /// This clock as the driver and the model take it.
    pub fn shared(self: &Arc<Self>) -> SharedClock {
        self.clone()
    }

    /// The time on this clock (also [`Clock::now`]).
    pub fn now(&self) -> Instant {
        later(self.base, self.lock().offset)
    }

    fn lock(&self) -> MutexGuard<'_, ManualState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn token(s: &mut ManualState) -> u64 {
        s.next_token += 1;
        s.next_token
    }

    /// Moves time forward by `d` and wakes every thread parked on it.
    pub fn advance(&self, d: Duration) {
        let mut s = self.lock();
        s.offset = s.offset.saturating_add(d);
        for t in s.parked.values() {
            t.unpark();
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Moves time forward to `t` (nothing if it is already there).
    pub fn advance_to(&self, t: Instant) {
        let d = t.saturating_duration_since(self.now());
        self.advance(d);
    }

    /// The deadlines being waited for now, earliest first, with their names.
    pub fn armed(&self) -> Vec<(Instant, &'static str)> {
        let mut v: Vec<_> = self.lock().armed.values().copied().collect();
        v.sort();
        v
    }

    /// Waits (real time, at most `hang_guard`) until some thread waits for
    /// a deadline whose name contains `what` and that has not passed;
    /// returns the earliest such deadline, `None` if none came.
    pub fn wait_armed(&self, what: &str, hang_guard: Duration) -> Option<Instant> {
        let give_up = later(Instant::now(), hang_guard);
        let mut s = self.lock();
        loop {
            let now = later(self.base, s.offset);
            let found = s
                .armed
                .values()
                .filter(|(at, w)| *at > now && w.contains(what))
                .map(|(at, _)| *at)
                .min();
            if found.is_some() {
                return found;
            }
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Waits for a deadline named `what` (see [`ManualClock::wait_armed`])
    /// and moves time to it; returns it. Panics after `hang_guard` of real
    /// time without one (for tests).
    pub fn advance_to_armed(&self, what: &str, hang_guard: Duration) -> Instant {
        let Some(at) = self.wait_armed(what, hang_guard) else {
            panic!(
                "no wait for {what:?} began within {hang_guard:?}; armed: {:?}",
                self.armed()
            );
        };
        self.advance_to(at);
        at
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        ManualClock::now(self)
    }

    fn park_until(&self, deadline: Instant, most: Duration) {
        let mut s = self.lock();
        if later(self.base, s.offset) >= deadline {
            return;
        }
        let token = Self::token(&mut s);
        s.parked.insert(token, std::thread::current());
        drop(s);
        // An advance between the registration and this park leaves the
        // thread's token set: the park returns at once.
        std::thread::park_timeout(most);
        self.lock().parked.remove(&token);
    }

    fn slice(&self, deadline: Instant, most: Duration) -> Duration {
        if self.now() >= deadline {
            Duration::ZERO
        } else {
            most.min(MANUAL_SLICE)
        }
    }

    fn arm(&self, at: Instant, what: &'static str) -> u64 {
        let mut s = self.lock();
        let token = Self::token(&mut s);
        s.armed.insert(token, (at, what));
        drop(s);
        self.changed.notify_all();
        token
    }

    fn disarm(&self, token: u64) {
        self.lock().armed.remove(&token);
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_manual_clock_stands_still_until_advanced() {
        let c = ManualClock::new();
        let t0 = c.now();
        assert_eq!(c.now(), t0);
        c.advance(Duration::from_secs(3));
        assert_eq!(c.now() - t0, Duration::from_secs(3));
        c.advance_to(t0);
        assert_eq!(c.now() - t0, Duration::from_secs(3), "never backwards");
    }

    #[test]
    fn a_deadline_passes_only_when_the_clock_is_advanced_past_it() {
        let c = ManualClock::new();
        let d = Deadline::after(&c.shared(), Duration::from_secs(60), "a command");
        assert!(!d.passed());
        assert_eq!(c.armed(), vec![(d.at(), "a command")]);
        c.advance(Duration::from_secs(59));
        assert!(!d.passed());
        assert_eq!(d.waited(), Duration::from_secs(59));
        c.advance(Duration::from_secs(1));
        assert!(d.passed());
        assert_eq!(d.slice(Duration::from_secs(1)), Duration::ZERO);
        drop(d);
        assert!(c.armed().is_empty());
    }

    #[test]
    fn a_parked_waiter_wakes_when_the_clock_passes_its_deadline() {
        let c = ManualClock::new();
        let shared = c.shared();
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let d = Deadline::after(&shared, Duration::from_secs(10), "the waiter");
            // A pause of an hour of real time: only the advance ends it.
            while !d.passed() {
                d.pause(Duration::from_secs(3600));
            }
            tx.send(d.waited()).unwrap();
        });
        let at = c.advance_to_armed("waiter", Duration::from_secs(60));
        assert_eq!(at - c.now(), Duration::ZERO);
        let waited = rx.recv_timeout(Duration::from_secs(60)).expect("woke");
        assert_eq!(waited, Duration::from_secs(10));
        t.join().unwrap();
    }

    #[test]
    fn wait_armed_ignores_other_and_passed_deadlines() {
        let c = ManualClock::new();
        let s = c.shared();
        let _other = Deadline::after(&s, Duration::from_secs(1), "health");
        assert_eq!(c.wait_armed("command", Duration::ZERO), None);
        let cmd = Deadline::after(&s, Duration::from_secs(5), "command");
        assert_eq!(c.wait_armed("command", Duration::ZERO), Some(cmd.at()));
        c.advance(Duration::from_secs(5));
        assert_eq!(c.wait_armed("command", Duration::ZERO), None);
    }

    #[test]
    fn the_system_clock_slices_to_the_deadline() {
        let c = system();
        let d = Deadline::after(&c, Duration::ZERO, "now");
        assert!(d.passed());
        assert_eq!(d.slice(Duration::from_secs(1)), Duration::ZERO);
        d.pause(Duration::from_secs(3600)); // returns at once
        let far = Deadline::after(&c, Duration::MAX, "never");
        assert!(!far.passed());
        assert!(far.slice(Duration::from_millis(5)) <= Duration::from_millis(5));
    }
}
