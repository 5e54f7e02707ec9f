//! Resident memory ahead of use: making region pages resident before creates reach them
//! (see "Resident memory ahead of use" in the [crate docs](crate)).
//!
//! Pages are populated, never written, so contents never change and both calls are safe
//! while the manager is in use. `keep_resident_ahead` is serialized by the lock on its
//! state, which records only how far above the allocator's top pages were made resident.
//! Called in the background: by a peer's keeper thread (`keep_resident_ahead`) and at
//! start-up or before a bulk load (`prefault`).

use std::time::Duration;

use crate::alloc;
use crate::{MemError, MemResult, MemoryManager};

/// Where [`MemoryManager::keep_resident_ahead`] stands.
#[derive(Debug, Default)]
pub(crate) struct ResidentAhead {
    /// The allocator's top at the last call.
    top: u64,
    /// End of what was made resident above that top.
    end: u64,
    /// A top-up is under way (budgeted calls go on until the reserve is full).
    filling: bool,
}

impl MemoryManager {
    /// Makes the first `bytes` of the data region (rounded up to whole 64 KiB pages, at
    /// most the region) resident in RAM now, without changing any content, so that a later
    /// burst of creates there (a recovery of a failed peer's zone, a bulk load) takes no
    /// page faults: the allocator fills the region from its start. The pages then count
    /// as used RAM of this process even while they hold no chunk. Safe to call while the
    /// manager is in use, from any thread. It works in 2 MiB steps (a huge page) and may
    /// take a while (the OS zeroes every page, and compacts memory for huge pages), so
    /// callers run it in the background; a non-zero `pause` is slept after every step, so
    /// that the rest of the process (heartbeats, requests) and other processes keep their
    /// share of the CPU: several peers of one machine that prefault at once without a
    /// pause starved their heartbeat replies past a 1 s failure timeout on 2 cores.
    /// Returns the bytes made resident: 0 where the OS cannot do it without writing
    /// (Linux before 5.14).
    pub fn prefault(&self, bytes: u64, pause: Duration) -> MemResult<u64> {
        const STEP: u64 = 2 << 20;
        let region = self.allocator.region();
        let end = bytes
            .div_ceil(alloc::PAGE_BYTES)
            .saturating_mul(alloc::PAGE_BYTES)
            .min(region.bytes());
        let mut done = 0;
        while done < end {
            let len = STEP.min(end - done);
            match region.populate(done, len) {
                Ok(true) => {
                    done += len;
                    if !pause.is_zero() && done < end {
                        std::thread::sleep(pause);
                    }
                }
                Ok(false) => return Ok(0),
                Err(error) => {
                    return Err(MemError::RegionUnavailable {
                        bytes: end,
                        reason: format!("making pages resident: {error}"),
                    })
                }
            }
        }
        Ok(done)
    }

    /// Makes the `reserve` bytes above the allocator's never-used top resident (rounded up
    /// to whole 64 KiB pages, at most to the end of the region), as far as an earlier call
    /// has not already: one top-up of a reserve that a keeper thread calls again from time
    /// to time. A top-up starts only once less than half the reserve is left above the
    /// top (so a burst of creates into the reserve is not joined by more zeroing) and
    /// then goes on, call by call, until the reserve is full. Chunks created in a burst
    /// later (a restorer inserting a recovered zone) then land in pages the OS zeroed
    /// beforehand instead of taking a page fault each,
    /// wherever in the region the peer's own chunks have brought the top by then. When the
    /// top came down since the last call (freed pages at the top go back to the OS), the
    /// reserve is made resident again from the new top. Works in 2 MiB steps with `pause`
    /// slept after each (see [`MemoryManager::prefault`]), and stops after `budget` bytes
    /// (the next call goes on), so that a keeper looks at the top again often; contents
    /// never change, so it is safe while the manager is in use. Returns the bytes made
    /// resident by this call: 0 where the OS cannot do it without writing (Linux before
    /// 5.14, Miri). Calls are serialized.
    pub fn keep_resident_ahead(
        &self,
        reserve: u64,
        budget: u64,
        pause: Duration,
    ) -> MemResult<u64> {
        const STEP: u64 = 2 << 20;
        let region = self.allocator.region();
        let mut state = self.resident_ahead.lock();
        let top = self.allocator.top_bytes();
        if top < state.top {
            state.end = top;
        }
        state.top = top;
        let end = top
            .saturating_add(reserve)
            .div_ceil(alloc::PAGE_BYTES)
            .saturating_mul(alloc::PAGE_BYTES)
            .min(region.bytes());
        let mut cursor = state.end.max(top);
        if !state.filling && (cursor - top) >= reserve.div_ceil(2) {
            return Ok(0);
        }
        state.filling = true;
        let mut done = 0;
        while cursor < end && done < budget {
            // Whole aligned huge pages where possible.
            let step_end = ((cursor / STEP + 1) * STEP).min(end);
            match region.populate(cursor, step_end - cursor) {
                Ok(true) => {
                    done += step_end - cursor;
                    cursor = step_end;
                    state.end = cursor;
                    if !pause.is_zero() && cursor < end {
                        std::thread::sleep(pause);
                    }
                }
                Ok(false) => {
                    state.filling = false;
                    return Ok(0);
                }
                Err(error) => {
                    state.filling = false;
                    return Err(MemError::RegionUnavailable {
                        bytes: end - cursor,
                        reason: format!("making pages resident: {error}"),
                    });
                }
            }
        }
        if cursor >= end {
            state.filling = false;
        }
        Ok(done)
    }

    /// Byte offset of the allocator's never-used top of the region: the chunks created
    /// so far lie below it (with the free spans between them).
    pub fn top_bytes(&self) -> u64 {
        self.allocator.top_bytes()
    }
}
