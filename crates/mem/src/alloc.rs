//! The allocator: places chunks in the data region.
//!
//! Two levels, both on the one region:
//! - **Pages and spans.** The region is cut into 64 KiB pages. Runs of pages (spans) are
//!   handed out best-fit from free spans, else from the never-used top of the region. A freed
//!   span is returned to the OS (`madvise`) and coalesced with free neighbours, or with the
//!   top; so free space at page level never stays split (bounded fragmentation).
//! - **Slabs.** An allocation of up to 256 KiB goes to a slab: a span divided into equal
//!   slots of its size class (4-byte steps up to 128 bytes, then four classes per power of
//!   two, so at most 3 bytes of slack up to 128 bytes and at most 25% above). A slot is
//!   4-byte aligned and nothing in a chunk relies on more: chunk bytes are copied, never
//!   read in place as wider values.
//!   A slab keeps no per-slot header: free slots form a list threaded through the slots
//!   themselves, never-used slots are handed out by a bump index, and the chunk's length is
//!   in its table entry (chunks up to 2 KiB) or an 8-byte header (larger chunks). A slab
//!   that empties goes back to the page level. Larger allocations are whole spans.
//!
//! Concurrency: each (size class, shard) pair has its own lock and its own slabs; a thread
//! allocates from its shard, and a free locks the shard that owns the slab. The span
//! structure has one lock, taken only to get or return whole spans. Lock order: class
//! shards in index order, then spans.
//!
//! Per-page descriptors (28 bytes per 64 KiB page) and the free-span maps are the only
//! allocator metadata; per chunk the allocator stores nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard};

use crate::entry::{needs_header, REGION_BYTES_MAX};
use crate::error::MemError;
use crate::region::Region;

/// Bytes per page of the region.
pub(crate) const PAGE_BYTES: u64 = 64 * 1024;
/// Bytes of the length header in front of a large chunk.
pub(crate) const HEADER_BYTES: u64 = 8;
/// The largest allocation served by a slab; larger ones get whole spans.
pub(crate) const SLAB_SLOT_BYTES_MAX: u64 = 256 * 1024;
/// A slab holds at least this many slots (its span grows with the class).
const SLAB_SLOTS_MIN: u64 = 8;
/// Number of size classes.
pub(crate) const CLASS_COUNT: usize = 76;
/// Bytes between the classes up to 128 bytes, and the alignment of every slot.
pub(crate) const SLOT_ALIGN: u64 = 4;
/// Classes in 4-byte steps (4..=128).
const STEP_CLASSES: usize = 32;
/// The most shards per size class.
pub(crate) const SHARDS_MAX: usize = 64;

/// Bytes an allocation for a chunk of `length` bytes occupies before rounding.
#[inline]
pub(crate) fn allocation_bytes(length: usize) -> u64 {
    length as u64
        + if needs_header(length) {
            HEADER_BYTES
        } else {
            0
        }
}

/// The size class for an allocation of `bytes`, or `None` if it needs a span.
#[inline]
pub(crate) fn class_of(bytes: u64) -> Option<usize> {
    if bytes == 0 || bytes > SLAB_SLOT_BYTES_MAX {
        return None;
    }
    if bytes <= 128 {
        return Some((bytes.div_ceil(SLOT_ALIGN) - 1) as usize);
    }
    let power = 63 - (bytes - 1).leading_zeros() as u64; // 2^power < bytes <= 2^(power+1)
    let quarter = 1u64 << (power - 2);
    let step = (bytes - (1 << power)).div_ceil(quarter) - 1;
    Some(STEP_CLASSES + ((power - 7) * 4 + step) as usize)
}

/// Slot size of a class.
#[inline]
pub(crate) fn class_bytes(class: usize) -> u64 {
    if class < STEP_CLASSES {
        return (class as u64 + 1) * SLOT_ALIGN;
    }
    let group = (class - STEP_CLASSES) as u64 / 4;
    let step = (class - STEP_CLASSES) as u64 % 4;
    let power = 7 + group;
    (1 << power) + (step + 1) * (1 << (power - 2))
}

/// Pages per slab of a class.
fn slab_pages(class: usize) -> u32 {
    (class_bytes(class) * SLAB_SLOTS_MIN)
        .div_ceil(PAGE_BYTES)
        .max(1) as u32
}

/// Slots per slab of a class.
fn slab_slots(class: usize) -> u32 {
    (u64::from(slab_pages(class)) * PAGE_BYTES / class_bytes(class)) as u32
}

/// Pages of a span allocation of `bytes`.
fn span_pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE_BYTES)
}

/// Whether a chunk can change from `old` to `new` bytes without moving.
pub(crate) fn fits_in_place(old: usize, new: usize) -> bool {
    if needs_header(old) != needs_header(new) {
        return false;
    }
    let (old, new) = (allocation_bytes(old), allocation_bytes(new));
    match (class_of(old), class_of(new)) {
        (Some(a), Some(b)) => a == b,
        (None, None) => span_pages(old) == span_pages(new),
        _ => false,
    }
}

const KIND_UNUSED: u32 = 0;
const KIND_SLAB: u32 = 1;
const KIND_SLAB_TAIL: u32 = 2;
const KIND_SPAN: u32 = 3;
const KIND_SPAN_TAIL: u32 = 4;

/// What the allocator knows of one page. Fields are atomics so the structure needs no
/// `unsafe`; they are only changed under the lock that owns the page (its class shard for a
/// slab, the span lock otherwise), so relaxed ordering suffices.
#[derive(Default)]
struct PageDescriptor {
    /// One of the `KIND_*` values.
    kind: AtomicU32,
    /// Slab/span head: its page count. Tail: the head's page index.
    link: AtomicU32,
    /// Slab head: `class << 8 | shard`.
    owner: AtomicU32,
    /// Slab head: slots in use.
    used: AtomicU32,
    /// Slab head: first free slot + 1 (0: none); each free slot holds the next as a `u32`.
    free_head: AtomicU32,
    /// Slab head: slots ever handed out (slots at and above are untouched).
    bump: AtomicU32,
    /// Slab head: position + 1 in its shard's list of slabs with free slots (0: absent).
    partial_position: AtomicU32,
}

/// The state of one (class, shard) pair, under its own lock.
#[derive(Default)]
struct ClassShard {
    /// Head pages of this shard's slabs that have a free slot; the last one is used first.
    partial: Vec<u32>,
    /// Chunks (= slots) in use.
    chunks: u64,
    /// Payload bytes of those chunks.
    payload_bytes: u64,
    /// Slabs owned.
    slabs: u64,
    /// The one empty slab kept (in `partial`) against churn, if any.
    cached_empty: Option<u32>,
}

/// Free page spans, under the span lock.
struct Spans {
    /// Free span start → page count.
    by_start: BTreeMap<u32, u32>,
    /// (page count, start) of every free span, for best fit.
    by_size: BTreeSet<(u32, u32)>,
    /// Pages at and above `top` were never handed out (or were all returned).
    top: u32,
    /// Pages in the region.
    total: u32,
    /// Chunks stored in spans of their own.
    large_chunks: u64,
    /// Payload bytes of those chunks.
    large_payload_bytes: u64,
    /// Pages held by those chunks.
    large_pages: u64,
}

impl Spans {
    fn insert(&mut self, start: u32, pages: u32) {
        self.by_start.insert(start, pages);
        self.by_size.insert((pages, start));
    }

    fn remove(&mut self, start: u32, pages: u32) {
        self.by_start.remove(&start);
        self.by_size.remove(&(pages, start));
    }

    fn free_pages(&self) -> u64 {
        self.by_start
            .values()
            .map(|&pages| u64::from(pages))
            .sum::<u64>()
            + u64::from(self.total - self.top)
    }
}

/// Aligns its content to 128 bytes (two cache lines, for the adjacent-line prefetcher) so
/// per-shard state of different threads never shares a line.
#[repr(align(128))]
pub(crate) struct Padded<T>(pub(crate) T);

/// Counters of the allocator, see [`crate::MemoryStats`] for their meaning.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AllocatorStats {
    pub(crate) chunks: u64,
    pub(crate) payload_bytes: u64,
    pub(crate) allocated_bytes: u64,
    pub(crate) free_bytes: u64,
    pub(crate) largest_free_bytes: u64,
    pub(crate) free_page_bytes: u64,
    pub(crate) metadata_bytes: u64,
}

/// The allocator of one memory manager.
pub(crate) struct Allocator {
    region: Region,
    pages: Box<[PageDescriptor]>,
    spans: Mutex<Spans>,
    classes: Box<[Padded<Mutex<ClassShard>>]>,
    shards: usize,
}

static THREAD_COUNTER: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static THREAD_NUMBER: usize = THREAD_COUNTER.fetch_add(1, Relaxed);
}

impl Allocator {
    /// An allocator over a fresh region of `region_bytes` (rounded down to whole pages).
    pub(crate) fn new(
        region_bytes: u64,
        shards: usize,
        huge_pages: bool,
    ) -> Result<Allocator, MemError> {
        let pages = region_bytes / PAGE_BYTES;
        if pages == 0 || region_bytes > REGION_BYTES_MAX || pages > u64::from(u32::MAX) {
            return Err(MemError::InvalidConfig(format!(
                "region_bytes must be between {PAGE_BYTES} and {REGION_BYTES_MAX}, got {region_bytes}"
            )));
        }
        if shards == 0 || shards > SHARDS_MAX {
            return Err(MemError::InvalidConfig(format!(
                "shards must be 1..={SHARDS_MAX}, got {shards}"
            )));
        }
        let region = Region::new(pages * PAGE_BYTES, huge_pages)?;
        // SAFETY: `PageDescriptor` is made of atomics only, which are valid when zeroed;
        // the zeroed allocation commits memory lazily, as pages are touched.
        let descriptors =
            unsafe { Box::<[PageDescriptor]>::new_zeroed_slice(pages as usize).assume_init() };
        let classes = (0..CLASS_COUNT * shards)
            .map(|_| Padded(Mutex::new(ClassShard::default())))
            .collect();
        Ok(Allocator {
            region,
            pages: descriptors,
            spans: Mutex::new(Spans {
                by_start: BTreeMap::new(),
                by_size: BTreeSet::new(),
                top: 0,
                total: pages as u32,
                large_chunks: 0,
                large_payload_bytes: 0,
                large_pages: 0,
            }),
            classes,
            shards,
        })
    }

    /// The region the allocator places chunks in.
    #[inline]
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }

    /// The shard the calling thread allocates from.
    #[inline]
    pub(crate) fn thread_shard(&self) -> usize {
        THREAD_NUMBER.with(|number| *number) % self.shards
    }

    #[inline]
    fn class_shard(&self, class: usize, shard: usize) -> MutexGuard<'_, ClassShard> {
        self.classes[class * self.shards + shard].0.lock()
    }

    /// Allocates room for a chunk of `length` bytes (1 ≤ length, checked by the caller) and
    /// returns its offset. The length header of a large chunk is written here.
    pub(crate) fn allocate(&self, length: usize) -> Result<u64, MemError> {
        let bytes = allocation_bytes(length);
        let offset = match class_of(bytes) {
            Some(class) => {
                let shard = self.thread_shard();
                let mut state = self.class_shard(class, shard);
                let offset = self.take_slot(&mut state, class, shard)?;
                state.chunks += 1;
                state.payload_bytes += length as u64;
                offset
            }
            None => self.allocate_large(bytes, length)?,
        };
        self.write_header(offset, length);
        Ok(offset)
    }

    /// Allocates `count` chunks of `length` bytes each, appending their offsets to `out`.
    /// All or nothing: on failure nothing stays allocated.
    pub(crate) fn allocate_many(
        &self,
        length: usize,
        count: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), MemError> {
        let bytes = allocation_bytes(length);
        let start = out.len();
        out.reserve(count);
        let result = match class_of(bytes) {
            Some(class) => {
                let shard = self.thread_shard();
                let mut state = self.class_shard(class, shard);
                let result = self.take_slots(&mut state, class, shard, count, out);
                let made = (out.len() - start) as u64;
                state.chunks += made;
                state.payload_bytes += made * length as u64;
                result
            }
            None => (0..count).try_for_each(|_| {
                self.allocate_large(bytes, length)
                    .map(|offset| out.push(offset))
            }),
        };
        match result {
            Ok(()) => {
                if needs_header(length) {
                    for &offset in &out[start..] {
                        self.write_header(offset, length);
                    }
                }
                Ok(())
            }
            Err(error) => {
                for offset in out.drain(start..).collect::<Vec<_>>() {
                    self.free(offset, length);
                }
                Err(error)
            }
        }
    }

    fn write_header(&self, offset: u64, length: usize) {
        if needs_header(length) {
            // SAFETY: the allocation at `offset` was just made and is not yet reachable by
            // any other thread.
            unsafe { self.region.write_u64(offset, length as u64) };
        }
    }

    /// The payload offset and length of the allocation at `offset` for a chunk whose entry
    /// says `large`/`embedded_length`.
    ///
    /// # Safety
    /// The caller holds a lock of the chunk (its header is not being rewritten).
    #[inline]
    pub(crate) unsafe fn payload(
        &self,
        offset: u64,
        large: bool,
        embedded_length: usize,
    ) -> (u64, usize) {
        if large {
            // SAFETY: the header of a live large chunk is only written under its write lock,
            // which the caller's lock excludes.
            let length = unsafe { self.region.read_u64(offset) };
            (offset + HEADER_BYTES, length as usize)
        } else {
            (offset, embedded_length)
        }
    }

    /// The slab this shard allocates from next (the last one with a free slot), a new
    /// one if it has none.
    fn slab_with_room(
        &self,
        state: &mut ClassShard,
        class: usize,
        shard: usize,
    ) -> Result<u32, MemError> {
        if let Some(&head) = state.partial.last() {
            return Ok(head);
        }
        let slot_bytes = class_bytes(class);
        let pages = slab_pages(class);
        let head = self.allocate_span(pages, slot_bytes)?;
        let descriptor = &self.pages[head as usize];
        descriptor.kind.store(KIND_SLAB, Relaxed);
        descriptor.link.store(pages, Relaxed);
        descriptor
            .owner
            .store(((class as u32) << 8) | shard as u32, Relaxed);
        descriptor.used.store(0, Relaxed);
        descriptor.free_head.store(0, Relaxed);
        descriptor.bump.store(0, Relaxed);
        for tail in head + 1..head + pages {
            self.pages[tail as usize]
                .kind
                .store(KIND_SLAB_TAIL, Relaxed);
            self.pages[tail as usize].link.store(head, Relaxed);
        }
        state.partial.push(head);
        descriptor
            .partial_position
            .store(state.partial.len() as u32, Relaxed);
        state.slabs += 1;
        Ok(head)
    }

    fn take_slot(
        &self,
        state: &mut ClassShard,
        class: usize,
        shard: usize,
    ) -> Result<u64, MemError> {
        let slot_bytes = class_bytes(class);
        let head = self.slab_with_room(state, class, shard)?;
        let descriptor = &self.pages[head as usize];
        let base = u64::from(head) * PAGE_BYTES;
        let free_head = descriptor.free_head.load(Relaxed);
        let slot = if free_head != 0 {
            let slot = free_head - 1;
            let mut next = [0u8; 4];
            // SAFETY: the slot is free (on this slab's free list) and the list is only read
            // and written under this class shard's lock, which we hold.
            unsafe {
                self.region
                    .read(base + u64::from(slot) * slot_bytes, &mut next)
            };
            descriptor
                .free_head
                .store(u32::from_le_bytes(next), Relaxed);
            slot
        } else {
            let slot = descriptor.bump.load(Relaxed);
            descriptor.bump.store(slot + 1, Relaxed);
            slot
        };
        descriptor.used.fetch_add(1, Relaxed);
        self.after_take(state, class, head);
        Ok(base + u64::from(slot) * slot_bytes)
    }

    /// Bookkeeping after slots of slab `head` were taken: it is no longer the cached
    /// empty slab, and it leaves the partial list when full.
    #[inline]
    fn after_take(&self, state: &mut ClassShard, class: usize, head: u32) {
        let descriptor = &self.pages[head as usize];
        if state.cached_empty == Some(head) {
            state.cached_empty = None;
        }
        if descriptor.free_head.load(Relaxed) == 0
            && descriptor.bump.load(Relaxed) == slab_slots(class)
        {
            state.partial.pop();
            descriptor.partial_position.store(0, Relaxed);
        }
    }

    /// Takes `count` slots, appending their offsets to `out`: free-listed slots one by
    /// one (as [`Allocator::take_slot`]), never-used ones of a slab as one run of its
    /// bump index. On an error the slots taken so far stay in `out`.
    fn take_slots(
        &self,
        state: &mut ClassShard,
        class: usize,
        shard: usize,
        count: usize,
        out: &mut Vec<u64>,
    ) -> Result<(), MemError> {
        let slot_bytes = class_bytes(class);
        let slots = slab_slots(class);
        let mut left = count;
        while left > 0 {
            let head = self.slab_with_room(state, class, shard)?;
            let descriptor = &self.pages[head as usize];
            if descriptor.free_head.load(Relaxed) != 0 {
                out.push(self.take_slot(state, class, shard)?);
                left -= 1;
                continue;
            }
            let bump = descriptor.bump.load(Relaxed);
            let run = (slots.saturating_sub(bump) as usize).min(left);
            let base = u64::from(head) * PAGE_BYTES;
            out.extend((0..run as u64).map(|i| base + (u64::from(bump) + i) * slot_bytes));
            // `run` is at most the slab's slot count, a u32.
            descriptor.bump.store(bump + run as u32, Relaxed);
            descriptor.used.fetch_add(run as u32, Relaxed);
            self.after_take(state, class, head);
            left -= run;
        }
        Ok(())
    }

    fn allocate_large(&self, bytes: u64, length: usize) -> Result<u64, MemError> {
        let pages = span_pages(bytes);
        let pages = u32::try_from(pages).map_err(|_| MemError::OutOfMemory { requested: bytes })?;
        let head = self.allocate_span(pages, bytes)?;
        self.pages[head as usize].kind.store(KIND_SPAN, Relaxed);
        self.pages[head as usize].link.store(pages, Relaxed);
        for tail in head + 1..head + pages {
            self.pages[tail as usize]
                .kind
                .store(KIND_SPAN_TAIL, Relaxed);
            self.pages[tail as usize].link.store(head, Relaxed);
        }
        let mut spans = self.spans.lock();
        spans.large_chunks += 1;
        spans.large_payload_bytes += length as u64;
        spans.large_pages += u64::from(pages);
        Ok(u64::from(head) * PAGE_BYTES)
    }

    /// Byte offset of the never-used top of the region: no byte at or above it was
    /// handed out (or all of it was returned to the OS).
    pub(crate) fn top_bytes(&self) -> u64 {
        u64::from(self.spans.lock().top) * PAGE_BYTES
    }

    /// Takes `pages` free pages: best fit among free spans, else from the top.
    fn allocate_span(&self, pages: u32, requested: u64) -> Result<u32, MemError> {
        let mut spans = self.spans.lock();
        if let Some(&(size, start)) = spans.by_size.range((pages, 0)..).next() {
            spans.remove(start, size);
            if size > pages {
                spans.insert(start + pages, size - pages);
            }
            return Ok(start);
        }
        if spans.total - spans.top >= pages {
            let start = spans.top;
            spans.top += pages;
            let top = u64::from(spans.top) * PAGE_BYTES;
            drop(spans);
            // Ranges the top passed become huge pages (see `region`).
            self.region.top_rose(top);
            return Ok(start);
        }
        Err(MemError::OutOfMemory { requested })
    }

    /// Returns a span to the free pages, coalescing it with its free neighbours.
    fn free_span(&self, start: u32, pages: u32) {
        for page in start..start + pages {
            self.pages[page as usize].kind.store(KIND_UNUSED, Relaxed);
        }
        self.region
            .discard(u64::from(start) * PAGE_BYTES, u64::from(pages) * PAGE_BYTES);
        let mut spans = self.spans.lock();
        let (mut start, mut pages) = (start, pages);
        if let Some((&before, &before_pages)) = spans.by_start.range(..start).next_back() {
            if before + before_pages == start {
                spans.remove(before, before_pages);
                start = before;
                pages += before_pages;
            }
        }
        if let Some(&after_pages) = spans.by_start.get(&(start + pages)) {
            spans.remove(start + pages, after_pages);
            pages += after_pages;
        }
        if start + pages == spans.top {
            spans.top = start;
        } else {
            spans.insert(start, pages);
        }
    }

    /// Frees the allocation at `offset` that holds a chunk of `length` bytes.
    pub(crate) fn free(&self, offset: u64, length: usize) {
        let page = (offset / PAGE_BYTES) as usize;
        let kind = self.pages[page].kind.load(Relaxed);
        let head = if kind == KIND_SLAB_TAIL {
            self.pages[page].link.load(Relaxed)
        } else {
            page as u32
        };
        let descriptor = &self.pages[head as usize];
        match descriptor.kind.load(Relaxed) {
            KIND_SLAB => {
                let owner = descriptor.owner.load(Relaxed);
                let (class, shard) = ((owner >> 8) as usize, (owner & 0xFF) as usize);
                let mut state = self.class_shard(class, shard);
                debug_assert!(
                    state.chunks > 0 && state.payload_bytes >= length as u64,
                    "free of a chunk its class shard does not count: accounting corrupt"
                );
                state.chunks -= 1;
                state.payload_bytes -= length as u64;
                self.return_slot(&mut state, class, head, offset);
            }
            KIND_SPAN => {
                let pages = descriptor.link.load(Relaxed);
                {
                    let mut spans = self.spans.lock();
                    debug_assert!(
                        spans.large_chunks > 0
                            && spans.large_payload_bytes >= length as u64
                            && spans.large_pages >= u64::from(pages),
                        "free of a large chunk the span counters do not hold: accounting corrupt"
                    );
                    spans.large_chunks -= 1;
                    spans.large_payload_bytes -= length as u64;
                    spans.large_pages -= u64::from(pages);
                }
                self.free_span(head, pages);
            }
            other => {
                panic!("free of offset {offset} in a page of kind {other}: allocator state corrupt")
            }
        }
    }

    fn return_slot(&self, state: &mut ClassShard, class: usize, head: u32, offset: u64) {
        let descriptor = &self.pages[head as usize];
        let slot_bytes = class_bytes(class);
        let slot = ((offset - u64::from(head) * PAGE_BYTES) / slot_bytes) as u32;
        let next = descriptor.free_head.load(Relaxed);
        // SAFETY: the slot's chunk is gone (the caller held its write lock and unlinked it),
        // and free-list links are only touched under this class shard's lock, which we hold.
        unsafe { self.region.write(offset, &next.to_le_bytes()) };
        descriptor.free_head.store(slot + 1, Relaxed);
        let used = descriptor.used.fetch_sub(1, Relaxed) - 1;
        if descriptor.partial_position.load(Relaxed) == 0 {
            state.partial.push(head);
            descriptor
                .partial_position
                .store(state.partial.len() as u32, Relaxed);
        }
        if used == 0 {
            if state.cached_empty.is_none() {
                state.cached_empty = Some(head);
            } else {
                self.release_slab(state, class, head);
            }
        }
    }

    /// Returns an empty slab of `state` to the page level.
    fn release_slab(&self, state: &mut ClassShard, class: usize, head: u32) {
        let descriptor = &self.pages[head as usize];
        let position = descriptor.partial_position.load(Relaxed) as usize - 1;
        state.partial.swap_remove(position);
        if let Some(&moved) = state.partial.get(position) {
            self.pages[moved as usize]
                .partial_position
                .store(position as u32 + 1, Relaxed);
        }
        descriptor.partial_position.store(0, Relaxed);
        state.slabs -= 1;
        self.free_span(head, slab_pages(class));
    }

    /// Returns every empty slab still cached by a class shard to the page level, so that
    /// free pages coalesce fully (a shard keeps one empty slab to avoid churn otherwise).
    pub(crate) fn trim(&self) {
        for (index, padded) in self.classes.iter().enumerate() {
            let mut state = padded.0.lock();
            if let Some(head) = state.cached_empty.take() {
                self.release_slab(&mut state, index / self.shards, head);
            }
        }
    }

    /// Updates the payload counters after a chunk at `offset` changed size in place.
    pub(crate) fn resized_in_place(&self, offset: u64, old: usize, new: usize) {
        let page = (offset / PAGE_BYTES) as usize;
        let kind = self.pages[page].kind.load(Relaxed);
        let head = if kind == KIND_SLAB_TAIL {
            self.pages[page].link.load(Relaxed)
        } else {
            page as u32
        };
        let descriptor = &self.pages[head as usize];
        if descriptor.kind.load(Relaxed) == KIND_SLAB {
            let owner = descriptor.owner.load(Relaxed);
            let mut state = self.class_shard((owner >> 8) as usize, (owner & 0xFF) as usize);
            state.payload_bytes = state.payload_bytes + new as u64 - old as u64;
        } else {
            let mut spans = self.spans.lock();
            spans.large_payload_bytes = spans.large_payload_bytes + new as u64 - old as u64;
        }
        if needs_header(new) {
            // SAFETY: the caller holds the chunk's write lock.
            unsafe { self.region.write_u64(offset, new as u64) };
        }
    }

    /// Current counters. Takes each lock briefly; the figures of different shards may be
    /// from slightly different moments.
    pub(crate) fn stats(&self) -> AllocatorStats {
        let mut stats = AllocatorStats::default();
        let mut slot_free_bytes = 0;
        let mut largest_slot_free = 0;
        let mut class_shard_bytes = 0;
        for (index, padded) in self.classes.iter().enumerate() {
            let class = index / self.shards;
            let state = padded.0.lock();
            let slot_bytes = class_bytes(class);
            let capacity = state.slabs * u64::from(slab_slots(class));
            stats.chunks += state.chunks;
            stats.payload_bytes += state.payload_bytes;
            stats.allocated_bytes += state.slabs * u64::from(slab_pages(class)) * PAGE_BYTES;
            slot_free_bytes += (capacity - state.chunks) * slot_bytes;
            if capacity > state.chunks {
                largest_slot_free = largest_slot_free.max(slot_bytes);
            }
            class_shard_bytes +=
                (std::mem::size_of::<ClassShard>() + state.partial.capacity() * 4) as u64;
        }
        let spans = self.spans.lock();
        stats.chunks += spans.large_chunks;
        stats.payload_bytes += spans.large_payload_bytes;
        stats.allocated_bytes += spans.large_pages * PAGE_BYTES;
        let largest_span = spans
            .by_size
            .last()
            .map_or(0, |&(pages, _)| u64::from(pages))
            .max(u64::from(spans.total - spans.top));
        stats.free_page_bytes = spans.free_pages() * PAGE_BYTES;
        stats.free_bytes = stats.free_page_bytes + slot_free_bytes;
        stats.largest_free_bytes = (largest_span * PAGE_BYTES).max(largest_slot_free);
        stats.metadata_bytes = u64::from(spans.top) * std::mem::size_of::<PageDescriptor>() as u64
            + (spans.by_start.len() * 2 * 48) as u64
            + class_shard_bytes;
        stats
    }

    /// Checks every allocator invariant against the chunks the table says are live
    /// (`(offset, length)` pairs). Locks the whole allocator; meant for tests. The steps:
    /// the free-span maps, every page below the top (`check_pages`), every live chunk
    /// against the slots and spans found (`check_live`), and the counters.
    pub(crate) fn check(&self, live: &[(u64, usize)]) -> Result<(), String> {
        let states: Vec<_> = self.classes.iter().map(|padded| padded.0.lock()).collect();
        let spans = self.spans.lock();
        Self::check_free_spans(&spans)?;
        let mut walk = self.check_pages(&states, &spans)?;
        let large_payload = self.check_live(live, &mut walk)?;
        Self::check_counters(&states, &spans, &walk, live, large_payload)
    }

    /// Free spans: sorted, disjoint, not adjacent, below the top, both maps agree.
    fn check_free_spans(spans: &Spans) -> Result<(), String> {
        if spans.by_start.len() != spans.by_size.len() {
            return Err("free-span maps disagree in size".into());
        }
        let mut previous_end = None;
        for (&start, &pages) in &spans.by_start {
            if pages == 0 || !spans.by_size.contains(&(pages, start)) {
                return Err(format!(
                    "free span {start}+{pages} malformed or missing by size"
                ));
            }
            if previous_end.is_some_and(|end| end >= start) {
                return Err(format!(
                    "free span {start} overlaps or touches its predecessor"
                ));
            }
            if start + pages >= spans.top {
                return Err(format!(
                    "free span {start}+{pages} reaches the top {}",
                    spans.top
                ));
            }
            previous_end = Some(start + pages);
        }
        Ok(())
    }

    /// Walks every page below the top: free spans are unused pages, every other page
    /// belongs to a slab or span whose tails point at its head, and each slab is well
    /// formed (`check_slab`). Returns the slabs and large spans found.
    fn check_pages(
        &self,
        states: &[MutexGuard<'_, ClassShard>],
        spans: &Spans,
    ) -> Result<CheckWalk, String> {
        let mut walk = CheckWalk {
            slabs: BTreeMap::new(),
            large: BTreeMap::new(),
            chunks_by_class: vec![0u64; CLASS_COUNT * self.shards],
        };
        let mut page = 0u32;
        while page < spans.top {
            if let Some(&pages) = spans.by_start.get(&page) {
                for free_page in page..page + pages {
                    if self.pages[free_page as usize].kind.load(Relaxed) != KIND_UNUSED {
                        return Err(format!(
                            "page {free_page} is in a free span but marked used"
                        ));
                    }
                }
                page += pages;
                continue;
            }
            let descriptor = &self.pages[page as usize];
            let pages = descriptor.link.load(Relaxed);
            let tail_kind = match descriptor.kind.load(Relaxed) {
                KIND_SLAB => KIND_SLAB_TAIL,
                KIND_SPAN => KIND_SPAN_TAIL,
                other => {
                    return Err(format!(
                        "page {page} below the top has kind {other} and is not free"
                    ))
                }
            };
            if pages == 0 || page + pages > spans.top {
                return Err(format!("span at page {page} has bad length {pages}"));
            }
            for tail in page + 1..page + pages {
                let tail_descriptor = &self.pages[tail as usize];
                if tail_descriptor.kind.load(Relaxed) != tail_kind
                    || tail_descriptor.link.load(Relaxed) != page
                {
                    return Err(format!(
                        "tail page {tail} does not point at its head {page}"
                    ));
                }
            }
            if tail_kind == KIND_SPAN_TAIL {
                walk.large.insert(page, (pages, 0));
            } else {
                let (slab, shard_index) = self.check_slab(states, page, pages)?;
                walk.chunks_by_class[shard_index] += u64::from(slab.used);
                walk.slabs.insert(page, slab);
            }
            page += pages;
        }
        Ok(walk)
    }

    /// Checks the slab whose head is `page` (`pages` long): owner and size, its free list
    /// (`check_free_list`), its place in its shard's list of slabs with room, and the
    /// shard's cached empty slab. Returns it with the index of its class shard.
    fn check_slab(
        &self,
        states: &[MutexGuard<'_, ClassShard>],
        page: u32,
        pages: u32,
    ) -> Result<(CheckSlab, usize), String> {
        let descriptor = &self.pages[page as usize];
        let owner = descriptor.owner.load(Relaxed);
        let (class, shard) = ((owner >> 8) as usize, (owner & 0xFF) as usize);
        if class >= CLASS_COUNT || shard >= self.shards || pages != slab_pages(class) {
            return Err(format!("slab {page} has bad owner {owner:#x} or size"));
        }
        let slots = slab_slots(class);
        let (used, bump) = (descriptor.used.load(Relaxed), descriptor.bump.load(Relaxed));
        if bump > slots || used > bump {
            return Err(format!(
                "slab {page}: used {used}, bump {bump}, slots {slots}"
            ));
        }
        let (free, free_count) = self.check_free_list(page, class, bump, slots)?;
        if used + free_count != bump {
            return Err(format!(
                "slab {page}: used {used} + free {free_count} != bump {bump}"
            ));
        }
        let state = &states[class * self.shards + shard];
        let has_room = free_count > 0 || bump < slots;
        let position = descriptor.partial_position.load(Relaxed);
        let listed = position != 0 && state.partial.get(position as usize - 1) == Some(&page);
        if has_room != listed {
            return Err(format!(
                "slab {page}: has room {has_room} but listed {listed}"
            ));
        }
        if (used == 0) != (state.cached_empty == Some(page)) {
            return Err(format!(
                "slab {page}: {used} used, but the cached empty slab is another"
            ));
        }
        let slab = CheckSlab {
            class,
            used,
            bump,
            free,
            live: 0,
        };
        Ok((slab, class * self.shards + shard))
    }

    /// Follows the free list of the slab at `page`: every slot on it was handed out
    /// before (below `bump`) and appears once. Returns which slots are free, and how many.
    fn check_free_list(
        &self,
        page: u32,
        class: usize,
        bump: u32,
        slots: u32,
    ) -> Result<(Vec<bool>, u32), String> {
        let descriptor = &self.pages[page as usize];
        let mut free = vec![false; slots as usize];
        let mut cursor = descriptor.free_head.load(Relaxed);
        let mut free_count = 0;
        while cursor != 0 {
            let slot = cursor - 1;
            if slot >= bump || free[slot as usize] {
                return Err(format!(
                    "slab {page}: free list has bad or repeated slot {slot}"
                ));
            }
            free[slot as usize] = true;
            free_count += 1;
            let mut next = [0u8; 4];
            let offset = u64::from(page) * PAGE_BYTES + u64::from(slot) * class_bytes(class);
            // SAFETY: the slot is free and every allocator lock is held.
            unsafe { self.region.read(offset, &mut next) };
            cursor = u32::from_le_bytes(next);
        }
        Ok((free, free_count))
    }

    /// Every live chunk sits in exactly one valid slot or span. Counts the references of
    /// each slab and span in `walk`, and returns the payload bytes of the large chunks.
    fn check_live(&self, live: &[(u64, usize)], walk: &mut CheckWalk) -> Result<u64, String> {
        let mut large_payload = 0u64;
        let mut seen = std::collections::HashSet::new();
        for &(offset, length) in live {
            if !seen.insert(offset) {
                return Err(format!("two chunks share offset {offset}"));
            }
            let page = (offset / PAGE_BYTES) as u32;
            let head = match self.pages.get(page as usize).map(|d| d.kind.load(Relaxed)) {
                Some(KIND_SLAB_TAIL) => self.pages[page as usize].link.load(Relaxed),
                Some(_) => page,
                None => return Err(format!("chunk offset {offset} outside the region")),
            };
            let bytes = allocation_bytes(length);
            if let Some(slab) = walk.slabs.get_mut(&head) {
                let slot_bytes = class_bytes(slab.class);
                let within = offset - u64::from(head) * PAGE_BYTES;
                let slot = within / slot_bytes;
                if class_of(bytes) != Some(slab.class) || !within.is_multiple_of(slot_bytes) {
                    return Err(format!(
                        "chunk at {offset} ({length} B) not at a slot of class {}",
                        slab.class
                    ));
                }
                if slot >= u64::from(slab.bump) || slab.free[slot as usize] {
                    return Err(format!("chunk at {offset} is in a free or untouched slot"));
                }
                slab.live += 1;
            } else if let Some((pages, references)) = walk.large.get_mut(&head) {
                if class_of(bytes).is_some()
                    || offset != u64::from(head) * PAGE_BYTES
                    || u64::from(*pages) != span_pages(bytes)
                {
                    return Err(format!(
                        "large chunk at {offset} ({length} B) does not match its span"
                    ));
                }
                *references += 1;
                large_payload += length as u64;
            } else {
                return Err(format!("chunk at {offset} is in no allocated span"));
            }
        }
        Ok(large_payload)
    }

    /// Every slab holds as many live chunks as it counts used slots, every span exactly
    /// one, and the chunk and payload counters agree with what was found.
    fn check_counters(
        states: &[MutexGuard<'_, ClassShard>],
        spans: &Spans,
        walk: &CheckWalk,
        live: &[(u64, usize)],
        large_payload: u64,
    ) -> Result<(), String> {
        for (head, slab) in &walk.slabs {
            if slab.live != slab.used {
                return Err(format!(
                    "slab {head}: {} used slots but {} live chunks",
                    slab.used, slab.live
                ));
            }
        }
        for (head, (_, references)) in &walk.large {
            if *references != 1 {
                return Err(format!("span {head} referenced by {references} chunks"));
            }
        }
        for (index, state) in states.iter().enumerate() {
            if state.chunks != walk.chunks_by_class[index] {
                return Err(format!(
                    "class shard {index} counts {} chunks, slabs hold {}",
                    state.chunks, walk.chunks_by_class[index]
                ));
            }
        }
        if spans.large_chunks != walk.large.len() as u64
            || spans.large_payload_bytes != large_payload
        {
            return Err("large-chunk counters disagree with the spans".into());
        }
        let small_payload: u64 = states.iter().map(|state| state.payload_bytes).sum();
        let live_payload: u64 = live.iter().map(|&(_, length)| length as u64).sum();
        if small_payload + large_payload != live_payload {
            return Err(format!(
                "payload counters {} != live payload {live_payload}",
                small_payload + large_payload
            ));
        }
        Ok(())
    }
}

/// A slab as [`Allocator::check`] found it.
struct CheckSlab {
    class: usize,
    used: u32,
    bump: u32,
    /// Which slots are on the free list.
    free: Vec<bool>,
    /// Live chunks found in it so far.
    live: u32,
}

/// What [`Allocator::check`]'s walk over the pages found.
struct CheckWalk {
    /// Slab head page → the slab.
    slabs: BTreeMap<u32, CheckSlab>,
    /// Large span head page → (pages, live chunks found in it so far).
    large: BTreeMap<u32, (u32, u32)>,
    /// Used slots per class shard (index `class * shards + shard`).
    chunks_by_class: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_with_bounded_slack() {
        assert_eq!(class_of(SLAB_SLOT_BYTES_MAX), Some(CLASS_COUNT - 1));
        assert_eq!(class_bytes(CLASS_COUNT - 1), SLAB_SLOT_BYTES_MAX);
        assert_eq!(class_of(SLAB_SLOT_BYTES_MAX + 1), None);
        let mut previous = 0;
        for class in 0..CLASS_COUNT {
            let bytes = class_bytes(class);
            assert!(bytes > previous && bytes.is_multiple_of(SLOT_ALIGN));
            assert_eq!(class_of(bytes), Some(class));
            assert_eq!(class_of(previous + 1), Some(class));
            assert!(slab_slots(class) as u64 >= SLAB_SLOTS_MIN.min(PAGE_BYTES / bytes));
            previous = bytes;
        }
        for bytes in 1..=SLAB_SLOT_BYTES_MAX {
            let slot = class_bytes(class_of(bytes).unwrap());
            assert!(slot >= bytes);
            assert!(bytes <= 128 && slot - bytes < SLOT_ALIGN || (slot - bytes) * 4 < bytes);
        }
    }

    #[test]
    fn miri_allocate_free_and_coalesce() {
        let allocator = Allocator::new(32 * PAGE_BYTES, 2, false).unwrap();
        let mut chunks = Vec::new();
        for length in [1usize, 8, 32, 100, 2048, 2049, 70_000, 300_000] {
            chunks.push((allocator.allocate(length).unwrap(), length));
        }
        allocator.check(&chunks).unwrap();
        let stats = allocator.stats();
        assert_eq!(stats.chunks, chunks.len() as u64);
        for &(offset, length) in chunks.iter().rev() {
            allocator.free(offset, length);
        }
        allocator.check(&[]).unwrap();
        allocator.trim();
        allocator.check(&[]).unwrap();
        // Everything went back: one region-sized free block, nothing fragmented.
        let stats = allocator.stats();
        assert_eq!(stats.largest_free_bytes, 32 * PAGE_BYTES);
        assert!(allocator.allocate(31 * PAGE_BYTES as usize).is_ok());
        assert!(matches!(
            allocator.allocate(2 * PAGE_BYTES as usize),
            Err(MemError::OutOfMemory { .. })
        ));
    }
}
