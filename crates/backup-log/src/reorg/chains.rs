//! Eon visits of chained chunks: the links of an old chain are kept aside while the
//! visit reads the log ([`ChainRefresh`], bounded by `chain_refresh_bytes`), then the
//! chain is written again with a fresh version, registered as an open chain until the
//! output holding it is synced ([`Reorganizer::refresh_chains`]).
//!
//! Invariant: the old chain stays complete on disk until its fresh copy is durable (its
//! links were copied as they are, and sources are freed only after their copies are
//! synced). See "Versions, epochs, eons" in `docs/log-format.md`.

use super::Reorganizer;
use crate::error::LogResult;
use crate::header::{self, ChainLink, EncodeArgs};
use crate::seclog::SEGMENT_HEADER_BYTES;
use crate::version::{CidMap, Version, VersionState};
use crate::zone::Zone;

/// An old chained chunk seen by an eon visit: its current state and its links' payloads
/// by index.
pub(crate) struct StashedChain {
    pub(super) state: VersionState,
    links: Vec<Option<Vec<u8>>>,
    bytes: usize,
}

/// The old chained chunks an eon visit writes again (see [`Reorganizer::refresh_chains`]).
pub(super) struct ChainRefresh {
    pub(super) chains: CidMap<StashedChain>,
    /// Chains seen but not taken (over the budget): their later links are skipped.
    skipped: CidMap<()>,
    /// Bytes reserved by the chains taken.
    reserved: usize,
    /// The largest payload of one link.
    link_max: usize,
    /// `LogConfig::chain_refresh_bytes`: each chain reserves its whole size (links × the
    /// largest link) at its first link; a chain that would go over is left for a later
    /// visit, except the first of a visit, which is always taken (so a chain up to
    /// `chunk_bytes_max` is refreshed too, and every visit makes progress).
    budget: usize,
}

impl ChainRefresh {
    pub(super) fn new(link_max: usize, budget: usize) -> ChainRefresh {
        ChainRefresh {
            budget,
            chains: CidMap::default(),
            skipped: CidMap::default(),
            reserved: 0,
            link_max,
        }
    }

    /// Keeps link `link` of `cid` (current state `state`). False if the chain is left for
    /// a later visit (over the budget).
    pub(super) fn add(
        &mut self,
        cid: u64,
        state: VersionState,
        link: ChainLink,
        payload: &[u8],
    ) -> bool {
        if self.skipped.contains_key(&cid) {
            return false;
        }
        if !self.chains.contains_key(&cid) {
            let reserve = usize::from(link.count) * self.link_max;
            if self.reserved > 0 && self.reserved + reserve > self.budget {
                self.skipped.insert(cid, ());
                return false;
            }
            self.reserved += reserve;
            self.chains.insert(
                cid,
                StashedChain {
                    state,
                    links: vec![None; usize::from(link.count)],
                    bytes: 0,
                },
            );
        }
        let Some(chain) = self.chains.get_mut(&cid) else {
            return true;
        };
        if chain.state != state || chain.links.len() != usize::from(link.count) {
            return true; // not the current chain (the table names one version only)
        }
        let Some(slot) = chain.links.get_mut(usize::from(link.index)) else {
            return true;
        };
        if slot.is_some() {
            return true; // a duplicate copy (left by a crash after a pass's output)
        }
        chain.bytes += payload.len();
        *slot = Some(payload.to_vec());
        true
    }
}

impl Reorganizer<'_> {
    /// Gives every complete chain of `chains` (old chained chunks an eon visit saw whole)
    /// a fresh version registered as an open chain ([`VersionManager::restamp_chain`](crate::version::VersionManager::restamp_chain)) and
    /// appends its links with that version to the pass's output, writing out full
    /// segments as the loop over the candidates does. Returns the refreshed chains, or
    /// `None` if a segment could not be written for lack of a free one (the pass stops;
    /// the chains are abandoned), and whether some chain had to be left for a later visit.
    /// The caller finishes the chains once the last output is written and synced, or
    /// abandons them. The old links were copied as they are, so the chunk stays complete
    /// in its old version whatever happens before then.
    #[allow(clippy::type_complexity)]
    pub(super) fn refresh_chains(
        &self,
        zone: &Zone,
        chains: CidMap<StashedChain>,
        snapshot_epoch: u16,
        out: &mut Vec<u8>,
        pending: &mut Vec<usize>,
        stamp: u32,
    ) -> (LogResult<Option<Vec<(u64, Version)>>>, bool) {
        let segment_bytes = self.config.segment_bytes as usize;
        let room = segment_bytes - SEGMENT_HEADER_BYTES - 1;
        let mut refreshed: Vec<(u64, Version)> = Vec::new();
        let mut failed = false;
        let abandon = |refreshed: &[(u64, Version)]| {
            let mut vm = zone.versions.lock();
            for &(cid, version) in refreshed {
                vm.abandon_chain(cid, version);
            }
        };
        let mut chains: Vec<(u64, StashedChain)> = chains.into_iter().collect();
        chains.sort_unstable_by_key(|(cid, _)| *cid);
        for (cid, chain) in chains {
            if chain.links.iter().any(Option::is_none) {
                failed = true; // not seen whole (cannot happen in a visit of every segment)
                continue;
            }
            // Room for the output so far and this chain's links, with a segment to spare;
            // else the next visit tries again. The sources done so far are freed only once
            // the output holding their valid entries is written: write it first if that
            // may give the room (the old links it holds are then durable where they are).
            let need = (out.len() + chain.bytes + 64 * chain.links.len()).div_ceil(room) + 1;
            if zone.log.lock().seclog.free_segments() < need && !pending.is_empty() {
                match self.write_out(zone, out, pending, stamp) {
                    Ok(true) => {}
                    other => {
                        // No free segment (the pass stops), or an error.
                        abandon(&refreshed);
                        return (other.map(|_| None), failed);
                    }
                }
            }
            let need = (out.len() + chain.bytes + 64 * chain.links.len()).div_ceil(room) + 1;
            if zone.log.lock().seclog.free_segments() < need {
                failed = true;
                continue;
            }
            let Some(fresh) = zone
                .versions
                .lock()
                .restamp_chain(cid, chain.state, snapshot_epoch)
            else {
                failed = true;
                continue;
            };
            refreshed.push((cid, fresh));
            let count = chain.links.len() as u8;
            let mut entry = Vec::new();
            for (index, payload) in chain.links.iter().enumerate() {
                let payload = payload.as_deref().unwrap_or_default();
                entry.clear();
                header::encode(
                    &EncodeArgs {
                        cid,
                        zone_owner: zone.id.owner,
                        epoch: fresh.epoch,
                        version: fresh.version,
                        chain: Some(ChainLink {
                            index: index as u8,
                            count,
                        }),
                    },
                    payload,
                    &mut entry,
                );
                if out.len() + entry.len() > room {
                    match self.write_out(zone, out, pending, stamp) {
                        Ok(true) => {}
                        other => {
                            // No free segment (the pass stops), or an error.
                            abandon(&refreshed);
                            return (other.map(|_| None), failed);
                        }
                    }
                }
                out.extend_from_slice(&entry);
            }
        }
        (Ok(Some(refreshed)), failed)
    }
}
