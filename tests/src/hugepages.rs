//! Huge pages for the tests that need them.
//!
//! [`Reservation::free_pages`] grows the kernel's pool of one page size
//! (as root, through
//! `/sys/kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages`) by the
//! pages a test needs, and gives back what it added when dropped. A test that still
//! finds none says so with [`not_run`]: a loud `NOT RUN` line, and a
//! failure when `MLX5_HUGEPAGES_REQUIRED=1` (set by `scripts/test-all.sh`
//! where it runs as root, so a machine that could give pages and did not is
//! a failure there, never a silent pass).

use std::path::PathBuf;
use std::sync::Mutex;

/// 2 MiB.
pub const SIZE_2M: u64 = 2 << 20;
/// 1 GiB.
pub const SIZE_1G: u64 = 1 << 30;

/// Serializes this process's changes of the pools (tests run on threads).
static POOL: Mutex<()> = Mutex::new(());

fn pool_file(size: u64, name: &str) -> PathBuf {
    PathBuf::from(format!(
        "/sys/kernel/mm/hugepages/hugepages-{}kB/{name}",
        size >> 10
    ))
}

fn read_count(size: u64, name: &str) -> Option<u64> {
    std::fs::read_to_string(pool_file(size, name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Pages this test added to a pool; removed again on drop.
#[derive(Debug)]
pub struct Reservation {
    size: u64,
    added: u64,
}

impl Reservation {
    /// `n` more pages of `size` bytes in the kernel's pool, for this
    /// reservation's lifetime (root only; elsewhere, or when memory is too
    /// fragmented, the pool grows by less or not at all). Each test adds
    /// what it uses, so tests running side by side do not take each
    /// other's pages. Returns how many pages are free now.
    pub fn free_pages(size: u64, n: u64) -> (Self, u64) {
        let _g = POOL.lock().unwrap_or_else(|p| p.into_inner());
        let mut r = Self { size, added: 0 };
        if let Some(total) = read_count(size, "nr_hugepages") {
            if std::fs::write(pool_file(size, "nr_hugepages"), (total + n).to_string()).is_ok() {
                let now = read_count(size, "nr_hugepages").unwrap_or(total);
                r.added = now.saturating_sub(total);
            }
        }
        let free = read_count(size, "free_hugepages").unwrap_or(0);
        (r, free)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.added == 0 {
            return;
        }
        let _g = POOL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(total) = read_count(self.size, "nr_hugepages") {
            let back = total.saturating_sub(self.added);
            if let Err(e) = std::fs::write(pool_file(self.size, "nr_hugepages"), back.to_string()) {
                eprintln!(
                    "hugepages: could not give back {} pages of {} KiB: {e}",
                    self.added,
                    self.size >> 10
                );
            }
        }
    }
}

/// Says loudly that `test` did not run and why; panics instead when
/// `MLX5_HUGEPAGES_REQUIRED=1` and `required` (a check the machine should
/// have been able to run).
pub fn not_run(test: &str, why: &str, required: bool) {
    let must = required && std::env::var("MLX5_HUGEPAGES_REQUIRED").is_ok_and(|v| v == "1");
    assert!(
        !must,
        "{test}: {why} (MLX5_HUGEPAGES_REQUIRED=1 makes this a failure)"
    );
    println!("test {test} ... NOT RUN: {why}");
    eprintln!("test {test} ... NOT RUN: {why}");
}
