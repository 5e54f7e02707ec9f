//! Facts about running processes that benchmarks report, read from `/proc` (no `unsafe`).

/// Resident set size of this process in bytes (0 if `/proc` is unavailable).
pub fn rss_bytes() -> u64 {
    rss_bytes_of("self")
}

/// Resident set size of process `pid` (`"self"` for this one) in bytes, 0 if unknown.
pub fn rss_bytes_of(pid: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// CPU seconds this process has run so far (all threads), 0 if unknown.
pub fn cpu_seconds() -> f64 {
    cpu_seconds_of("self")
}

/// Clock ticks per second of `/proc/<pid>/stat` times (USER_HZ, 100 on Linux/x86).
const USER_HZ: f64 = 100.0;

/// CPU seconds (user + system, all threads, also finished ones) process `pid` (`"self"`
/// for this one) has used so far, from `/proc/<pid>/stat`; 0 if unknown.
pub fn cpu_seconds_of(pid: &str) -> f64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start at state (field 3);
    // utime and stime are fields 14 and 15.
    let Some(rest) = text.rfind(')').map(|end| &text[end + 1..]) else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / USER_HZ
}
