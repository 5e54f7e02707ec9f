//! The data region: one large block of address space reserved up front, into which the
//! allocator places every chunk. This module and `table.rs` are the only places that touch
//! raw memory.
//!
//! The region is an anonymous private mapping with `MAP_NORESERVE`: reserving it costs no
//! RAM, the OS commits pages on first touch, and `discard` hands pages back (they read as
//! zeros afterwards). Under Miri, which cannot run `mmap`, it is a zeroed heap allocation.
//!
//! **Huge pages behind the top.** With huge pages on, the region is not advised as a
//! whole: a 2 MiB range gets transparent huge pages (`MADV_HUGEPAGE`, then
//! `MADV_COLLAPSE` to turn its small pages into one now) once the allocator's top has
//! passed its end, when the top reached it fast ([`FAST_TOP_CROSSING`]), or before it
//! is made resident ahead of use. Otherwise the range the top is in takes small pages as
//! chunks reach them, so a peer holds only the memory its
//! chunks use instead of rounding up to the next 2 MiB (18 MiB resident for 16.2 MiB of
//! chunks before; see "Huge pages behind the top" in `docs/memory.md`).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::error::MemError;

/// A reserved, zero-initialised block of memory addressed by byte offsets.
pub(crate) struct Region {
    base: NonNull<u8>,
    bytes: u64,
    /// Back ranges with transparent huge pages (see the module docs).
    huge_pages: bool,
    /// `[0, huge_until)` is advised for huge pages: a multiple of [`HUGE_PAGE_BYTES`],
    /// only growing.
    huge_until: AtomicU64,
    /// The huge-page range the allocator's top was last seen in, and when it got there.
    top_range: Mutex<(u64, Option<Instant>)>,
}

/// A top that moves on to the next huge-page range sooner than this after the last one
/// is growing fast (a bulk load, a recovery's inserts: at least 20 MiB/s): the range it
/// is in gets its huge page at once, as chunks would fill it soon anyway and small-page
/// faults would slow the creates (a 4 KiB fault took about 3 µs in a VM, 512 of them per
/// 2 MiB: `myriad bench mem` created 11 M chunks/s instead of 24 M).
pub(crate) const FAST_TOP_CROSSING: Duration = Duration::from_millis(100);

/// Bytes of a transparent huge page (x86-64 and arm64 with 4 KiB base pages).
pub(crate) const HUGE_PAGE_BYTES: u64 = 2 << 20;

// SAFETY: `Region` is a plain block of memory; which thread may access which bytes is
// decided by the chunk locks and allocator locks above it, not by the region.
unsafe impl Send for Region {}
// SAFETY: as above; the region itself has no interior state besides the memory.
unsafe impl Sync for Region {}

impl Region {
    /// Reserves `bytes` of address space (a multiple of the page size). With `huge_pages`
    /// the kernel is asked to back it with transparent huge pages where it can (fewer TLB
    /// misses on random access; a hint, ignored where unsupported).
    pub(crate) fn new(bytes: u64, huge_pages: bool) -> Result<Region, MemError> {
        let unavailable = |reason: String| MemError::RegionUnavailable { bytes, reason };
        let len = usize::try_from(bytes).map_err(|_| unavailable("too large".into()))?;
        if len == 0 {
            return Err(unavailable("size 0".into()));
        }
        #[cfg(not(miri))]
        {
            // With huge pages the region starts on a huge-page boundary, so that its 2 MiB
            // ranges are the huge pages the kernel can back (an unaligned range spans two
            // and gets none): a huge page more is reserved and the unaligned ends unmapped.
            let slack = if huge_pages {
                HUGE_PAGE_BYTES as usize
            } else {
                0
            };
            let reserved = len
                .checked_add(slack)
                .ok_or_else(|| unavailable("too large".into()))?;
            // SAFETY: an anonymous mapping at an address of the kernel's choice touches no
            // existing memory; the result is checked for MAP_FAILED before use.
            let pointer = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    reserved,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if pointer == libc::MAP_FAILED {
                return Err(unavailable(std::io::Error::last_os_error().to_string()));
            }
            let head = if slack == 0 {
                0
            } else {
                (pointer as usize).next_multiple_of(slack) - pointer as usize
            };
            // SAFETY: `head ≤ slack`, so `pointer + head` and the `len` bytes after it lie
            // inside the mapping just made; the unmapped ends (`head` bytes before, `slack -
            // head` after) are parts of that same fresh mapping that nothing refers to.
            let pointer = unsafe {
                let aligned = pointer.cast::<u8>().add(head);
                if head > 0 {
                    libc::munmap(pointer, head);
                }
                if slack - head > 0 {
                    libc::munmap(aligned.add(len).cast::<libc::c_void>(), slack - head);
                }
                aligned.cast::<libc::c_void>()
            };
            let base = NonNull::new(pointer.cast::<u8>())
                .ok_or_else(|| unavailable("mmap returned null".into()))?;
            Ok(Region {
                base,
                bytes,
                huge_pages,
                huge_until: AtomicU64::new(0),
                top_range: Mutex::new((0, None)),
            })
        }
        #[cfg(miri)]
        {
            let _ = huge_pages;
            let layout = std::alloc::Layout::from_size_align(len, 4096)
                .map_err(|error| unavailable(error.to_string()))?;
            // SAFETY: the layout has a non-zero size (checked above).
            let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
            let base = NonNull::new(pointer).ok_or_else(|| unavailable("out of memory".into()))?;
            Ok(Region {
                base,
                bytes,
                huge_pages: false,
                huge_until: AtomicU64::new(0),
                top_range: Mutex::new((0, None)),
            })
        }
    }

    /// Size of the region in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// End of the range advised for huge pages so far (see [`Region::use_huge_pages_below`]).
    #[cfg(test)]
    pub(crate) fn huge_until(&self) -> u64 {
        self.huge_until.load(Ordering::Relaxed)
    }

    /// Called by the allocator whenever its top rose to `top`: the huge-page ranges the
    /// top has passed get huge pages ([`Region::use_huge_pages_below`]); so does the one
    /// it is in when the top reached it within [`FAST_TOP_CROSSING`] of reaching the one
    /// before (fast growth). A short lock per call (the top rises a 64 KiB page at a
    /// time); the work happens once per range.
    pub(crate) fn top_rose(&self, top: u64) {
        self.top_rose_at(top, Instant::now());
    }

    /// [`Region::top_rose`] at time `now`.
    pub(crate) fn top_rose_at(&self, top: u64, now: Instant) {
        if !self.huge_pages {
            return;
        }
        let range = top / HUGE_PAGE_BYTES;
        let fast = {
            let mut seen = self.top_range.lock();
            if seen.0 == range {
                return;
            }
            let fast = range > seen.0
                && seen
                    .1
                    .is_some_and(|then| now.duration_since(then) < FAST_TOP_CROSSING);
            *seen = (range, Some(now));
            fast
        };
        let end = if fast {
            (range + 1) * HUGE_PAGE_BYTES
        } else {
            range * HUGE_PAGE_BYTES
        };
        self.use_huge_pages_below(end);
    }

    /// With huge pages on, backs `[0, end)` rounded down to whole huge pages with
    /// transparent huge pages: the part not advised yet is advised (`MADV_HUGEPAGE`) and
    /// collapsed into huge pages now (`MADV_COLLAPSE`, Linux 6.1+; before that the
    /// kernel's background collapsing does it later). Called by the allocator as its top
    /// passes a range's end (the range is handed out: its small pages become one huge
    /// page) and before ranges are made resident ahead of use (rounded up there, so they
    /// fault in as huge pages). One caller wins each range; a no-op (one atomic load)
    /// when nothing is new. Hints only: failures (no THP support) are ignored.
    pub(crate) fn use_huge_pages_below(&self, end: u64) {
        if !self.huge_pages {
            return;
        }
        let target = (end.min(self.bytes) / HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        let mut from = self.huge_until.load(Ordering::Relaxed);
        loop {
            if target <= from {
                return;
            }
            match self.huge_until.compare_exchange_weak(
                from,
                target,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(current) => from = current,
            }
        }
        #[cfg(not(miri))]
        {
            let start = self.pointer(from).cast::<libc::c_void>();
            let len = (target - from) as usize;
            // SAFETY: `[from, target)` is inside our own mapping (target ≤ bytes); both
            // calls are advice that changes no contents: a collapse copies the small pages
            // into a huge page while the kernel holds their page tables, as its background
            // collapsing does, so concurrent readers and writers see the same bytes.
            unsafe {
                libc::madvise(start, len, libc::MADV_HUGEPAGE);
                #[cfg(all(target_os = "linux", target_env = "gnu"))]
                libc::madvise(start, len, libc::MADV_COLLAPSE);
            }
        }
    }

    /// Pointer to the byte at `offset`.
    ///
    /// Panics if `offset` is outside the region: offsets come from the allocator and the
    /// table, never from input, so a bad one is a bug that must not turn into a wild access.
    #[inline]
    pub(crate) fn pointer(&self, offset: u64) -> *mut u8 {
        assert!(offset < self.bytes, "region offset {offset} out of range");
        // SAFETY: `offset` is inside the allocation of `bytes` bytes starting at `base`
        // (asserted above), and `bytes` fits in `usize` (checked in `new`).
        unsafe { self.base.as_ptr().add(offset as usize) }
    }

    /// Copies `destination.len()` bytes starting at `offset` out of the region.
    ///
    /// # Safety
    /// The bytes must lie inside one allocation that no other thread writes during the
    /// call (the caller holds the chunk's read or write lock, or the allocator lock).
    #[inline]
    pub(crate) unsafe fn read(&self, offset: u64, destination: &mut [u8]) {
        self.check_span(offset, destination.len());
        // SAFETY: the span is inside the region (checked) and not written concurrently
        // (caller's contract); `destination` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.pointer(offset),
                destination.as_mut_ptr(),
                destination.len(),
            )
        }
    }

    /// Copies `source` into the region at `offset`.
    ///
    /// # Safety
    /// The bytes must lie inside one allocation that no other thread reads or writes during
    /// the call (the caller holds the chunk's write lock, or owns a fresh allocation).
    #[inline]
    pub(crate) unsafe fn write(&self, offset: u64, source: &[u8]) {
        self.check_span(offset, source.len());
        // SAFETY: the span is inside the region (checked) and exclusively owned by the
        // caller (contract); `source` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(source.as_ptr(), self.pointer(offset), source.len())
        }
    }

    /// Sets `len` bytes at `offset` to zero.
    ///
    /// # Safety
    /// Same contract as [`Region::write`].
    #[inline]
    pub(crate) unsafe fn zero(&self, offset: u64, len: usize) {
        self.check_span(offset, len);
        // SAFETY: inside the region (checked), exclusively owned (contract).
        unsafe { std::ptr::write_bytes(self.pointer(offset), 0, len) }
    }

    /// Borrows `len` bytes at `offset` as a slice.
    ///
    /// # Safety
    /// No thread may write the bytes while the slice lives (the caller holds the chunk's
    /// read or write lock for the slice's lifetime).
    #[inline]
    pub(crate) unsafe fn slice(&self, offset: u64, len: usize) -> &[u8] {
        self.check_span(offset, len);
        // SAFETY: inside the region (checked), initialised (the region starts zeroed and is
        // only written with initialised bytes), and not written while borrowed (contract).
        unsafe { std::slice::from_raw_parts(self.pointer(offset), len) }
    }

    /// Borrows `len` bytes at `offset` mutably.
    ///
    /// # Safety
    /// No other thread may read or write the bytes while the slice lives (the caller holds
    /// the chunk's write lock for the slice's lifetime).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, offset: u64, len: usize) -> &mut [u8] {
        self.check_span(offset, len);
        // SAFETY: inside the region (checked), initialised, exclusively owned (contract).
        unsafe { std::slice::from_raw_parts_mut(self.pointer(offset), len) }
    }

    /// Reads the little-endian `u64` at the 8-byte aligned `offset`.
    ///
    /// # Safety
    /// Same contract as [`Region::read`].
    #[inline]
    pub(crate) unsafe fn read_u64(&self, offset: u64) -> u64 {
        let mut bytes = [0u8; 8];
        // SAFETY: forwarded contract.
        unsafe { self.read(offset, &mut bytes) };
        u64::from_le_bytes(bytes)
    }

    /// Writes a little-endian `u64` at `offset`.
    ///
    /// # Safety
    /// Same contract as [`Region::write`].
    #[inline]
    pub(crate) unsafe fn write_u64(&self, offset: u64, value: u64) {
        // SAFETY: forwarded contract.
        unsafe { self.write(offset, &value.to_le_bytes()) }
    }

    /// Hints the CPU to fetch the cache line at `offset`. Never faults; a no-op off x86_64.
    #[inline]
    pub(crate) fn prefetch(&self, offset: u64) {
        if offset < self.bytes {
            prefetch_pointer(self.pointer(offset));
        }
    }

    /// Makes the pages of `[offset, offset + len)` resident and writable without changing
    /// their contents (`MADV_POPULATE_WRITE`), so that later writes there take no page
    /// faults. Safe while other threads use those bytes: no byte is written. Returns
    /// `Ok(false)` where the kernel lacks the advice (Linux before 5.14) and under Miri.
    pub(crate) fn populate(&self, offset: u64, len: u64) -> std::io::Result<bool> {
        self.check_span(offset, len as usize);
        // Resident anyway: in huge pages, as before the top reaches them.
        self.use_huge_pages_below((offset + len).div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES);
        #[cfg(not(miri))]
        {
            // SAFETY: the range is inside our own mapping (checked above); populating
            // changes no contents (fresh pages read as zero, resident ones are untouched),
            // so it cannot race with the chunk locks' readers and writers.
            let result = unsafe {
                libc::madvise(
                    self.pointer(offset).cast::<libc::c_void>(),
                    len as usize,
                    libc::MADV_POPULATE_WRITE,
                )
            };
            if result == 0 {
                return Ok(true);
            }
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EINVAL) {
                return Ok(false);
            }
            Err(error)
        }
        #[cfg(miri)]
        {
            Ok(false)
        }
    }

    /// Returns the pages of `[offset, offset + len)` to the OS; they read as zeros later.
    /// Both ends must be multiples of the OS page size.
    pub(crate) fn discard(&self, offset: u64, len: u64) {
        self.check_span(offset, len as usize);
        #[cfg(not(miri))]
        {
            // SAFETY: the range is inside our own mapping and holds no live data (the
            // allocator only discards free pages); MADV_DONTNEED on a private anonymous
            // mapping just drops the pages.
            let result = unsafe {
                libc::madvise(
                    self.pointer(offset).cast::<libc::c_void>(),
                    len as usize,
                    libc::MADV_DONTNEED,
                )
            };
            debug_assert_eq!(result, 0, "madvise failed");
        }
        #[cfg(miri)]
        {
            // SAFETY: as above, the pages are free; zeroing reproduces DONTNEED's effect.
            unsafe { self.zero(offset, len as usize) }
        }
    }

    #[inline]
    fn check_span(&self, offset: u64, len: usize) {
        assert!(
            offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.bytes),
            "region span {offset}+{len} out of range"
        );
    }
}

/// Hints the CPU to fetch the cache line holding `pointer`. Never faults.
#[inline]
pub(crate) fn prefetch_pointer<T>(pointer: *const T) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        // SAFETY: prefetch is only a hint; it never dereferences or faults, for any address.
        #[allow(unused_unsafe)]
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                pointer.cast::<i8>(),
            )
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = pointer;
}

impl Drop for Region {
    fn drop(&mut self) {
        #[cfg(not(miri))]
        {
            // SAFETY: `base`/`bytes` describe the mapping made in `new`, and no borrow of the
            // region outlives `&mut self`.
            unsafe {
                libc::munmap(
                    self.base.as_ptr().cast::<libc::c_void>(),
                    self.bytes as usize,
                )
            };
        }
        #[cfg(miri)]
        {
            // SAFETY: the same layout as the allocation in `new`.
            unsafe {
                std::alloc::dealloc(
                    self.base.as_ptr(),
                    std::alloc::Layout::from_size_align_unchecked(self.bytes as usize, 4096),
                )
            }
        }
    }
}
