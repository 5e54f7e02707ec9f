//! Open chains: chained chunks appended link by link, and the fresh copies of old chains
//! an eon visit writes, whose version must not count before every link is in (and
//! durable). See "Open chains" in the [parent module](super) and "Chained chunks" in
//! `docs/log-format.md`.
//!
//! Callers: the engine's append path (`assign_chain`, `close_chain`), every snapshot
//! (`prune_chains`), the reorganizer (`chain_links`, `restamp_chain`, `finish_chain`,
//! `abandon_chain`).

use super::manager::AssignBlocked;
use super::{Version, VersionManager, VersionState};

/// A chained chunk appended link by link: registered with its first link, its last link
/// pushed or not yet (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct OpenChain {
    /// The chunk.
    pub cid: u64,
    /// The version all its links carry.
    pub version: Version,
    /// The chunk's state as snapshots showed it just before the first link: its complete
    /// version then. `None`: the RAM did not know the chunk, the version log's state
    /// counts (it cannot name this chain, see [`VersionManager::sealed_ready`]).
    pub prior: Option<VersionState>,
    /// `None` while links are still to come; the last link's sequence number once it was
    /// pushed (the chain is then dropped once that is durable).
    pub last_seq: Option<u64>,
}

impl VersionManager {
    /// A new version for the first link of a chain of `cid` appended link by link, the
    /// append with sequence number `seq`; registers the chain as open (see the module
    /// docs). Its state before, as snapshots show it, is kept as the chain's `prior`.
    pub fn assign_chain(&mut self, cid: u64, seq: u64) -> Result<Version, AssignBlocked> {
        let prior = self.visible(cid);
        let version = self.assign(cid, false, seq)?;
        self.chains.push(OpenChain {
            cid,
            version,
            prior,
            last_seq: None,
        });
        Ok(version)
    }

    /// Records that the last link of the open chain of `cid` with `version` was pushed as
    /// the append `seq`: from now on snapshots show its version (they are waited for
    /// until durable) and its epoch may be written once `seq` is durable.
    pub fn close_chain(&mut self, cid: u64, version: Version, seq: u64) {
        if let Some(c) = self
            .chains
            .iter_mut()
            .find(|c| c.cid == cid && c.version == version && c.last_seq.is_none())
        {
            c.last_seq = Some(seq);
        }
    }

    /// Forgets the chains whose last link is durable (every append up to `durable_seq`
    /// is): their links are then all on disk, found by every reader.
    pub fn prune_chains(&mut self, durable_seq: u64) {
        self.chains
            .retain(|c| c.last_seq.is_none_or(|last| last > durable_seq));
    }

    /// The chains not known durable: (CID, version) of links a reorganization pass must
    /// keep although its table names another version as current (the chain's version
    /// becomes current with its last link; until then the previous one is).
    pub fn chain_links(&self) -> Vec<(u64, Version)> {
        self.chains.iter().map(|c| (c.cid, c.version)).collect()
    }

    /// The chunks with a chain registered now, open or abandoned: their state in snapshots
    /// is by design the one before the chain (the consistency check leaves them out).
    pub fn chunks_with_chains(&self) -> Vec<u64> {
        self.chains
            .iter()
            .chain(&self.abandoned)
            .map(|c| c.cid)
            .collect()
    }

    /// The chains registered now (tests).
    pub fn open_chains(&self) -> &[OpenChain] {
        &self.chains
    }

    /// The state of `cid` as snapshots show it: [`VersionManager::lookup`], with an open
    /// chain's version replaced by the state before it.
    pub(super) fn visible(&self, cid: u64) -> Option<VersionState> {
        let state = self.lookup(cid)?;
        match self
            .open_chain(cid, state)
            .or_else(|| self.abandoned_chain(cid, state))
        {
            Some(c) => c.prior,
            None => Some(state),
        }
    }

    /// The abandoned refresh whose version `state` is, if any.
    pub(super) fn abandoned_chain(&self, cid: u64, state: VersionState) -> Option<&OpenChain> {
        if state.deleted {
            return None;
        }
        self.abandoned
            .iter()
            .find(|c| c.cid == cid && c.version == state.version)
    }

    /// The open chain (last link still to come) whose version `state` is, if any.
    pub(super) fn open_chain(&self, cid: u64, state: VersionState) -> Option<&OpenChain> {
        if state.deleted {
            return None;
        }
        self.chains
            .iter()
            .find(|c| c.cid == cid && c.version == state.version && c.last_seq.is_none())
    }

    /// [`VersionManager::restamp`] for a chained chunk (not removed) whose links an eon
    /// visit is about to write again with the fresh version: the version is registered as
    /// an open chain with `expected` as its prior state, so snapshots keep showing
    /// `expected` and the version log does not name the fresh version (`sealed_ready`)
    /// until the caller either finishes the chain ([`VersionManager::finish_chain`], once
    /// every fresh link is durable) or abandons it ([`VersionManager::abandon_chain`]).
    pub fn restamp_chain(
        &mut self,
        cid: u64,
        expected: VersionState,
        snapshot_epoch: u16,
    ) -> Option<Version> {
        if expected.deleted {
            return None;
        }
        let version = self.restamp(cid, expected, snapshot_epoch)?;
        self.chains.push(OpenChain {
            cid,
            version,
            prior: Some(expected),
            last_seq: None,
        });
        Some(version)
    }

    /// Every link of the refreshed chain of `cid` with `version` is durable: the version
    /// counts from now on (unless the chunk was written since, which is newer anyway).
    pub fn finish_chain(&mut self, cid: u64, version: Version) {
        self.chains
            .retain(|c| !(c.cid == cid && c.version == version && c.last_seq.is_none()));
    }

    /// The refreshed chain of `cid` with `version` will not be completed (the pass could
    /// not write every fresh link): the chunk keeps its prior state for good. Its version
    /// stays taken in the buffer (a later write of the chunk in this epoch gets a newer
    /// one, never the same, so links of the two are never mixed) but is hidden from
    /// snapshots and left out of the version log; if the epoch was sealed meanwhile its
    /// record is dropped from the sealed epoch. A newer write or remove of the chunk since
    /// needs nothing.
    pub fn abandon_chain(&mut self, cid: u64, version: Version) {
        let Some(i) = self
            .chains
            .iter()
            .position(|c| c.cid == cid && c.version == version && c.last_seq.is_none())
        else {
            return;
        };
        let chain = self.chains.remove(i);
        let state = VersionState {
            version,
            deleted: false,
        };
        if version.epoch == self.epoch {
            if self
                .buffer
                .get(cid)
                .is_some_and(|s| s.version() == version.version && !s.deleted())
            {
                self.abandoned.push(chain);
            }
        } else if let Some(sealed) = self.sealed.as_mut().filter(|s| s.epoch == version.epoch) {
            // Never shared here: `sealed_ready` holds back an epoch with an open chain.
            std::sync::Arc::make_mut(&mut sealed.records)
                .retain(|r| !(r.cid == cid && r.state == state));
        }
    }
}
