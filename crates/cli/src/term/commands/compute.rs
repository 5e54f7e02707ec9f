//! Parser of the compute commands (`compgrpls`, `compgrpstatus`, `comptask`,
//! `comptaskscript`, `compgrpjoin`, `compapp`) and of `graph500`, which runs the Graph500
//! tasks on a compute group.
//!
//! # Invariants
//! Same as the [parent](super): never panics; group IDs, slave counts and scales are checked
//! here so the backend only sees valid values.
//!
//! # Who calls it
//! [`super::parse_tokens`].

use super::{no_parser, parse_u64, Args, ParseError, TermCommand};

/// The compute commands (`comp*`).
pub(super) fn parse(a: &Args<'_>, name: &str) -> Result<TermCommand, ParseError> {
    let group = |index: usize| -> Result<u16, ParseError> {
        let text = a.required(index)?;
        parse_u64(text)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| a.error(format!("invalid group {text:?} (a 16-bit number)")))
    };
    let command = match name {
        "compgrpls" => {
            a.count(0, 0)?;
            TermCommand::CompGroupList
        }
        "compgrpstatus" => {
            a.count(1, 1)?;
            TermCommand::CompGroupStatus { group: group(0)? }
        }
        "comptask" => {
            a.count(2, 3)?;
            let params = a.get(2).unwrap_or_default().to_owned();
            if !params.is_empty() && serde_json::from_str::<serde_json::Value>(&params).is_err() {
                return Err(a.error(format!("parameters are not JSON: {params:?}")));
            }
            TermCommand::CompTask {
                group: group(0)?,
                task: a.required(1)?.to_owned(),
                params,
                slaves_min: a.option_u32("slaves-min")?.unwrap_or(1),
                slaves_max: a.option_u32("slaves-max")?.unwrap_or(0),
            }
        }
        "graph500" => {
            a.count(2, 2)?;
            TermCommand::Graph500 {
                group: group(0)?,
                scale: a.number_u32(1, "scale")?,
                slaves: a.option_u32("slaves")?.unwrap_or(0),
                roots: a.option_u32("roots")?.unwrap_or(64),
                edgefactor: a.option_u32("edgefactor")?.unwrap_or(16),
            }
        }
        "comptaskscript" => {
            a.count(2, 2)?;
            TermCommand::CompTaskScript {
                group: group(0)?,
                path: a.required(1)?.to_owned(),
            }
        }
        "compgrpjoin" => {
            a.count(3, 3)?;
            let role = a.required(2)?.to_ascii_lowercase();
            if !matches!(role.as_str(), "master" | "slave" | "none") {
                return Err(a.error(format!("unknown role {role:?} (master, slave, none)")));
            }
            TermCommand::CompGroupJoin {
                node: a.node(0)?,
                group: group(1)?,
                role,
            }
        }
        "compapp" => {
            a.count(2, 2)?;
            TermCommand::CompApp {
                node: a.node(0)?,
                name: a.required(1)?.to_owned(),
            }
        }
        other => return Err(no_parser(other)),
    };
    Ok(command)
}
