//! The process heap's policy for long-running nodes (the C allocator under Rust's `Vec`s
//! and `Box`es, not the chunk region of this crate).
//!
//! glibc's `malloc` serves a large allocation (at first: 128 KiB or more) with its own
//! `mmap`, and when such a block is freed it raises that threshold to the block's size, so
//! later blocks of that size come from the heap instead. A backup peer allocates and frees
//! blocks of a few hundred KiB all the time (each flush's per-zone lists, each sealed
//! epoch's records, batched messages), and after the threshold has risen they fragment
//! the heap, which keeps the freed pages: about 2.5 MiB per backup in
//! `myriad bench backup-mem`, about 11 bytes per record over a 4-peer cluster in
//! `scripts/ycsb` (docs/benchmarks.md, "Smaller version buffers, a fixed mmap
//! threshold"). [`keep_heap_lean`] fixes the threshold at glibc's initial value, so those
//! blocks always go back to the system when freed.
//!
//! Small blocks freed in the middle of an arena stay resident too: glibc gives memory back
//! on its own only from the top of an arena. [`start_heap_trimmer`] runs a thread that
//! asks glibc (`malloc_trim`) every so often to return every free page of every arena,
//! as jemalloc's background thread does for Redis; over a YCSB load of 1 M records it
//! took about 1 MiB per peer that the buffers of the load had left free
//! (docs/benchmarks.md, "Trimmed heaps, smaller epochs, 4-byte size classes").
//!
//! Called by the `myriad` command before it starts a node; a library embedding a node
//! decides for its own process. Does nothing on other C libraries, or (the threshold)
//! when the user set `MALLOC_MMAP_THRESHOLD_` (glibc's own variable, which then wins).

use std::time::Duration;

/// The mmap threshold set: glibc's initial (and documented default) value.
pub const MMAP_THRESHOLD_BYTES: usize = 128 << 10;

/// How often the `myriad` command's nodes trim their heap.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// What [`keep_heap_lean`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapPolicy {
    /// The threshold is fixed at [`MMAP_THRESHOLD_BYTES`].
    Fixed,
    /// `MALLOC_MMAP_THRESHOLD_` is set: left to glibc.
    LeftToEnvironment,
    /// Not glibc, or glibc refused the setting: nothing changed.
    Unsupported,
}

/// Fixes the C allocator's mmap threshold (see the module docs). Call it once, early,
/// before the process starts many threads.
pub fn keep_heap_lean() -> HeapPolicy {
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() {
        return HeapPolicy::LeftToEnvironment;
    }
    set_mmap_threshold(MMAP_THRESHOLD_BYTES)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold(bytes: usize) -> HeapPolicy {
    let Ok(value) = libc::c_int::try_from(bytes) else {
        return HeapPolicy::Unsupported;
    };
    // SAFETY: `mallopt` takes two integers and only changes the allocator's parameters
    // (under its own lock); M_MMAP_THRESHOLD with a value up to 32 MiB on 64-bit glibc is
    // a documented use. It touches no memory of ours.
    let accepted = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, value) };
    if accepted == 1 {
        HeapPolicy::Fixed
    } else {
        HeapPolicy::Unsupported
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold(_bytes: usize) -> HeapPolicy {
    HeapPolicy::Unsupported
}

/// Returns the free pages of every arena of the C allocator to the system now. True if
/// any memory was released; always false where this is not glibc.
pub fn trim_now() -> bool {
    trim()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() -> bool {
    // SAFETY: `malloc_trim` takes an integer (the padding to keep at the top of the main
    // heap) and only hands free pages of the allocator's own arenas back to the kernel,
    // under each arena's lock; no memory that is allocated is touched.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

/// Starts a thread that calls [`trim_now`] every `interval` for the rest of the process
/// (see the module docs). One call takes well under a millisecond for a node's heap, so
/// a second is cheap. Returns `None` where trimming is unsupported (not glibc) or the
/// thread could not be started; the process runs as before then.
pub fn start_heap_trimmer(interval: Duration) -> Option<std::thread::JoinHandle<()>> {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return None;
    }
    std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(move || loop {
            std::thread::sleep(interval);
            trim();
        })
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_returns_small_blocks_freed_below_a_live_one() {
        // Many small blocks (below the mmap threshold, so from an arena), all but the last
        // freed: the arena cannot shrink from its top, only a trim can give the pages back.
        let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 8192]).collect();
        let last = blocks.pop();
        drop(blocks);
        let released = trim_now();
        assert_eq!(released, cfg!(all(target_os = "linux", target_env = "gnu")));
        let last = last.unwrap_or_default();
        assert!(last.iter().all(|&b| b == (4095 % 256) as u8));
        // The trimmer thread starts where trimming works and keeps the process usable.
        let trimmer = start_heap_trimmer(Duration::from_millis(10));
        assert_eq!(
            trimmer.is_some(),
            cfg!(all(target_os = "linux", target_env = "gnu"))
        );
        for round in 0..64usize {
            let block = vec![round as u8; 8192 * (round % 7 + 1)];
            assert!(block.iter().all(|&b| b == round as u8));
        }
    }

    #[test]
    fn the_threshold_is_fixed_on_glibc_and_large_blocks_still_work() {
        let policy = keep_heap_lean();
        if cfg!(all(target_os = "linux", target_env = "gnu"))
            && std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
        {
            assert_eq!(policy, HeapPolicy::Fixed);
        } else {
            assert_ne!(policy, HeapPolicy::Fixed);
        }
        // Blocks around and far above the threshold, freed and allocated again.
        for round in 0..4usize {
            let blocks: Vec<Vec<u8>> = [MMAP_THRESHOLD_BYTES - 1, MMAP_THRESHOLD_BYTES, 4 << 20]
                .iter()
                .map(|&len| vec![round as u8; len])
                .collect();
            for block in &blocks {
                assert!(block.iter().all(|&b| b == round as u8));
            }
        }
    }
}
