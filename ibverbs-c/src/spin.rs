//! The lock of a QP's and a CQ's data path: one compare-and-swap to take,
//! one store to give back (libmlx5 takes a spinlock there too; a futex
//! mutex costs a second atomic read-modify-write on release). A waiter
//! spins a little, then yields, so a holder that lost its CPU gets it back.
//!
//! `MLX5_SINGLE_THREADED=1` (rdma-core's libmlx5 knob, the same promise:
//! the program never uses one QP or CQ from two threads at once) makes
//! the locks of objects created afterwards free: nothing is taken.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};

/// A value that one thread at a time may use.
#[derive(Debug)]
pub(crate) struct SpinLock<T> {
    held: AtomicBool,
    /// `MLX5_SINGLE_THREADED=1` when the lock was made: take nothing.
    single: bool,
    v: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a guard, and one guard exists
// at a time (`held`; with `single`, by the program's MLX5_SINGLE_THREADED
// promise, as libmlx5 relies on it), so sharing the lock shares access to
// `T` one thread at a time: `T: Send` suffices.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    pub(crate) fn new(v: T) -> Self {
        static SINGLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let single =
            *SINGLE.get_or_init(|| std::env::var("MLX5_SINGLE_THREADED").is_ok_and(|v| v == "1"));
        Self {
            held: AtomicBool::new(false),
            single,
            v: UnsafeCell::new(v),
        }
    }

    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if !self.single
            && self
                .held
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            self.lock_contended();
        }
        SpinGuard { l: self }
    }

    /// The value if the lock is free (or not taken: `single`), else
    /// `None`: for a caller whose contended path is its own cold function.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        if !self.single
            && self
                .held
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            return None;
        }
        Some(SpinGuard { l: self })
    }

    /// The lock is held by another thread: spin, then yield, until it is
    /// free. Out of line, so that the uncontended path of a caller (a
    /// poll, a post) saves no registers for this loop.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        while self
            .held
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    pub(crate) fn into_inner(self) -> T {
        self.v.into_inner()
    }
}

/// Access to a [`SpinLock`]'s value until dropped.
pub(crate) struct SpinGuard<'a, T> {
    l: &'a SpinLock<T>,
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
        if !self.l.single {
            self.l.held.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SpinLock;

    #[test]
    fn try_lock_refuses_a_held_lock_and_threads_exclude_each_other() {
        let l = SpinLock::new(0u64);
        if l.single {
            return; // MLX5_SINGLE_THREADED=1 in this process: no lock to test
        }
        {
            let _g = l.lock();
            assert!(l.try_lock().is_none());
        }
        assert!(l.try_lock().is_some());
        // Contended: both threads go through lock_contended at times.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        *l.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(l.into_inner(), 200_000);
    }
}
