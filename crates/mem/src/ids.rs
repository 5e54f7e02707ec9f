//! Local IDs: the creator-local half of the CIDs this node hands out (see "Local IDs" in
//! the [crate docs](crate)).
//!
//! Fresh IDs come from one node-wide counter, which threads take in blocks of
//! `LOCAL_ID_BLOCK` (one block per allocator shard, so threads creating at once write to
//! different cache lines of the table); removed own IDs wait in a bounded store of spare
//! IDs and go out first. Invariants: the counter never stays above `LOCAL_ID_MAX + 1` (a
//! take that would pass it is undone and fails with `LocalIdsExhausted`), and an ID is
//! used only after its entry was claimed with compare-and-swap from `Free`/`Removed`, so
//! an ID that `create_with_id` took meanwhile is skipped, never shared. Called by the
//! create paths (`create`), and by `check_consistency` (`own`).

use std::sync::atomic::Ordering;

use crate::entry::{self, State};
use crate::{ChunkId, MemError, MemResult, MemoryManager, LOCAL_ID_BITS, LOCAL_ID_MAX};

/// Local IDs a thread takes from the node's counter at a time, so that two threads creating
/// chunks write to different cache lines of the table.
const LOCAL_ID_BLOCK: u64 = 64;

impl MemoryManager {
    /// Fresh local IDs are handed out from `first` on (no effect if they already are). A
    /// restarted node calls it before its first create, so that it never hands out an ID
    /// an earlier incarnation may have used. IDs below `first` stay free (a gap).
    pub fn start_local_ids_at(&self, first: u64) {
        self.next_local_id
            .fetch_max(first.min(LOCAL_ID_MAX + 1), Ordering::Relaxed);
    }

    /// One past the highest local ID handed out (or reserved for a thread's block) so far:
    /// no fresh ID at or above it was given to anyone yet.
    pub fn local_id_mark(&self) -> u64 {
        self.next_local_id.load(Ordering::Relaxed)
    }

    /// The CID of this node's local ID `local_id`.
    #[inline]
    pub(crate) fn own(&self, local_id: u64) -> ChunkId {
        ChunkId::from_raw((u64::from(self.config.node_id.0) << LOCAL_ID_BITS) | local_id)
    }

    /// A local ID for a new chunk: a spare one if any, else the next of this thread's block.
    #[inline]
    pub(crate) fn take_local_id(&self) -> MemResult<u64> {
        if self.spare_count.load(Ordering::Relaxed) > 0 {
            let mut spare = self.spare_local_ids.lock();
            if let Some(local_id) = spare.pop() {
                self.spare_count.store(spare.len(), Ordering::Relaxed);
                return Ok(local_id);
            }
        }
        let mut block = self.local_id_blocks[self.allocator.thread_shard()].0.lock();
        if block.0 == block.1 {
            let start = self
                .next_local_id
                .fetch_add(LOCAL_ID_BLOCK, Ordering::Relaxed);
            if start > LOCAL_ID_MAX {
                self.next_local_id
                    .fetch_sub(LOCAL_ID_BLOCK, Ordering::Relaxed);
                return Err(MemError::LocalIdsExhausted);
            }
            *block = (start, (start + LOCAL_ID_BLOCK).min(LOCAL_ID_MAX + 1));
        }
        debug_assert!(
            block.0 < block.1 && block.1 <= LOCAL_ID_MAX + 1,
            "a shard's block of local IDs is never empty here nor past the last ID"
        );
        let local_id = block.0;
        block.0 += 1;
        Ok(local_id)
    }

    /// `count` local IDs: spare ones first, then a contiguous fresh range.
    #[inline]
    pub(crate) fn take_local_ids(&self, count: usize, out: &mut Vec<u64>) -> MemResult<()> {
        debug_assert!(
            out.is_empty(),
            "`out` counts the IDs taken so far: start empty"
        );
        out.reserve(count);
        if self.spare_count.load(Ordering::Relaxed) > 0 {
            let mut spare = self.spare_local_ids.lock();
            let take = count.min(spare.len());
            let from = spare.len() - take;
            out.extend(spare.drain(from..).rev());
            self.spare_count.store(spare.len(), Ordering::Relaxed);
        }
        let fresh = (count - out.len()) as u64;
        if fresh > 0 {
            let start = self.next_local_id.fetch_add(fresh, Ordering::Relaxed);
            if start
                .checked_add(fresh)
                .is_none_or(|end| end > LOCAL_ID_MAX + 1)
            {
                self.next_local_id.fetch_sub(fresh, Ordering::Relaxed);
                self.give_back_local_ids(out);
                return Err(MemError::LocalIdsExhausted);
            }
            out.extend(start..start + fresh);
        }
        Ok(())
    }

    /// Returns IDs taken but not used to the spare store (as far as it has room).
    #[inline]
    pub(crate) fn give_back_local_ids(&self, local_ids: &mut Vec<u64>) {
        let mut spare = self.spare_local_ids.lock();
        let room = self.config.spare_local_ids_max.saturating_sub(spare.len());
        spare.extend(local_ids.drain(..).take(room));
        debug_assert!(spare.len() <= self.config.spare_local_ids_max);
        self.spare_count.store(spare.len(), Ordering::Relaxed);
    }

    /// Claims the entry of a fresh local ID for a new value (`Free`/`Removed` → `value`).
    #[inline]
    pub(crate) fn claim(&self, local_id: u64, value: u64) -> Option<ChunkId> {
        let cid = self.own(local_id);
        let entry = self.table.entry_or_create(cid);
        let current = entry.load(Ordering::Relaxed);
        if matches!(entry::state(current), State::Free | State::Removed)
            && entry
                .compare_exchange(current, value, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        {
            return Some(cid);
        }
        None
    }

    /// Installs `value` under a new own CID, taking further IDs if one turns out taken
    /// (by `create_with_id` of an own ID, which is allowed).
    #[inline]
    pub(crate) fn install_new(&self, value: u64) -> MemResult<ChunkId> {
        loop {
            let local_id = self.take_local_id()?;
            if let Some(cid) = self.claim(local_id, value) {
                return Ok(cid);
            }
        }
    }
}
