//! Logging control at run time (`loggerlevel`, `loginfo` in `myriad term`).
//!
//! # Job
//! - The process that sets up logging installs a [`FilterHook`] ([`install_filter_hook`]):
//!   a function that replaces the log filter (`tracing`'s `EnvFilter` syntax, per module)
//!   and returns the one in force. The node crate knows nothing of the subscriber.
//! - [`register`] adds the handlers of [`types::LOG_LEVEL`] (set or read the filter) and
//!   [`types::LOG_INFO`] (the log engine's figures as JSON, on a peer that keeps
//!   backups) to a node's handler set.
//!
//! # Invariants
//! - A process without a hook (tests, embedded nodes) answers `LOG_LEVEL` with an error,
//!   never a panic; a filter that does not parse changes nothing and is answered with why.
//! - The hook is installed once per process; later installs are ignored.
//!
//! # Who calls it
//! `myriad peer` / `myriad superpeer` (`init_tracing` installs the hook); the peer's
//! dispatch and the superpeer's handler set call [`register`].

use std::sync::{Arc, OnceLock};

use myriad_net::{Handlers, Incoming, NetError};
use myriad_proto::logctl::{LogLevelRequest, TextReply};
use myriad_proto::types;
use myriad_replication::BackupService;
use serde_json::json;

/// Sets the log filter (`Some`) or only reads it (`None`); the filter in force, or why
/// the new one was refused.
pub type FilterHook = Box<dyn Fn(Option<&str>) -> Result<String, String> + Send + Sync>;

static FILTER_HOOK: OnceLock<FilterHook> = OnceLock::new();

/// Installs this process's filter hook (the first call wins).
pub fn install_filter_hook(hook: FilterHook) {
    let _ = FILTER_HOOK.set(hook);
}

/// Applies a [`LogLevelRequest`] through the installed hook.
pub fn set_or_read(request: &LogLevelRequest) -> TextReply {
    let Some(hook) = FILTER_HOOK.get() else {
        return TextReply::Failed("this process cannot change its log filter".to_owned());
    };
    match hook(request.filter.as_deref()) {
        Ok(filter) => {
            if request.filter.is_some() {
                tracing::info!(%filter, "log filter changed");
            }
            TextReply::Ok(filter)
        }
        Err(reason) => TextReply::Failed(reason),
    }
}

/// The log engine's state as JSON text (zones, fill levels, write buffer, bytes written,
/// cleaning).
pub fn log_info(backup: &BackupService) -> String {
    let stats = backup.engine().stats();
    let used: u64 = stats.zones.iter().map(|z| z.used_bytes).sum();
    let capacity: u64 = stats.zones.iter().map(|z| z.capacity_bytes).sum();
    json!({
        "zones": stats.zones.len(),
        "used_bytes": used,
        "capacity_bytes": capacity,
        "free_segments": stats.zones.iter().map(|z| z.free_segments as u64).sum::<u64>(),
        "write_buffer_capacity_bytes": stats.write_buffer_capacity_bytes,
        "write_buffer_bytes": stats.write_buffer_bytes,
        "write_buffer_busy_halves": stats.write_buffer_busy_halves,
        "memory_bytes": stats.memory_bytes,
        "appended_entries": stats.appended_entries,
        "appended_payload_bytes": stats.appended_payload_bytes,
        "removes": stats.removes,
        "flushes": stats.flushes,
        "durable_seq": stats.durable_seq,
        "secondary_bytes_written": stats.secondary_device_bytes_written,
        "primary_bytes_written": stats.primary_bytes_written,
        "version_log_bytes_written": stats.version_log_bytes_written,
        "cleaning_passes": stats.reorg_passes,
        "cleaning_urgent_passes": stats.reorg_urgent_passes,
        "cleaned_segments": stats.reorg_segments_cleaned,
        "cleaning_bytes_written": stats.reorg_bytes_written,
        "zone_list": stats.zones.iter().map(|z| json!({
            "owner": format!("{:#06x}", z.zone.owner),
            "zone": z.zone.zone,
            "used_bytes": z.used_bytes,
            "capacity_bytes": z.capacity_bytes,
            "free_segments": z.free_segments,
        })).collect::<Vec<_>>(),
    })
    .to_string()
}

/// Registers [`types::LOG_LEVEL`] and [`types::LOG_INFO`]; `backup` answers `LOG_INFO`
/// (without it: "keeps no backups").
pub fn register(
    handlers: &mut Handlers,
    backup: Option<Arc<BackupService>>,
) -> Result<(), NetError> {
    handlers.register(types::LOG_LEVEL, |incoming: Incoming| {
        if !incoming.is_request() {
            return;
        }
        let reply = match LogLevelRequest::decode(incoming.payload.clone()) {
            Ok(request) => set_or_read(&request),
            Err(error) => TextReply::Failed(error.to_string()),
        };
        let _ = incoming.respond(reply.encode());
    })?;
    handlers.register(types::LOG_INFO, move |incoming: Incoming| {
        if !incoming.is_request() {
            return;
        }
        let reply = match &backup {
            Some(backup) => TextReply::Ok(log_info(backup)),
            None => TextReply::Failed("this node keeps no backups (no log engine)".to_owned()),
        };
        let _ = incoming.respond(reply.encode());
    })?;
    Ok(())
}
