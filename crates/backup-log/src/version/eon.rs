//! Eon visits on the version manager's side: holding the epoch while a visit runs, when
//! the last full visit started, and re-stamping an old chunk with a fresh version (see
//! the [parent module](super): no current version may become half an epoch space old).
//!
//! Caller: the reorganizer's eon visit (and its periodic pick, which asks how many epochs
//! passed since the last one).

use super::{Version, VersionManager, VersionState};

impl VersionManager {
    /// Holds the epoch (see the field) or releases it, ending it now if it is due.
    pub fn hold_epoch(&mut self, hold: bool) {
        self.hold = hold;
        if !hold && self.buffer.len() >= self.seal_entries {
            self.seal();
        }
    }

    /// Whether the epoch is held ([`VersionManager::hold_epoch`]).
    pub fn epoch_held(&self) -> bool {
        self.hold
    }

    /// Epochs since the last full visit started.
    pub fn epochs_since_full_visit(&self) -> u16 {
        self.epoch.wrapping_sub(self.last_full_visit_epoch)
    }

    /// Records that a full visit of the log started at epoch `epoch`.
    pub fn full_visit_started(&mut self, epoch: u16) {
        self.last_full_visit_epoch = epoch;
    }

    /// Gives `cid`, whose current state the caller saw as `expected` in a snapshot taken
    /// in epoch `snapshot_epoch`, a fresh version in the current epoch with the same
    /// deleted flag (moving an old entry or remove into the current eon). `None` if the
    /// chunk changed since, or the epoch ended since the snapshot (then the caller cannot
    /// tell; it retries on a later pass).
    pub fn restamp(
        &mut self,
        cid: u64,
        expected: VersionState,
        snapshot_epoch: u16,
    ) -> Option<Version> {
        // A chunk with a chain in progress keeps its versions: a fresh one would hide the
        // chain once its last link is in.
        if self.epoch != snapshot_epoch
            || self
                .chains
                .iter()
                .chain(&self.abandoned)
                .any(|c| c.cid == cid)
        {
            return None;
        }
        match self.buffer.get(cid) {
            Some(slot)
                if VersionState {
                    version: Version {
                        epoch: self.epoch,
                        version: slot.version(),
                    },
                    deleted: slot.deleted(),
                } == expected => {}
            Some(_) => return None,
            None => {}
        }
        self.assign(cid, expected.deleted, 0).ok()
    }
}
