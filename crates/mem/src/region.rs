//! The data region: one large block of address space reserved up front, into which the
//! allocator places every chunk. This module and `table.rs` are the only places that touch
//! raw memory.
//!
//! The region is an anonymous private mapping with `MAP_NORESERVE`: reserving it costs no
//! RAM, the OS commits pages on first touch, and `discard` hands pages back (they read as
//! zeros afterwards). Under Miri, which cannot run `mmap`, it is a zeroed heap allocation.

use std::ptr::NonNull;

use crate::error::MemError;

/// A reserved, zero-initialised block of memory addressed by byte offsets.
pub(crate) struct Region {
    base: NonNull<u8>,
    bytes: u64,
}

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
            // SAFETY: an anonymous mapping at an address of the kernel's choice touches no
            // existing memory; the result is checked for MAP_FAILED before use.
            let pointer = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if pointer == libc::MAP_FAILED {
                return Err(unavailable(std::io::Error::last_os_error().to_string()));
            }
            let base = NonNull::new(pointer.cast::<u8>())
                .ok_or_else(|| unavailable("mmap returned null".into()))?;
            if huge_pages {
                // SAFETY: advice on our own fresh mapping; it changes no contents. Failure
                // (no THP support) is harmless, so the result is ignored.
                unsafe { libc::madvise(pointer, len, libc::MADV_HUGEPAGE) };
            }
            Ok(Region { base, bytes })
        }
        #[cfg(miri)]
        {
            let _ = huge_pages;
            let layout = std::alloc::Layout::from_size_align(len, 4096)
                .map_err(|error| unavailable(error.to_string()))?;
            // SAFETY: the layout has a non-zero size (checked above).
            let pointer = unsafe { std::alloc::alloc_zeroed(layout) };
            let base = NonNull::new(pointer).ok_or_else(|| unavailable("out of memory".into()))?;
            Ok(Region { base, bytes })
        }
    }

    /// Size of the region in bytes.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
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
