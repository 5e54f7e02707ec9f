//! Printing figures, shared by the benchmarks: one line of text, or with `--json` one JSON
//! object per line, and the unit conversions they all use.

use std::time::Duration;

/// Prints `value` as one JSON line when `json`, else `text`.
pub fn emit(json: bool, value: serde_json::Value, text: String) {
    if json {
        println!("{value}");
    } else {
        println!("{text}");
    }
}

/// `bytes` over `elapsed` in MiB/s (a zero duration counts as one nanosecond).
pub fn mb_per_sec(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / elapsed.as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mib_per_second() {
        assert_eq!(mb_per_sec(8 << 20, Duration::from_secs(2)), 4.0);
        assert!(mb_per_sec(1, Duration::ZERO).is_finite());
    }
}
