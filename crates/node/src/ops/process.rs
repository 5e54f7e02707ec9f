//! This process's CPU time, resident memory and threads, read from `/proc/self` (Linux).
//!
//! # Invariants
//! - Never fails: a figure that cannot be read is `None` (another OS, an odd `/proc`).
//!
//! # Who calls it
//! The metrics collectors of peers and superpeers, at scrape time.

/// Figures of this process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, in bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, in bytes.
    pub virtual_bytes: Option<u64>,
    /// Threads.
    pub threads: Option<u64>,
}

/// Clock ticks per second of `/proc/*/stat` (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// Reads this process's figures now.
pub fn process_stats() -> ProcessStats {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return ProcessStats::default();
    };
    let mut stats = parse_stat(&stat);
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        stats.resident_bytes = parse_rss(&status);
    }
    stats
}

/// The `VmRSS:  N kB` line of `/proc/self/status`, in bytes.
fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib = line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    Some(kib * 1024)
}

/// Parses `/proc/self/stat` (fields after the parenthesized command name); the resident
/// size is left to `/proc/self/status` (in kB there, in pages here).
fn parse_stat(stat: &str) -> ProcessStats {
    let Some(rest) = stat.rfind(')').map(|at| &stat[at + 1..]) else {
        return ProcessStats::default();
    };
    // `rest` starts at field 3 (state); field N is at index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    ProcessStats {
        cpu_seconds: match (field(14), field(15)) {
            (Some(user), Some(system)) => Some((user + system) as f64 / CLOCK_TICKS_PER_SECOND),
            _ => None,
        },
        threads: field(20),
        virtual_bytes: field(23),
        resident_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_spaces_in_the_name() {
        let line = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 \
                    1000 123456789 300 18446744073709551615";
        let stats = parse_stat(line);
        assert_eq!(stats.cpu_seconds, Some(3.0));
        assert_eq!(stats.threads, Some(7));
        assert_eq!(stats.virtual_bytes, Some(123_456_789));
        assert_eq!(
            parse_rss("Name:\tx\nVmRSS:\t  1200 kB\n"),
            Some(1200 * 1024)
        );
    }

    #[test]
    fn reads_this_process() {
        let stats = process_stats();
        assert!(stats.resident_bytes.is_some_and(|bytes| bytes > 0));
        assert!(stats.threads.is_some_and(|threads| threads >= 1));
    }
}
