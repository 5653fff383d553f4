//! Running independent forks across cores on rayon's persistent work-stealing pool (no
//! thread spawned per call, and an uneven mix of forks balances itself); results keep input
//! order.

use rayon::prelude::*;

/// Applies `f` to every item across the pool's threads; results are in the order of
/// `items`, so the output never depends on scheduling.
pub fn map<T, R, F>(items: &[T], f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync + Send,
{
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    items.par_iter().with_max_len(1).map(&f).collect()
}
