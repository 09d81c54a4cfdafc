//! The lock of a QP's and a CQ's data path, biased to the first thread
//! that takes it.
//!
//! Most programs use a QP or a CQ from one thread, yet libibverbs must
//! let any thread call: libmlx5 takes a spinlock on every post and poll,
//! and its atomic read-modify-write is the largest part of an uncontended
//! poll's cost beyond the work itself. This lock is *biased*, as the JVM's
//! monitors were: the first thread to take it becomes its owner and takes
//! and gives it back with plain stores (an `inside` flag), no atomic
//! read-modify-write. The first time another thread asks for it the bias
//! is revoked for good, and from then on it is a spinlock (one
//! compare-and-swap to take, one store to give back; a waiter spins a
//! little, then yields).
//!
//! Only the data path (posts, polls, arming, the `ibv_wr_*` and extended
//! poll calls) claims or revokes a bias. The control path (a QP created on
//! the CQ, a QP modified or queried, a resize, acking events) takes the
//! lock with [`SpinLock::lock_control`]: unowned, it holds it without
//! claiming it; owned by another thread, it waits that owner out as a
//! revocation does and then hands the bias back. So a program that makes
//! its objects on one thread and polls on another keeps the polling
//! thread's bias (the first version biased the lock to the creating
//! thread, since `ibv_create_qp` locks its CQs, and the poller's first
//! poll then revoked it for good).
//!
//! Revocation is Dekker's algorithm made asymmetric by `membarrier(2)`
//! (as liburcu and Folly's asymmetric barriers do): the owner stores
//! `inside`, then (a compiler barrier only) loads `owner`; the revoker
//! stores `owner = REVOKING`, runs `MEMBARRIER_CMD_PRIVATE_EXPEDITED`
//! (every running thread of the process executes a full barrier), then
//! loads `inside`. So either the owner sees the revocation and backs off,
//! or the revoker sees it inside and waits until it leaves. Where the
//! kernel refuses membarrier (before 4.14, a seccomp filter, gVisor on a
//! platform without a global barrier), locks start revoked: plain
//! spinlocks, and the one registration attempt of the process logs a
//! warning (`MLX5_LOG=ibverbs::spin=debug` also logs a success, and each
//! revocation). No cheaper correct fallback was found: the owner's
//! store-then-load needs a store-load fence (as costly as the
//! compare-and-swap) unless something else interrupts the owner's CPU;
//! `mprotect`'s TLB-shootdown IPIs are no such guarantee (arm64 and
//! AMD's INVLPGB broadcast invalidations send none), and a signal to the
//! owner would need a process-wide handler and could interrupt its
//! system calls.
//!
//! An owner is named by its thread pointer (`pthread_self()`), unique
//! among live threads. A
//! thread that exits while owning a lock cannot be inside it; a later
//! thread given the same id takes the bias over, which is sound since the
//! two never run at once.
//!
//! `MLX5_SINGLE_THREADED=1` (rdma-core's libmlx5 knob, the same promise:
//! the program never uses one QP or CQ from two threads at once) makes
//! the locks of objects created afterwards free: nothing is taken.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// `owner`: not biased yet; the first thread to lock claims it.
const UNOWNED: usize = 0;
/// `owner`: a revocation is under way (the owner may still be inside).
const REVOKING: usize = 1;
/// `owner`: no bias: a spinlock on `held`.
const REVOKED: usize = 2;

/// A value that one thread at a time may use.
#[derive(Debug)]
pub(crate) struct SpinLock<T> {
    /// The thread the lock is biased to (its `pthread_self()`), or
    /// [`UNOWNED`], [`REVOKING`], [`REVOKED`].
    owner: AtomicUsize,
    /// The owner is inside (a biased lock taken).
    inside: AtomicBool,
    /// Taken (once revoked).
    held: AtomicBool,
    /// `MLX5_SINGLE_THREADED=1` when the lock was made: take nothing.
    single: bool,
    v: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists
// at a time (biased: `inside` and the revocation protocol above; revoked:
// `held`; with `single`, by the program's MLX5_SINGLE_THREADED promise,
// as libmlx5 relies on it), so sharing the lock shares access to `T` one
// thread at a time: `T: Send` suffices.
unsafe impl<T: Send> Sync for SpinLock<T> {}

/// This thread's id: its thread pointer, as `pthread_self()` returns it
/// (never 0, 1 or 2, which are addresses in the first page), read inline
/// where the ABI says where it is, so that the lock's fast path makes no
/// call (a call would make its caller save its arguments).
#[inline(always)]
fn me() -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        let tp: usize;
        // SAFETY: the x86-64 ELF TLS ABI puts at %fs:0 the thread
        // control block's pointer to itself (what glibc's and musl's
        // pthread_self() return); reading it has no side effects.
        unsafe {
            std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp,
                options(nostack, readonly, preserves_flags, pure));
        }
        tp
    }
    #[cfg(target_arch = "aarch64")]
    {
        let tp: usize;
        // SAFETY: TPIDR_EL0 is this thread's thread pointer on AArch64
        // Linux; reading it has no side effects.
        unsafe {
            std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp,
                options(nostack, nomem, preserves_flags, pure));
        }
        tp
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        // SAFETY: pthread_self has no preconditions.
        unsafe { libc::pthread_self() as usize }
    }
}

/// Whether locks may be biased: this process is registered for
/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` (asked once).
fn bias_possible() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        use rustix::thread::{membarrier, MembarrierCommand};
        match membarrier(MembarrierCommand::RegisterPrivateExpedited) {
            Ok(()) => {
                tracing::debug!("membarrier registered: the data-path locks are biased");
                true
            }
            Err(e) => {
                // Once per process. Each post and poll then pays a
                // compare-and-swap (about what libmlx5 pays);
                // MLX5_SINGLE_THREADED=1 takes no lock at all.
                tracing::warn!(
                    "membarrier(REGISTER_PRIVATE_EXPEDITED) refused ({e}): the QP and CQ \
                     locks are spinlocks, one atomic per post and poll \
                     (MLX5_SINGLE_THREADED=1 avoids them)"
                );
                false
            }
        }
    })
}

/// Where a lock's bias stands (tests).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bias {
    /// `MLX5_SINGLE_THREADED`: nothing taken.
    Single,
    /// Not biased yet: the next data-path lock claims it.
    Unowned,
    /// Biased to this thread (its [`this_thread`]).
    Owner(usize),
    /// A spinlock for good (or a revocation under way).
    Revoked,
}

/// This thread's id as the locks name their owner (tests).
#[cfg(test)]
pub(crate) fn this_thread() -> usize {
    me()
}

/// Whether this process's locks can be biased (tests).
#[cfg(test)]
pub(crate) fn biasing_possible() -> bool {
    bias_possible()
}

impl<T> SpinLock<T> {
    pub(crate) fn new(v: T) -> Self {
        Self::with_single(v, false)
    }

    /// A lock that takes nothing if `single` (the creator's promise, as
    /// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`) or `MLX5_SINGLE_THREADED=1`.
    pub(crate) fn with_single(v: T, single: bool) -> Self {
        static SINGLE: OnceLock<bool> = OnceLock::new();
        let single = single
            || *SINGLE
                .get_or_init(|| std::env::var("MLX5_SINGLE_THREADED").is_ok_and(|v| v == "1"));
        Self {
            // A lock that takes nothing needs no membarrier registration.
            owner: AtomicUsize::new(if !single && bias_possible() {
                UNOWNED
            } else {
                REVOKED
            }),
            inside: AtomicBool::new(false),
            held: AtomicBool::new(false),
            single,
            v: UnsafeCell::new(v),
        }
    }

    /// The lock, waiting for it if another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        match self.try_lock() {
            Some(g) => g,
            None => self.lock_slow(),
        }
    }

    /// The lock's fast path: taken by its owner (plain stores) or, once
    /// revoked, free (one compare-and-swap); else `None`, for a caller
    /// whose slow path ([`lock`](Self::lock)) is its own cold function.
    /// The owner is tested first: a lock that takes nothing
    /// (`MLX5_SINGLE_THREADED`) is [`REVOKED`], never a thread, so the
    /// biased lock of a thread-safe program pays no test for it.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        // Acquire: once REVOKED, the last biased holder's writes (released
        // to the revoker, which released REVOKED) are seen before `held`.
        let o = self.owner.load(Ordering::Acquire);
        if o != me() {
            return self.try_lock_unbiased(o);
        }
        // Ours and already inside (a call made between `ibv_start_poll`
        // and `ibv_end_poll` on the same CQ): the slow path, which waits
        // forever as a spinlock would, instead of a second guard.
        if self.inside.load(Ordering::Relaxed) {
            return None;
        }
        self.inside.store(true, Ordering::Relaxed);
        // Only the compiler's order: the revoker's membarrier orders this
        // store before the load below on the CPU.
        compiler_fence(Ordering::SeqCst);
        if self.owner.load(Ordering::Relaxed) == o {
            return Some(SpinGuard {
                l: self,
                release: &self.inside,
            });
        }
        // Revoked meanwhile: back off, and let the revoker see it.
        self.inside.store(false, Ordering::Release);
        None
    }

    /// [`try_lock`](Self::try_lock) of a lock not biased to this thread
    /// (`owner` read as `o`): nothing to take (`single`), or the spinlock
    /// once revoked; `None` for anything else (the slow path claims or
    /// revokes a bias).
    #[inline(always)]
    fn try_lock_unbiased(&self, o: usize) -> Option<SpinGuard<'_, T>> {
        if self.single {
            return Some(SpinGuard {
                l: self,
                release: &self.held,
            });
        }
        if o != REVOKED {
            return None;
        }
        let taken = self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        // A guard only once taken (not `then_some`, which would make one
        // either way): a guard made and dropped would give back a lock
        // another thread holds.
        match taken {
            true => Some(SpinGuard {
                l: self,
                release: &self.held,
            }),
            false => None,
        }
    }

    /// The slow path: claim an unowned lock's bias, or revoke another
    /// thread's (waiting until it is out), then spin for `held`.
    #[cold]
    #[inline(never)]
    fn lock_slow(&self) -> SpinGuard<'_, T> {
        let me = me();
        let mut spins = 0u32;
        loop {
            match self.owner.load(Ordering::Acquire) {
                UNOWNED => {
                    if self
                        .owner
                        .compare_exchange(UNOWNED, me, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        // Ours; unless revoked in between, the fast path takes it.
                        if let Some(g) = self.try_lock() {
                            return g;
                        }
                    }
                    continue;
                }
                REVOKING => {}
                REVOKED => {
                    if let Some(g) = self.try_lock() {
                        return g;
                    }
                }
                o if o == me => {
                    // Our own bias (the fast path backed off as it was
                    // being revoked, or lost a race): try it again.
                    if let Some(g) = self.try_lock() {
                        return g;
                    }
                }
                o => {
                    if self
                        .owner
                        .compare_exchange(o, REVOKING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        tracing::debug!(
                            owner = format_args!("{o:#x}"),
                            by = format_args!("{me:#x}"),
                            "a second thread on the data path: bias revoked, a spinlock from now on"
                        );
                        self.wait_out();
                        self.owner.store(REVOKED, Ordering::Release);
                    }
                    continue;
                }
            }
            backoff(&mut spins);
        }
    }

    /// The lock for a control-path call (create a QP on a CQ, modify or
    /// query a QP, resize, ack events): taken without claiming the bias,
    /// and, if another thread owns it, borrowed and handed back rather
    /// than revoked. A program that makes its QPs and CQs on one thread
    /// and polls on another (as many do) keeps its locks biased to the
    /// polling thread, whichever thread made or later reconfigures them.
    ///
    /// Unowned, the lock is held as [`REVOKING`] (no owner can be inside)
    /// and given back unowned. Owned by another thread, the owner is
    /// waited out as a revocation does (membarrier), then given its bias
    /// back: one barrier per control call, none on its data path.
    pub(crate) fn lock_control(&self) -> ControlGuard<'_, T> {
        self.lock_unclaiming(true)
    }

    /// The lock for arming a CQ (`ibv_req_notify_cq`): as the control
    /// path while the lock is unowned (a program that arms its CQ on the
    /// thread that made it, before another thread polls, leaves the bias
    /// to the poller), as the data path once it is owned: another thread
    /// arming revokes the owner's bias rather than paying a membarrier per
    /// call, since a program that arms on one thread and polls on another
    /// does so for every event.
    pub(crate) fn lock_unclaimed(&self) -> ControlGuard<'_, T> {
        self.lock_unclaiming(false)
    }

    /// [`lock_control`](Self::lock_control) (`borrow`: another thread's
    /// bias is borrowed) or [`lock_unclaimed`](Self::lock_unclaimed)
    /// (revoked).
    fn lock_unclaiming(&self, borrow: bool) -> ControlGuard<'_, T> {
        if self.single {
            return ControlGuard::Lock(self.lock());
        }
        let me = me();
        let mut spins = 0u32;
        loop {
            match self.owner.load(Ordering::Acquire) {
                UNOWNED => {
                    if self
                        .owner
                        .compare_exchange(UNOWNED, REVOKING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        return ControlGuard::Borrowed {
                            l: self,
                            restore: UNOWNED,
                        };
                    }
                    continue;
                }
                REVOKING => {}
                o if o == REVOKED || o == me || !borrow => return ControlGuard::Lock(self.lock()),
                o => {
                    if self
                        .owner
                        .compare_exchange(o, REVOKING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        self.wait_out();
                        return ControlGuard::Borrowed {
                            l: self,
                            restore: o,
                        };
                    }
                    continue;
                }
            }
            backoff(&mut spins);
        }
    }

    /// Waits the owner out (`owner` is [`REVOKING`], set by this thread):
    /// after the barrier the owner either saw the revocation or is seen
    /// inside; this returns once it is out, its writes seen.
    fn wait_out(&self) {
        use rustix::thread::{membarrier, MembarrierCommand};
        if let Err(e) = membarrier(MembarrierCommand::PrivateExpedited) {
            // Registered, so the kernel does not refuse it; were it to, the
            // owner's store could still sit in its CPU's store buffer.
            // Waiting out a scheduler tick does not prove it drained:
            // report, and spin on `inside` as the best left.
            tracing::error!("membarrier: {e}; revoking a biased lock without it");
        }
        let mut spins = 0u32;
        while self.inside.load(Ordering::Acquire) {
            backoff(&mut spins);
        }
    }

    /// Gives back a lock whose guard was [leaked](SpinGuard::leak).
    ///
    /// # Safety
    ///
    /// This thread holds the lock through a leaked guard, and `biased` is
    /// what `leak` returned; the value is not used through it afterwards.
    pub(crate) unsafe fn unlock_leaked(&self, biased: bool) {
        let release = if biased { &self.inside } else { &self.held };
        drop(SpinGuard { l: self, release });
    }

    /// The value, for a thread holding the lock through a leaked guard.
    ///
    /// # Safety
    ///
    /// This thread holds the lock ([`SpinGuard::leak`]) and no other
    /// reference to the value is live.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn locked_mut(&self) -> &mut T {
        // SAFETY: the caller holds the lock and no other reference.
        unsafe { &mut *self.v.get() }
    }

    /// Where the bias stands (tests).
    #[cfg(test)]
    pub(crate) fn bias(&self) -> Bias {
        match self.owner.load(Ordering::Acquire) {
            _ if self.single => Bias::Single,
            UNOWNED => Bias::Unowned,
            REVOKING | REVOKED => Bias::Revoked,
            o => Bias::Owner(o),
        }
    }

    pub(crate) fn into_inner(self) -> T {
        self.v.into_inner()
    }
}

/// Access to a [`SpinLock`]'s value until dropped.
pub(crate) struct SpinGuard<'a, T> {
    l: &'a SpinLock<T>,
    /// The flag dropping the guard clears: `inside` for the owner of a
    /// biased lock, else `held` (a `single` lock's is never set: clearing
    /// it is harmless, and spares the drop a test of `single`). Chosen
    /// when the lock is taken, so that a caller keeps one pointer for the
    /// unlock rather than what the choice was made from.
    release: &'a AtomicBool,
}

impl<T> SpinGuard<'_, T> {
    /// Keeps the lock past this guard (a lock held across C calls, as
    /// `ibv_start_poll` .. `ibv_end_poll`): whether it was taken biased,
    /// for [`SpinLock::unlock_leaked`].
    pub(crate) fn leak(self) -> bool {
        let biased = self.biased();
        std::mem::forget(self);
        biased
    }

    /// Taken by the owner of a biased lock.
    pub(crate) fn biased(&self) -> bool {
        std::ptr::eq(self.release, &self.l.inside)
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard holds the lock: no other reference exists.
        unsafe { &*self.l.v.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as above, and `&mut self` makes this the only one.
        unsafe { &mut *self.l.v.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.release.store(false, Ordering::Release);
    }
}

/// A lock taken by [`SpinLock::lock_control`], until dropped.
pub(crate) enum ControlGuard<'a, T> {
    /// Taken as the data path takes it: the thread's own bias, the
    /// spinlock once revoked, or nothing (`MLX5_SINGLE_THREADED`).
    Lock(SpinGuard<'a, T>),
    /// Held as [`REVOKING`]; `owner` becomes `restore` again when dropped.
    Borrowed { l: &'a SpinLock<T>, restore: usize },
}

impl<T> Deref for ControlGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            ControlGuard::Lock(g) => g,
            // SAFETY: `owner` is REVOKING, set by this guard's thread, and
            // the owner (if any) is out: no other reference exists.
            ControlGuard::Borrowed { l, .. } => unsafe { &*l.v.get() },
        }
    }
}

impl<T> DerefMut for ControlGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match self {
            ControlGuard::Lock(g) => g,
            // SAFETY: as above, and `&mut self` makes this the only one.
            ControlGuard::Borrowed { l, .. } => unsafe { &mut *l.v.get() },
        }
    }
}

impl<T> Drop for ControlGuard<'_, T> {
    fn drop(&mut self) {
        if let ControlGuard::Borrowed { l, restore } = self {
            // Release: the owner's (or the next claimer's) Acquire load of
            // `owner` sees what was written under this guard.
            l.owner.store(*restore, Ordering::Release);
        }
    }
}

/// One round of waiting: a spin, then (after 64) a yield.
fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::{Bias, SpinLock, REVOKED};
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn the_thread_id_read_inline_is_pthread_self() {
        // SAFETY: pthread_self has no preconditions.
        let want = unsafe { libc::pthread_self() } as usize;
        assert_eq!(super::me(), want);
        let other = std::thread::spawn(|| {
            // SAFETY: as above.
            (super::me(), unsafe { libc::pthread_self() } as usize)
        })
        .join()
        .unwrap();
        assert_eq!(other.0, other.1);
        assert_ne!(other.0, want);
    }

    #[test]
    fn the_first_thread_owns_the_lock_until_another_asks() {
        let l = SpinLock::new(0u64);
        if l.single || l.owner.load(Ordering::Relaxed) == REVOKED {
            return; // MLX5_SINGLE_THREADED=1, or no membarrier here
        }
        {
            let g = l.lock();
            assert!(g.biased(), "the first lock is biased to its thread");
        }
        // Another thread asks while the owner is inside: it waits.
        let g = l.lock();
        assert!(g.biased());
        assert!(
            l.try_lock().is_none(),
            "no second guard for the owner inside"
        );
        let entered = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                *l.lock() += 1;
                entered.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!entered.load(Ordering::SeqCst), "entered a held lock");
            drop(g);
        });
        assert!(entered.load(Ordering::SeqCst));
        assert_eq!(l.owner.load(Ordering::Relaxed), REVOKED);
        // Revoked for good: the owner now takes it as a spinlock.
        let g = l.lock();
        assert!(!g.biased());
        assert!(l.try_lock().is_none());
    }

    #[test]
    fn threads_exclude_each_other_through_revocation() {
        // Many rounds, each a fresh lock: the revocation races the owner.
        for _ in 0..50 {
            let l = SpinLock::new(0u64);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        for _ in 0..2_000 {
                            let mut g = l.lock();
                            // Not atomic: lost updates if two were inside.
                            let v = *g;
                            std::hint::spin_loop();
                            *g = v + 1;
                        }
                    });
                }
            });
            assert_eq!(l.into_inner(), 6_000);
        }
    }

    #[test]
    fn control_calls_neither_claim_nor_revoke_the_bias() {
        let l = SpinLock::new(0u64);
        if l.single || l.bias() == Bias::Revoked {
            return; // MLX5_SINGLE_THREADED=1, or no membarrier here
        }
        *l.lock_control() += 1;
        assert_eq!(l.bias(), Bias::Unowned, "a control call claimed the bias");
        let owner = std::thread::scope(|s| {
            s.spawn(|| {
                *l.lock() += 1;
                super::me()
            })
            .join()
            .unwrap()
        });
        assert_eq!(l.bias(), Bias::Owner(owner));
        // This thread's control calls borrow it and give it back.
        *l.lock_control() += 1;
        assert_eq!(l.bias(), Bias::Owner(owner), "a control call kept the bias");
        assert_eq!(l.into_inner(), 3);
    }

    #[test]
    fn control_calls_exclude_the_owner_and_leave_it_biased() {
        for _ in 0..20 {
            let l = SpinLock::new(0u64);
            let owner = std::thread::scope(|s| {
                let o = s.spawn(|| {
                    for _ in 0..5_000 {
                        let mut g = l.lock();
                        // Not atomic: lost updates if two were inside.
                        let v = *g;
                        std::hint::spin_loop();
                        *g = v + 1;
                    }
                    super::me()
                });
                for _ in 0..200 {
                    let mut g = l.lock_control();
                    let v = *g;
                    std::hint::spin_loop();
                    *g = v + 1;
                }
                o.join().unwrap()
            });
            match l.bias() {
                Bias::Single | Bias::Revoked => {} // no bias to keep
                b => assert_eq!(b, Bias::Owner(owner), "the data-path thread's bias lost"),
            }
            assert_eq!(l.into_inner(), 5_200);
        }
    }
}
