//! The time windows reads of the ledger cover (`switchyard report --since`, the admin API's
//! `window=`): parsing `90s`, `30m`, `24h`, `7d`, and where a window starts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest window: 1,000 years.
pub const MAX_WINDOW_SECS: u64 = 1_000 * 365 * 86_400;

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The first millisecond (Unix time) of a window reaching back `since` from now.
pub fn window_start(since: Duration) -> i64 {
    now_ms().saturating_sub(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

/// Parses `90s`, `30m`, `24h`, `7d`.
pub fn parse_window(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}`: expected a whole number and a unit (s, m, h, d)"))?;
    let unit_secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "`{text}`: expected a whole number and a unit (s, m, h, d)"
            ))
        }
    };
    // A window reaching back past 1970 is the whole ledger; one that overflowed would wrap into
    // a short window, silently.
    match n.checked_mul(unit_secs) {
        Some(secs) if secs <= MAX_WINDOW_SECS => Ok(Duration::from_secs(secs)),
        _ => Err(format!(
            "`{text}`: longer than any ledger (at most {} days)",
            MAX_WINDOW_SECS / 86_400
        )),
    }
}
