//! Task scripts: a list of tasks with parameters, slave bounds and conditions, written in
//! TOML or JSON (the role of DXRAM's `.cts` files).
//!
//! # Format
//! ```toml
//! name = "count-then-sum"
//! slaves_min = 3          # default for every task: fewest slaves (default 1)
//! slaves_max = 0          # most slaves, 0 = all (default 0)
//! task_timeout_ms = 60000 # longest one task may run (default 60 s)
//! slaves_wait_ms = 5000   # how long to wait for slaves_min slaves (default 5 s)
//!
//! [[task]]
//! name = "builtin.value"
//! params = { value = 2 }  # any table: handed to the task as JSON
//!
//! [[task]]
//! name = "builtin.value"
//! params = { value = 5 }
//! # Run only if the previous task's values (8-byte integers) pass; else abort the
//! # script (otherwise = "abort", the default) or skip this task (otherwise = "skip").
//! when = { value = "sum", op = ">=", than = 6, otherwise = "abort" }
//! ```
//! The same structure as JSON is accepted ([`TaskScript::parse`] tries JSON when the text
//! starts with `{`). `value` is one of `sum`, `min`, `max`, `first`; `op` one of `==`,
//! `!=`, `<`, `<=`, `>`, `>=`.
//!
//! # Invariants
//! A parsed script has 1 to [`SCRIPT_STEPS_MAX`] tasks, names within the wire limit,
//! `slaves_min <= slaves_max` where both are set, and no condition on its first task.
//!
//! # Who calls it
//! `myriad term` (`comptaskscript`), applications, tests; [`crate::client`] sends it.

use bytes::Bytes;
use serde::Deserialize;
use thiserror::Error;

use crate::task::read_int;
use crate::wire::{StepWire, SubmitRequest, NAME_BYTES_MAX, SCRIPT_STEPS_MAX};

/// Why a script was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScriptError {
    /// Not valid TOML or JSON of the script's shape.
    #[error("task script does not parse: {0}")]
    Parse(String),
    /// Parsed, but breaks a rule.
    #[error("invalid task script: {0}")]
    Invalid(String),
}

/// Which single number a condition tests, from the values the slaves returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// Sum over the slaves.
    Sum,
    /// Smallest.
    Min,
    /// Largest.
    Max,
    /// Slave 0's value.
    First,
}

/// A comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum CmpOp {
    /// `==`
    #[serde(rename = "==")]
    Eq,
    /// `!=`
    #[serde(rename = "!=")]
    Ne,
    /// `<`
    #[serde(rename = "<")]
    Lt,
    /// `<=`
    #[serde(rename = "<=")]
    Le,
    /// `>`
    #[serde(rename = ">")]
    Gt,
    /// `>=`
    #[serde(rename = ">=")]
    Ge,
}

/// What to do when a condition fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Otherwise {
    /// Stop the script (it ends `Aborted`).
    #[default]
    Abort,
    /// Skip this task and go on with the next.
    Skip,
}

/// A condition on the previous task's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Which number to test.
    pub value: Aggregate,
    /// The comparison.
    pub op: CmpOp,
    /// The right-hand side.
    pub than: i64,
    /// What to do when it fails.
    #[serde(default)]
    pub otherwise: Otherwise,
}

const AGGREGATES: [Aggregate; 4] = [
    Aggregate::Sum,
    Aggregate::Min,
    Aggregate::Max,
    Aggregate::First,
];
const OPS: [CmpOp; 6] = [
    CmpOp::Eq,
    CmpOp::Ne,
    CmpOp::Lt,
    CmpOp::Le,
    CmpOp::Gt,
    CmpOp::Ge,
];

impl Condition {
    /// The aggregate of `values` (each an 8-byte integer), or why there is none.
    pub fn aggregate(&self, values: &[Bytes]) -> Result<i64, String> {
        let numbers = values
            .iter()
            .map(|value| {
                read_int(value).ok_or_else(|| {
                    format!(
                        "a condition needs 8-byte integer values, got {} bytes",
                        value.len()
                    )
                })
            })
            .collect::<Result<Vec<i64>, String>>()?;
        if numbers.is_empty() {
            return Err("the previous task returned no values".to_owned());
        }
        let result = match self.value {
            Aggregate::Sum => Some(numbers.iter().fold(0i64, |sum, n| sum.saturating_add(*n))),
            Aggregate::Min => numbers.iter().copied().min(),
            Aggregate::Max => numbers.iter().copied().max(),
            Aggregate::First => numbers.first().copied(),
        };
        result.ok_or_else(|| "the previous task returned no values".to_owned())
    }

    /// Whether `values` pass.
    pub fn holds(&self, values: &[Bytes]) -> Result<bool, String> {
        let left = self.aggregate(values)?;
        Ok(match self.op {
            CmpOp::Eq => left == self.than,
            CmpOp::Ne => left != self.than,
            CmpOp::Lt => left < self.than,
            CmpOp::Le => left <= self.than,
            CmpOp::Gt => left > self.than,
            CmpOp::Ge => left >= self.than,
        })
    }

    /// The wire form `(aggregate, op, than, skip)`.
    pub fn to_wire(&self) -> (u8, u8, i64, bool) {
        let aggregate = AGGREGATES
            .iter()
            .position(|a| *a == self.value)
            .unwrap_or(0) as u8;
        let op = OPS.iter().position(|o| *o == self.op).unwrap_or(0) as u8;
        (aggregate, op, self.than, self.otherwise == Otherwise::Skip)
    }

    /// From the wire form; `None` for unknown tags.
    pub fn from_wire((aggregate, op, than, skip): (u8, u8, i64, bool)) -> Option<Condition> {
        Some(Condition {
            value: *AGGREGATES.get(aggregate as usize)?,
            op: *OPS.get(op as usize)?,
            than,
            otherwise: if skip {
                Otherwise::Skip
            } else {
                Otherwise::Abort
            },
        })
    }

    /// Text for status and errors, e.g. `sum >= 6`.
    pub fn describe(&self) -> String {
        let op = match self.op {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        };
        format!("{:?} {op} {}", self.value, self.than).to_lowercase()
    }
}

/// One task of a script.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTask {
    /// The registered task name.
    pub name: String,
    /// Parameters, handed to the task as JSON.
    #[serde(default)]
    pub params: Option<serde_json::Value>,
    /// Fewest slaves (default: the script's).
    #[serde(default)]
    pub slaves_min: Option<u32>,
    /// Most slaves, 0 = all (default: the script's).
    #[serde(default)]
    pub slaves_max: Option<u32>,
    /// Run only if the previous task's values pass.
    #[serde(default)]
    pub when: Option<Condition>,
}

/// A task script (see the module documentation).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskScript {
    /// Its name, for status.
    #[serde(default = "default_name")]
    pub name: String,
    /// Fewest slaves for every task without its own bound.
    #[serde(default = "one")]
    pub slaves_min: u32,
    /// Most slaves (0 = all) for every task without its own bound.
    #[serde(default)]
    pub slaves_max: u32,
    /// Longest one task may run, in milliseconds.
    #[serde(default = "default_timeout")]
    pub task_timeout_ms: u64,
    /// How long the master waits for enough slaves, in milliseconds.
    #[serde(default = "default_wait")]
    pub slaves_wait_ms: u64,
    /// The tasks, in order.
    #[serde(rename = "task")]
    pub tasks: Vec<ScriptTask>,
}

fn default_name() -> String {
    "script".to_owned()
}
fn one() -> u32 {
    1
}
fn default_timeout() -> u64 {
    60_000
}
fn default_wait() -> u64 {
    5_000
}

impl TaskScript {
    /// A script of one task with `params` (bytes handed over as they are).
    pub fn single(task: &str, params: Bytes, slaves_min: u32, slaves_max: u32) -> SubmitRequest {
        SubmitRequest {
            group: 0,
            name: task.to_owned(),
            task_timeout_ms: default_timeout(),
            slaves_wait_ms: default_wait(),
            steps: vec![StepWire {
                task: task.to_owned(),
                params,
                slaves_min,
                slaves_max,
                condition: None,
            }],
        }
    }

    /// Parses TOML, or JSON when the text starts with `{`, and checks the rules.
    pub fn parse(text: &str) -> Result<TaskScript, ScriptError> {
        let script: TaskScript = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|error| ScriptError::Parse(error.to_string()))?
        } else {
            toml::from_str(text).map_err(|error| ScriptError::Parse(error.to_string()))?
        };
        script.check()?;
        Ok(script)
    }

    fn check(&self) -> Result<(), ScriptError> {
        let invalid = |text: String| Err(ScriptError::Invalid(text));
        if self.tasks.is_empty() || self.tasks.len() > SCRIPT_STEPS_MAX {
            return invalid(format!(
                "a script has 1 to {SCRIPT_STEPS_MAX} tasks, this one {}",
                self.tasks.len()
            ));
        }
        if self.name.len() > NAME_BYTES_MAX {
            return invalid(format!("script name longer than {NAME_BYTES_MAX} bytes"));
        }
        for (number, task) in self.tasks.iter().enumerate() {
            if task.name.is_empty() || task.name.len() > NAME_BYTES_MAX {
                return invalid(format!(
                    "task {number}: names have 1 to {NAME_BYTES_MAX} bytes"
                ));
            }
            let min = task.slaves_min.unwrap_or(self.slaves_min);
            let max = task.slaves_max.unwrap_or(self.slaves_max);
            if max != 0 && min > max {
                return invalid(format!(
                    "task {number} ({}): slaves_min {min} > slaves_max {max}",
                    task.name
                ));
            }
            if number == 0 && task.when.is_some() {
                return invalid(
                    "the first task cannot have a condition (no value before it)".into(),
                );
            }
        }
        Ok(())
    }

    /// The submission for `group`.
    pub fn to_request(&self, group: u16) -> SubmitRequest {
        SubmitRequest {
            group,
            name: self.name.clone(),
            task_timeout_ms: self.task_timeout_ms,
            slaves_wait_ms: self.slaves_wait_ms,
            steps: self
                .tasks
                .iter()
                .map(|task| StepWire {
                    task: task.name.clone(),
                    params: match &task.params {
                        Some(value) => Bytes::from(value.to_string()),
                        None => Bytes::new(),
                    },
                    slaves_min: task.slaves_min.unwrap_or(self.slaves_min),
                    slaves_max: task.slaves_max.unwrap_or(self.slaves_max),
                    condition: task.when.map(|when| when.to_wire()),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::int_value;
    use proptest::prelude::*;

    const TOML_SCRIPT: &str = r#"
name = "three"
slaves_min = 3
[[task]]
name = "builtin.value"
params = { value = 2 }
[[task]]
name = "builtin.value"
params = { value = 5 }
when = { value = "sum", op = ">=", than = 6 }
[[task]]
name = "builtin.sleep"
slaves_min = 2
slaves_max = 2
when = { value = "max", op = "<", than = 0, otherwise = "skip" }
"#;

    #[test]
    fn toml_script_parses_with_defaults_and_conditions() {
        let script = TaskScript::parse(TOML_SCRIPT).unwrap();
        assert_eq!(script.name, "three");
        assert_eq!(script.tasks.len(), 3);
        assert_eq!(script.task_timeout_ms, 60_000);
        let when = script.tasks[1].when.unwrap();
        assert_eq!(
            (when.value, when.op, when.than),
            (Aggregate::Sum, CmpOp::Ge, 6)
        );
        assert_eq!(when.otherwise, Otherwise::Abort);
        assert_eq!(script.tasks[2].when.unwrap().otherwise, Otherwise::Skip);
        let request = script.to_request(7);
        assert_eq!(request.group, 7);
        assert_eq!(request.steps[0].params, Bytes::from(r#"{"value":2}"#));
        assert_eq!(
            (request.steps[1].slaves_min, request.steps[2].slaves_max),
            (3, 2)
        );
    }

    #[test]
    fn json_script_parses_like_toml() {
        let json = r#"{"name":"j","task":[{"name":"a"},{"name":"b","when":{"value":"first","op":"==","than":1}}]}"#;
        let script = TaskScript::parse(json).unwrap();
        assert_eq!(script.tasks[1].when.unwrap().value, Aggregate::First);
        assert_eq!(script.slaves_min, 1);
    }

    #[test]
    fn bad_scripts_are_explained() {
        for (text, needle) in [
            ("name = 'x'\ntask = []", "1 to"),
            ("[[task]]\nname = 'a'\nwhen = { value = 'sum', op = '>', than = 1 }", "first task"),
            ("[[task]]\nname = 'a'\nslaves_min = 3\nslaves_max = 2", "slaves_min 3 > slaves_max 2"),
            ("[[task]]\nname = 'a'\nbogus = 1", "unknown field"),
            ("[[task]]\nname = 'a'\n[[task]]\nname = 'b'\nwhen = { value = 'avg', op = '>', than = 1 }", "unknown variant"),
        ] {
            let error = TaskScript::parse(text).unwrap_err().to_string();
            assert!(error.contains(needle), "{text:?}: {error}");
        }
    }

    #[test]
    fn conditions_aggregate_and_compare() {
        let values = [int_value(1), int_value(4), int_value(-2)];
        let condition = |value, op, than| Condition {
            value,
            op,
            than,
            otherwise: Otherwise::Abort,
        };
        assert_eq!(
            condition(Aggregate::Sum, CmpOp::Eq, 3).holds(&values),
            Ok(true)
        );
        assert_eq!(
            condition(Aggregate::Min, CmpOp::Lt, -1).holds(&values),
            Ok(true)
        );
        assert_eq!(
            condition(Aggregate::Max, CmpOp::Gt, 4).holds(&values),
            Ok(false)
        );
        assert_eq!(
            condition(Aggregate::First, CmpOp::Ne, 1).holds(&values),
            Ok(false)
        );
        assert!(condition(Aggregate::Sum, CmpOp::Eq, 0)
            .holds(&[Bytes::from_static(b"x")])
            .is_err());
        assert!(condition(Aggregate::Sum, CmpOp::Eq, 0).holds(&[]).is_err());
    }

    proptest! {
        #[test]
        fn condition_wire_form_round_trips(a in 0u8..4, o in 0u8..6, than in any::<i64>(), skip in any::<bool>()) {
            let condition = Condition::from_wire((a, o, than, skip)).unwrap();
            prop_assert_eq!(condition.to_wire(), (a, o, than, skip));
        }

        #[test]
        fn parser_never_panics(text in ".{0,200}") {
            let _ = TaskScript::parse(&text);
        }
    }
}
