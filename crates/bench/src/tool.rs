//! Running an external baseline tool (fio, redis-benchmark, ...) so that its absence and
//! its failure are told apart: a binary that is not installed is [`ToolError::NotInstalled`];
//! one that ran and failed is [`ToolError::Failed`] with its exit status and the tail of its
//! stderr, so a benchmark never reports "not installed" for a tool that is there but broke.

use std::process::{Command, Output};

/// Lines of a failed tool's stderr that are kept.
const STDERR_TAIL_LINES: usize = 6;
/// Characters of a failed tool's stderr that are kept at most.
const STDERR_TAIL_CHARS: usize = 600;

/// Why an external tool gave no figure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The binary was not found (not on `PATH`).
    #[error("{tool} not installed")]
    NotInstalled {
        /// The binary's name.
        tool: String,
    },
    /// It was found but failed: could not start, exited non-zero, or printed nothing usable.
    #[error("{tool} failed: {detail}")]
    Failed {
        /// The binary's name.
        tool: String,
        /// What went wrong: the exit status and stderr tail, or the unusable output.
        detail: String,
    },
    /// Not run on purpose.
    #[error("{tool} skipped ({reason})")]
    Skipped {
        /// The binary's name.
        tool: String,
        /// Why (the option that asked for it).
        reason: String,
    },
}

impl ToolError {
    /// `"not installed"`, `"failed"` or `"skipped"`: the `status` value of JSON lines.
    pub fn status(&self) -> &'static str {
        match self {
            ToolError::NotInstalled { .. } => "not installed",
            ToolError::Failed { .. } => "failed",
            ToolError::Skipped { .. } => "skipped",
        }
    }

    /// A failure of `tool` described by `detail`.
    pub fn failed(tool: &str, detail: impl Into<String>) -> ToolError {
        ToolError::Failed {
            tool: tool.to_string(),
            detail: detail.into(),
        }
    }
}

/// The last [`STDERR_TAIL_LINES`] non-empty lines of `stderr` (at most
/// [`STDERR_TAIL_CHARS`] characters, cut at the front), joined with " | ".
pub fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let tail = lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join(" | ");
    let chars = tail.chars().count();
    if chars > STDERR_TAIL_CHARS {
        let cut: String = tail.chars().skip(chars - STDERR_TAIL_CHARS).collect();
        format!("...{cut}")
    } else {
        tail
    }
}

/// Runs `command` (named `tool` in errors) to completion and returns its output if it
/// exited with status 0.
pub fn run(tool: &str, command: &mut Command) -> Result<Output, ToolError> {
    let output = command.output().map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            ToolError::NotInstalled {
                tool: tool.to_string(),
            }
        } else {
            ToolError::failed(tool, format!("could not start: {error}"))
        }
    })?;
    if !output.status.success() {
        let tail = stderr_tail(&output.stderr);
        return Err(ToolError::failed(
            tool,
            format!(
                "{}; stderr: {}",
                output.status,
                if tail.is_empty() {
                    "(empty)"
                } else {
                    tail.as_str()
                }
            ),
        ));
    }
    Ok(output)
}

/// Whether `binary` is a file in one of the `PATH` directories.
pub fn on_path(binary: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_not_installed() {
        let error = run(
            "no-such-tool",
            &mut Command::new("myriad-bench-no-such-tool-7f3a"),
        )
        .expect_err("cannot run");
        assert_eq!(
            error,
            ToolError::NotInstalled {
                tool: "no-such-tool".into()
            }
        );
        assert_eq!(error.status(), "not installed");
    }

    #[test]
    fn a_failing_tool_reports_its_status_and_stderr_tail() {
        let error = run(
            "sh",
            Command::new("sh").args(["-c", "echo noise >&2; echo 'bad option --x' >&2; exit 3"]),
        )
        .expect_err("exits 3");
        assert_eq!(error.status(), "failed");
        let text = error.to_string();
        assert!(text.contains("sh failed"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        assert!(text.contains("bad option --x"), "{text}");
    }

    #[test]
    fn a_succeeding_tool_gives_its_output() {
        let output = run("sh", Command::new("sh").args(["-c", "echo ok"])).expect("runs");
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "ok");
    }

    #[test]
    fn stderr_tail_keeps_the_last_lines_and_bounds_the_length() {
        let many: String = (0..20).map(|i| format!("line {i}\n")).collect();
        assert_eq!(
            stderr_tail(many.as_bytes()),
            "line 14 | line 15 | line 16 | line 17 | line 18 | line 19"
        );
        let long = "x".repeat(5000);
        assert!(stderr_tail(long.as_bytes()).chars().count() <= STDERR_TAIL_CHARS + 3);
        assert_eq!(stderr_tail(b"\n\n"), "");
    }
}
