//! The wall clock, read only at the edge: the server stamps answers and deadlines with it,
//! the live mirror what it scraped and streamed; `sim` and `twin` are given every time they
//! use.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (0 if the clock is before 1970, `u64::MAX` past
/// 584,942 years).
pub fn wall_now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
        })
}
