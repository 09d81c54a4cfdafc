//! User indexes: the numbers Ethernet RQs polled through verbs CQs are
//! created with (`rqc.user_index`) and their receive CQEs carry in
//! `srqn_uidx` (such a CQE carries the flow tag where others carry the QP
//! number), as libmlx5 numbers its resources for CQE version 1
//! (`mlx5_store_uidx`). A namespace of the context's own, 24 bits, 0
//! unused; a CQ maps them in its user-index table ([`crate::cq`]).

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::{Error, Result};

/// The largest user index (`user_index` is 24 bits).
const MAX: u32 = (1 << 24) - 1;

/// A context's user indexes in use.
#[derive(Debug, Default)]
pub(crate) struct UidxPool(Mutex<BTreeSet<u32>>);

impl UidxPool {
    /// The lowest free index.
    pub(crate) fn alloc(&self) -> Result<u32> {
        let mut used = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // The first gap above 0 (the set is ordered).
        let mut next = 1;
        for &u in used.iter() {
            if u != next {
                break;
            }
            next += 1;
        }
        if next > MAX {
            return Err(Error::QueueFull("user indexes"));
        }
        used.insert(next);
        Ok(next)
    }

    /// Gives `u` back.
    pub(crate) fn free(&self, u: u32) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(&u);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_are_the_lowest_free_and_come_back() {
        let p = UidxPool::default();
        assert_eq!(
            (p.alloc().unwrap(), p.alloc().unwrap(), p.alloc().unwrap()),
            (1, 2, 3)
        );
        p.free(2);
        assert_eq!(p.alloc().unwrap(), 2);
        assert_eq!(p.alloc().unwrap(), 4);
    }
}
