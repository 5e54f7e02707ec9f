//! Applications: user code that runs inside a peer (DXRAM's applications), started when
//! the peer has joined (`compute.apps` in the configuration) or from the terminal
//! (`compapp NODE NAME`).
//!
//! # Job
//! [`Application`] is the user's trait; [`AppContext`] gives it the peer's services, its
//! job service (local and remote jobs) and a stop flag set when the peer shuts down.
//!
//! # Invariants
//! An application runs on a thread of its own; its error or panic is logged and never
//! takes the peer down.
//!
//! # Who calls it
//! [`crate::service::ComputeService::start_app`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::client::Jobs;
use crate::env::PeerEnv;
use crate::service::ComputeService;

/// User code run inside a peer.
pub trait Application: Send + Sync + 'static {
    /// The name it is registered and started under.
    fn name(&self) -> &str;
    /// Runs until done (or until [`AppContext::should_stop`]).
    fn run(&self, ctx: &AppContext) -> Result<(), String>;
}

/// What a running application reaches.
pub struct AppContext {
    pub(crate) env: PeerEnv,
    pub(crate) service: Arc<ComputeService>,
    pub(crate) stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for AppContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppContext")
            .field("env", &self.env)
            .finish()
    }
}

impl AppContext {
    /// The peer's services.
    pub fn env(&self) -> &PeerEnv {
        &self.env
    }

    /// The peer's compute service (local jobs, role).
    pub fn service(&self) -> &Arc<ComputeService> {
        &self.service
    }

    /// Jobs on any peer, local ones on this peer's pool.
    pub fn jobs(&self) -> Jobs {
        Jobs::new(self.env.client.clone()).with_local(Arc::clone(&self.service))
    }

    /// Whether the peer is shutting down.
    pub fn should_stop(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}
