//! Where the terminal meets the cluster: [`connect`] builds the [`TermBackend`] for a list
//! of superpeers.
//!
//! Today there is no client backend on this branch: [`connect`] returns an
//! [`UnconnectedBackend`] that fails every command with the reason, so `help` and parsing
//! work and every cluster command says clearly why it cannot run. The backend over
//! `myriad-client` replaces the body of [`connect`] (the one place to change).

use serde_json::Value;

use super::{TermBackend, TermCommand};

/// Builds the backend for the cluster reached through `superpeers` (ID, `host:port`).
///
/// UNIMPLEMENTED: needs myriad-client's membership and chunk API. Replace the body with
/// a client-backed `TermBackend` (join through `superpeers`, then map each
/// [`TermCommand`] to a client call).
pub fn connect(superpeers: &[(u16, String)]) -> Box<dyn TermBackend> {
    let reason = if superpeers.is_empty() {
        "no cluster given (use --cluster DIR or --superpeers LIST)".to_string()
    } else {
        "unimplemented: needs myriad-client (the terminal's client backend is not built yet)"
            .to_string()
    };
    Box::new(UnconnectedBackend { reason })
}

/// A backend that fails every command with one reason.
#[derive(Debug, Clone)]
pub struct UnconnectedBackend {
    /// Why nothing can run.
    pub reason: String,
}

impl TermBackend for UnconnectedBackend {
    fn run(&mut self, _command: &TermCommand) -> Result<Value, String> {
        Err(self.reason.clone())
    }
}
