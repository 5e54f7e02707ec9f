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
//! Called by the `myriad` command before it starts a node; a library embedding a node
//! decides for its own process. Does nothing on other C libraries, or when the user set
//! `MALLOC_MMAP_THRESHOLD_` (glibc's own variable, which then wins).

/// The mmap threshold set: glibc's initial (and documented default) value.
pub const MMAP_THRESHOLD_BYTES: usize = 128 << 10;

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

#[cfg(test)]
mod tests {
    use super::*;

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
