//! CPU time of processes from `/proc`, for `bench kv`'s CPU seconds per million operations
//! and the idle CPU of a quiet cluster.
//!
//! # What is counted
//! `utime + stime` of `/proc/<pid>/stat` (fields 14 and 15: every thread of the process,
//! user and kernel time), in clock ticks of `USER_HZ` (`getconf CLK_TCK`, 100 on Linux). A
//! process that has exited reads as an error, never as zero CPU.

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// CPU seconds used so far by `pid` (user + system, all threads).
pub fn process_cpu_secs(pid: u32) -> Result<f64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let ticks = parse_stat_ticks(&text).ok_or_else(|| format!("malformed {path}"))?;
    Ok(ticks as f64 / clock_ticks_per_sec())
}

/// `utime + stime` from the text of a `/proc/<pid>/stat` file. The command name (field 2)
/// may hold spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_stat_ticks(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: field 3 (state) is index 0, so utime (14) is 11 and stime (15) is 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `USER_HZ` (`getconf CLK_TCK`; 100 if that cannot be run).
pub fn clock_ticks_per_sec() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse::<f64>().ok())
            .filter(|ticks| *ticks > 0.0)
            .unwrap_or(100.0)
    })
}

/// CPU seconds of a set of processes, summed.
pub fn total_cpu_secs(pids: &[u32]) -> Result<f64, String> {
    pids.iter().map(|&pid| process_cpu_secs(pid)).sum()
}

/// A CPU reading of a set of processes at one moment.
#[derive(Debug, Clone)]
pub struct CpuMark {
    pids: Vec<u32>,
    cpu_secs: f64,
    at: Instant,
}

impl CpuMark {
    /// Reads the processes' CPU time now.
    pub fn now(pids: &[u32]) -> Result<CpuMark, String> {
        Ok(CpuMark {
            pids: pids.to_vec(),
            cpu_secs: total_cpu_secs(pids)?,
            at: Instant::now(),
        })
    }

    /// CPU seconds the same processes used since this mark, and the wall time that passed.
    pub fn since(&self) -> Result<(f64, Duration), String> {
        let now = total_cpu_secs(&self.pids)?;
        Ok(((now - self.cpu_secs).max(0.0), self.at.elapsed()))
    }
}

/// CPU seconds per million operations (`None` without operations).
pub fn secs_per_million(cpu_secs: f64, ops: u64) -> Option<f64> {
    (ops > 0).then(|| cpu_secs / ops as f64 * 1e6)
}

/// Percent of one core the processes used over `window` while nothing drove them.
pub fn idle_percent(pids: &[u32], window: Duration) -> Result<f64, String> {
    let mark = CpuMark::now(pids)?;
    std::thread::sleep(window);
    let (cpu, wall) = mark.since()?;
    Ok(cpu / wall.as_secs_f64().max(1e-9) * 100.0)
}

/// Waits until the processes use less than `percent` of one core over a `window`, at most
/// `max`; returns how long it took (`Err` if they never settled or a process is gone).
/// Peers start by prefaulting memory in the background (a full core each for seconds),
/// and backups write preloaded data to their logs: measuring before that ends would
/// charge it to the first configurations.
pub fn wait_quiet(
    pids: &[u32],
    percent: f64,
    window: Duration,
    max: Duration,
) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let used = idle_percent(pids, window)?;
        if used < percent {
            return Ok(started.elapsed());
        }
        if started.elapsed() > max {
            return Err(format!(
                "the servers still used {used:.1}% of a core after {max:?} without load"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_utime_and_stime_after_a_name_with_spaces() {
        let text = "1234 (my (odd) name) S 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 1 0";
        assert_eq!(parse_stat_ticks(text), Some(325));
        assert_eq!(parse_stat_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    #[test]
    fn this_process_uses_cpu_and_a_dead_pid_is_an_error() {
        let me = std::process::id();
        let mark = CpuMark::now(&[me]).expect("own stat");
        // A fixed amount of work (not of wall time: the machine may be busy) until at least
        // two clock ticks of CPU show, bounded.
        let mut x = 0u64;
        let mut cpu = 0.0;
        for _ in 0..1000 {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            cpu = mark.since().expect("own stat").0;
            if cpu >= 0.02 {
                break;
            }
        }
        assert!(
            cpu >= 0.02,
            "a billion multiply-adds but counted {cpu} s of CPU"
        );
        assert!(process_cpu_secs(u32::MAX - 1).is_err());
        assert_eq!(secs_per_million(2.0, 4_000_000), Some(0.5));
        assert_eq!(secs_per_million(2.0, 0), None);
    }
}
