//! The objects this library handed out and has not destroyed: every
//! control-path call checks its object pointer here first, so a NULL, a
//! stray or an already-destroyed pointer gets `EINVAL` instead of a
//! dereference.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// What kind of object an address holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Context,
    Pd,
    Mr,
    Cq,
    Channel,
    Qp,
    Srq,
    Ah,
    Dm,
    Mw,
    /// A DC target (`crate::dc::Dct`): an `ibv_qp` that is not a `Qp`.
    Dct,
    /// An mlx5dv indirect mkey (`crate::mkey::Mkey`).
    Mkey,
    /// A DevX object, UMEM or UAR (`crate::devx`).
    DevxObj,
    DevxUmem,
    DevxUar,
    /// A raw packet QP (`crate::raw::RawQp`): an `ibv_qp` that is not a
    /// `Qp`.
    RawQp,
    /// A flow rule (`crate::raw`).
    Flow,
    /// A receive work queue, an indirection table, an RSS QP
    /// (`crate::rss`).
    Wq,
    IndTable,
    RssQp,
    /// An mlx5dv flow matcher (`crate::raw`).
    Matcher,
}

fn live() -> MutexGuard<'static, BTreeMap<usize, Kind>> {
    static LIVE: Mutex<BTreeMap<usize, Kind>> = Mutex::new(BTreeMap::new());
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records a new object.
pub(crate) fn add<T>(p: *const T, k: Kind) {
    live().insert(p as usize, k);
}

/// Whether `p` is a live object of kind `k`.
pub(crate) fn is<T>(p: *const T, k: Kind) -> bool {
    !p.is_null() && live().get(&(p as usize)) == Some(&k)
}

/// Forgets `p` if it is a live `k`; whether it was.
pub(crate) fn remove<T>(p: *const T, k: Kind) -> bool {
    let mut l = live();
    if l.get(&(p as usize)) == Some(&k) {
        l.remove(&(p as usize));
        true
    } else {
        false
    }
}
