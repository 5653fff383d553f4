//! Time at the gRPC edge: the server's wall clock, the client's `grpc-timeout`, and the
//! deadline a prediction or forecast works against. The wall clock is
//! `telemetry::clock::wall_now_us`, shared with the live mirror (re-exported here).

use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;

/// Microseconds since the Unix epoch on the server's clock (see [`crate::telemetry::clock`]).
pub use crate::telemetry::clock::wall_now_us;

/// Parses a `grpc-timeout` header value (`<up to 8 digits><H|M|S|m|u|n>`).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if !value.is_ascii() {
        return None;
    }
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The client's deadline, if it sent a grpc-timeout. Tonic cancels the call itself at that
/// instant (with CANCELLED), so the handler's deadline comes a little earlier: a tenth of
/// the timeout, at least 2 ms and at most 50 ms, so the client gets DEADLINE_EXCEEDED.
pub(crate) fn client_deadline(metadata: &MetadataMap, now: Instant) -> Option<Instant> {
    let timeout = parse_grpc_timeout(metadata.get("grpc-timeout")?.to_str().ok()?)?;
    let margin = (timeout / 10).clamp(Duration::from_millis(2), Duration::from_millis(50));
    Some(now + timeout.saturating_sub(margin))
}

/// The deadline of one prediction or forecast: the client's, capped by `max_call`.
pub(crate) fn work_deadline(client: Option<Instant>, max_call: Duration, now: Instant) -> Instant {
    let server = now + max_call;
    client.map_or(server, |client| client.min(server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("S"), None);
        assert_eq!(parse_grpc_timeout("10x"), None);
        assert_eq!(parse_grpc_timeout(""), None);
        assert_eq!(parse_grpc_timeout("1é"), None);
    }

    #[test]
    fn the_work_deadline_is_the_earlier_one() {
        let now = Instant::now();
        let client = now + Duration::from_millis(10);
        assert_eq!(
            work_deadline(Some(client), Duration::from_secs(5), now),
            client
        );
        assert_eq!(
            work_deadline(None, Duration::from_secs(5), now),
            now + Duration::from_secs(5)
        );
    }
}
