//! The storage boundary: the only place the log engine touches files.
//!
//! Job: a [`Storage`] is a flat directory of named, preallocated files; a [`LogFile`] reads
//! and writes whole pages at page-aligned offsets and makes them durable with `sync`.
//! [`DiskStorage`] is the real one (O_DIRECT where the file system supports it, detected
//! when a file is opened, else buffered I/O plus `fdatasync`); [`MemStorage`] keeps files in
//! memory and injects faults for tests: writes that fail or are cut partway, and a crash
//! that keeps only synced data plus a torn prefix of what was written after.
//! [`DiskStorage::drop_page_cache`] syncs a directory's files and drops them from the page
//! cache, for benchmarks of cold reads (the `unsafe` calls stay in this crate).
//!
//! Invariants:
//! - The engine only passes page-aligned offsets, whole pages and [`AlignedBuf`]-backed
//!   slices, so the same calls work with and without O_DIRECT.
//! - Files never grow by writes: `open` preallocates them to their final length.
//!
//! What we assume of a disk is written down in `docs/log-format.md` ("Disk assumptions").

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;

/// The unit of every read and write: O_DIRECT needs buffers, offsets and lengths aligned
/// to the logical block size; 4 KiB covers every current SSD.
pub const PAGE_BYTES: usize = 4096;

/// Rounds `bytes` up to a whole number of pages.
pub const fn round_up_to_page(bytes: usize) -> usize {
    bytes.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

/// A zeroed, page-aligned heap buffer whose length is a whole number of pages.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `AlignedBuf` owns its allocation exclusively (like a `Vec<u8>`); moving it to or
// sharing `&AlignedBuf` with another thread is as safe as for `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: see `Send`; shared access only reads through `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> std::alloc::Layout {
        // A valid layout: PAGE_BYTES is a power of two and `len` is at most isize::MAX
        // rounded to pages by the caller's bound (`zeroed` asserts it).
        std::alloc::Layout::from_size_align(len.max(PAGE_BYTES), PAGE_BYTES)
            .unwrap_or_else(|_| std::alloc::handle_alloc_error(std::alloc::Layout::new::<u8>()))
    }

    /// A zeroed buffer of at least `bytes` (at least one page), rounded up to whole pages.
    pub fn zeroed(bytes: usize) -> AlignedBuf {
        assert!(bytes <= isize::MAX as usize / 2, "buffer too large");
        let len = round_up_to_page(bytes.max(1));
        let layout = Self::layout(len);
        // SAFETY: `layout` has a non-zero size (at least one page).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len }
    }

    /// Length in bytes (a multiple of [`PAGE_BYTES`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points to an allocation of at least `len` initialized (zeroed)
        // bytes that lives as long as `self`; the shared borrow of `self` prevents writes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; the exclusive borrow of `self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed` with exactly this layout and is
        // freed only here, once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

thread_local! {
    /// This thread's scratch buffer for writes (see [`with_write_scratch`]).
    static SCRATCH: std::cell::RefCell<Option<AlignedBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// Frees this thread's scratch buffer for writes (the next write allocates one again):
/// the writer thread's idle release.
pub(crate) fn release_write_scratch() {
    SCRATCH.with(|cell| {
        if let Ok(mut slot) = cell.try_borrow_mut() {
            *slot = None;
        }
    });
}

/// Runs `f` with this thread's scratch buffer for writes: page-aligned, exactly
/// `round_up_to_page(bytes)` long, with arbitrary content (the caller fills all of it).
/// One buffer per writing thread (flusher, reorganizer, recovery callers), grown to the
/// largest write it made: at most one segment, or for the flusher half the write buffer
/// (a primary-log write); it saves an allocation and page faults per write.
pub(crate) fn with_write_scratch<R>(bytes: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let len = round_up_to_page(bytes.max(1));
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            if slot.as_ref().is_none_or(|b| b.len() < len) {
                *slot = Some(AlignedBuf::zeroed(len));
            }
            match slot.as_mut() {
                Some(buf) => f(&mut buf[..len]),
                None => f(&mut AlignedBuf::zeroed(len)),
            }
        }
        // Not expected (no nested writes); stay correct anyway.
        Err(_) => f(&mut AlignedBuf::zeroed(len)),
    })
}

/// One preallocated file. Offsets and lengths passed in are multiples of [`PAGE_BYTES`]
/// and buffers come from [`AlignedBuf`].
pub trait LogFile: Send + Sync + fmt::Debug {
    /// The file's length in bytes.
    fn len(&self) -> u64;
    /// True for a zero-length file.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Fills `buf` from `offset`; an error if the file ends before.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset` (not durable before [`LogFile::sync`]).
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write durable (`fdatasync`).
    fn sync(&self) -> io::Result<()>;
    /// True if the file bypasses the page cache (O_DIRECT).
    fn direct(&self) -> bool;
}

/// A flat directory of named log files.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Opens `name`, creating it if missing, and preallocates it to at least `len` bytes.
    fn open(&self, name: &str, len: u64) -> io::Result<Box<dyn LogFile>>;
    /// The names of all files.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Deletes `name` (no error if it is missing).
    fn remove(&self, name: &str) -> io::Result<()>;
}

/// How [`DiskStorage`] opens files.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT if the file system supports it (probed at open), else buffered.
    Auto,
    /// O_DIRECT or fail.
    Direct,
    /// Through the page cache, made durable with `fdatasync`.
    Buffered,
}

/// Files in a directory of a real file system.
#[derive(Debug, Clone)]
pub struct DiskStorage {
    dir: PathBuf,
    mode: IoMode,
}

impl DiskStorage {
    /// Storage in `dir` (created if missing).
    pub fn new(dir: impl AsRef<Path>, mode: IoMode) -> io::Result<DiskStorage> {
        std::fs::create_dir_all(dir.as_ref())?;
        Ok(DiskStorage {
            dir: dir.as_ref().to_path_buf(),
            mode,
        })
    }

    fn open_file(&self, path: &Path, direct: bool) -> io::Result<File> {
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        options.open(path)
    }
}

/// What [`DiskStorage::drop_page_cache`] found and did: the files, their bytes, and how
/// many of those bytes the page cache held before and after the drop.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageCacheDrop {
    /// Regular files in the storage's directory.
    pub files: usize,
    /// Their total length.
    pub bytes: u64,
    /// Bytes of them resident in the page cache before (`mincore`).
    pub resident_before: u64,
    /// Bytes of them resident after the drop.
    pub resident_after: u64,
}

impl DiskStorage {
    /// Makes every file of the directory durable (`fsync`) and asks the kernel to drop its
    /// pages from the page cache (`posix_fadvise(POSIX_FADV_DONTNEED)`), so that the next
    /// read of them comes from the disk whether or not it uses O_DIRECT: what a benchmark
    /// of a cold read does before its timer starts. Reports the resident bytes before and
    /// after (`mincore`). Open files of an engine stay valid; a write racing the drop
    /// may leave its pages cached.
    pub fn drop_page_cache(&self) -> io::Result<PageCacheDrop> {
        let mut dropped = PageCacheDrop::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if !entry.file_type()?.is_file() {
                continue;
            }
            let file = File::open(entry.path())?;
            let len = file.metadata()?.len();
            dropped.files += 1;
            dropped.bytes += len;
            dropped.resident_before += resident_bytes(&file, len)?;
            // Dirty pages are not dropped: write them first.
            file.sync_all()?;
            fadvise_dontneed(&file)?;
            dropped.resident_after += resident_bytes(&file, len)?;
        }
        Ok(dropped)
    }
}

fn fadvise_dontneed(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `posix_fadvise` only reads its integer arguments; the descriptor belongs to
    // `file`, which is open for the duration of the call.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Bytes of the first `len` bytes of `file` resident in the page cache: the file mapped
/// read-only (no page is touched) and asked with `mincore`.
fn resident_bytes(file: &File, len: u64) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let Ok(len) = usize::try_from(len) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "file too long"));
    };
    if len == 0 {
        return Ok(0);
    }
    // SAFETY: `sysconf` only reads its integer argument.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(PAGE_BYTES)
        .max(1);
    // SAFETY: a fresh shared read-only mapping chosen by the kernel (null hint) of an open
    // descriptor; it is never dereferenced and is unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut pages = vec![0u8; len.div_ceil(page)];
    // SAFETY: `addr` is a page-aligned mapping of `len` bytes made above, and `pages` holds
    // one byte per page of it, as `mincore` requires.
    let rc = unsafe { libc::mincore(addr, len, pages.as_mut_ptr()) };
    let error = io::Error::last_os_error();
    // SAFETY: `addr` and `len` are exactly the mapping made above, unmapped once here.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(error);
    }
    let resident = pages.iter().filter(|&&p| p & 1 != 0).count();
    Ok((resident as u64 * page as u64).min(len as u64))
}

fn preallocate(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if file.metadata()?.len() >= len {
        return Ok(());
    }
    let Ok(len_off) = libc::off_t::try_from(len) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "file too long"));
    };
    // SAFETY: `posix_fallocate` only reads its integer arguments; the descriptor belongs to
    // `file`, which is open for the duration of the call.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
    if rc != 0 {
        // File systems without fallocate (e.g. ext2, tmpfs on old kernels): extend instead.
        file.set_len(len)?;
    }
    Ok(())
}

impl Storage for DiskStorage {
    fn open(&self, name: &str, len: u64) -> io::Result<Box<dyn LogFile>> {
        let path = self.dir.join(name);
        if self.mode != IoMode::Buffered {
            match self.open_file(&path, true) {
                Ok(file) => {
                    preallocate(&file, len)?;
                    // Some file systems accept O_DIRECT at open but fail aligned I/O.
                    let mut probe = AlignedBuf::zeroed(PAGE_BYTES);
                    match file.read_exact_at(&mut probe, 0) {
                        Ok(()) => return Ok(Box::new(DiskFile { file, direct: true })),
                        Err(e) if self.mode == IoMode::Direct => return Err(e),
                        Err(_) => {}
                    }
                }
                Err(e) if self.mode == IoMode::Direct => return Err(e),
                Err(_) => {}
            }
        }
        let file = self.open_file(&path, false)?;
        preallocate(&file, len)?;
        Ok(Box::new(DiskFile {
            file,
            direct: false,
        }))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[derive(Debug)]
struct DiskFile {
    file: File,
    direct: bool,
}

impl LogFile for DiskFile {
    fn len(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.len())
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        debug_assert!(!self.direct || (buf.as_ptr() as usize).is_multiple_of(PAGE_BYTES));
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        debug_assert!(!self.direct || (buf.as_ptr() as usize).is_multiple_of(PAGE_BYTES));
        self.file.write_all_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn direct(&self) -> bool {
        self.direct
    }
}

// ----- in-memory storage with fault injection ------------------------------------------

#[derive(Debug, Default)]
struct MemFileState {
    /// What reads see.
    current: Vec<u8>,
    /// What survives a crash for sure.
    durable: Vec<u8>,
    /// Writes since the last sync, in order.
    unsynced: Vec<(u64, Vec<u8>)>,
}

#[derive(Debug, Default)]
struct Faults {
    /// Bytes that writes may still transfer; `None` = unlimited. The write that exhausts
    /// it is cut there and fails, and so does every later write.
    write_budget_bytes: Option<u64>,
    /// Fail every sync.
    fail_sync: bool,
    /// Fail every read (a disk read error).
    fail_read: bool,
}

/// In-memory files with injected faults, for tests. Clones share the same files.
#[derive(Debug, Clone, Default)]
pub struct MemStorage {
    files: Arc<Mutex<HashMap<String, Arc<Mutex<MemFileState>>>>>,
    faults: Arc<Mutex<Faults>>,
}

impl MemStorage {
    /// An empty storage without faults.
    pub fn new() -> MemStorage {
        MemStorage::default()
    }

    /// Lets writes transfer `bytes` more bytes (all files together); the write that runs
    /// over is cut partway and fails, later ones fail. `None` lifts the limit.
    pub fn set_write_budget(&self, bytes: Option<u64>) {
        self.faults.lock().write_budget_bytes = bytes;
    }

    /// Makes every `sync` fail (or succeed again).
    pub fn set_fail_sync(&self, fail: bool) {
        self.faults.lock().fail_sync = fail;
    }

    /// Makes every read fail (or succeed again), as a disk with unreadable sectors.
    pub fn set_fail_read(&self, fail: bool) {
        self.faults.lock().fail_read = fail;
    }

    /// Simulates a power failure: every file keeps its synced content plus, of the writes
    /// after its last sync, a prefix chosen by `seed` whose last write may be cut partway.
    /// Faults are cleared.
    pub fn crash(&self, seed: u64) {
        let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for file in self.files.lock().values() {
            let mut f = file.lock();
            let writes = std::mem::take(&mut f.unsynced);
            let keep = (next() % (writes.len() as u64 + 1)) as usize;
            let mut image = f.durable.clone();
            for (i, (offset, data)) in writes.iter().enumerate().take(keep) {
                let cut = if i + 1 == keep {
                    (next() % (data.len() as u64 + 1)) as usize
                } else {
                    data.len()
                };
                let start = *offset as usize;
                let end = (start + cut).min(image.len());
                if start < end {
                    image[start..end].copy_from_slice(&data[..end - start]);
                }
            }
            f.durable = image.clone();
            f.current = image;
        }
        *self.faults.lock() = Faults::default();
    }

    /// Total bytes of unsynced writes pending in all files.
    pub fn unsynced_bytes(&self) -> u64 {
        self.files
            .lock()
            .values()
            .map(|f| {
                f.lock()
                    .unsynced
                    .iter()
                    .map(|w| w.1.len() as u64)
                    .sum::<u64>()
            })
            .sum()
    }
}

impl Storage for MemStorage {
    fn open(&self, name: &str, len: u64) -> io::Result<Box<dyn LogFile>> {
        let len = usize::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too long"))?;
        let file = self
            .files
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone();
        {
            let mut f = file.lock();
            if f.current.len() < len {
                f.current.resize(len, 0);
                f.durable.resize(len, 0);
            }
        }
        Ok(Box::new(MemFile {
            state: file,
            faults: self.faults.clone(),
        }))
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = self.files.lock().keys().cloned().collect();
        names.sort();
        Ok(names)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.files.lock().remove(name);
        Ok(())
    }
}

#[derive(Debug)]
struct MemFile {
    state: Arc<Mutex<MemFileState>>,
    faults: Arc<Mutex<Faults>>,
}

fn check_aligned(buf_len: usize, offset: u64) -> io::Result<()> {
    if !buf_len.is_multiple_of(PAGE_BYTES) || !offset.is_multiple_of(PAGE_BYTES as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unaligned I/O (the engine must issue whole pages)",
        ));
    }
    Ok(())
}

impl LogFile for MemFile {
    fn len(&self) -> u64 {
        self.state.lock().current.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_aligned(buf.len(), offset)?;
        if self.faults.lock().fail_read {
            return Err(io::Error::other("injected read failure"));
        }
        let f = self.state.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = start
            .checked_add(buf.len())
            .and_then(|end| f.current.get(start..end))
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_aligned(buf.len(), offset)?;
        let mut transfer = buf.len();
        let mut failed = false;
        {
            let mut faults = self.faults.lock();
            if let Some(budget) = faults.write_budget_bytes.as_mut() {
                if (*budget as usize) < transfer {
                    transfer = *budget as usize;
                    failed = true;
                }
                *budget -= transfer as u64;
            }
        }
        let mut f = self.state.lock();
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(buf.len());
        if end > f.current.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "write past end",
            ));
        }
        f.current[start..start + transfer].copy_from_slice(&buf[..transfer]);
        if transfer > 0 {
            f.unsynced.push((offset, buf[..transfer].to_vec()));
        }
        if failed {
            return Err(io::Error::other("injected write failure"));
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        if self.faults.lock().fail_sync {
            return Err(io::Error::other("injected sync failure"));
        }
        let mut f = self.state.lock();
        let writes = std::mem::take(&mut f.unsynced);
        for (offset, data) in writes {
            let start = offset as usize;
            f.durable[start..start + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }

    fn direct(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Also run under Miri (`scripts/test-nightly`): the buffer's `unsafe` allocation,
    /// slices and deallocation.
    #[test]
    fn miri_aligned_buf_is_aligned_zeroed_and_writable() {
        let sizes: &[usize] = if cfg!(miri) {
            &[0, 1, 4095, 4096, 4097, 3 * 4096]
        } else {
            &[0, 1, 4095, 4096, 4097, 3 << 20]
        };
        for &bytes in sizes {
            let mut b = AlignedBuf::zeroed(bytes);
            assert_eq!(b.as_ptr() as usize % PAGE_BYTES, 0);
            assert!(b.len() >= bytes && b.len().is_multiple_of(PAGE_BYTES) && !b.is_empty());
            assert!(b.iter().all(|&x| x == 0));
            let n = b.len();
            b[n - 1] = 7;
            b[0] = 3;
            assert_eq!((b[0], b[n - 1]), (3, 7));
        }
    }

    #[test]
    fn mem_storage_loses_unsynced_writes_on_crash() {
        let s = MemStorage::new();
        let f = s.open("a", 4 * PAGE_BYTES as u64).unwrap();
        let page = vec![1u8; PAGE_BYTES];
        f.write_at(&page, 0).unwrap();
        f.sync().unwrap();
        f.write_at(&[2u8; PAGE_BYTES], PAGE_BYTES as u64).unwrap();
        assert_eq!(s.unsynced_bytes(), PAGE_BYTES as u64);
        // Some seed drops the unsynced write entirely.
        let mut dropped = false;
        for seed in 0..16 {
            let s2 = MemStorage::new();
            let g = s2.open("a", 2 * PAGE_BYTES as u64).unwrap();
            g.write_at(&page, 0).unwrap();
            g.sync().unwrap();
            g.write_at(&[2u8; PAGE_BYTES], PAGE_BYTES as u64).unwrap();
            s2.crash(seed);
            let mut buf = vec![0u8; 2 * PAGE_BYTES];
            g.read_at(&mut buf, 0).unwrap();
            assert!(
                buf[..PAGE_BYTES].iter().all(|&x| x == 1),
                "synced data kept"
            );
            dropped |= buf[PAGE_BYTES..].iter().all(|&x| x == 0);
        }
        assert!(dropped);
        assert!(f.write_at(&page[..100], 0).is_err(), "unaligned rejected");
    }

    #[test]
    fn write_budget_cuts_a_write_partway() {
        let s = MemStorage::new();
        let f = s.open("a", 2 * PAGE_BYTES as u64).unwrap();
        s.set_write_budget(Some(100));
        assert!(f.write_at(&[5u8; PAGE_BYTES], 0).is_err());
        let mut buf = vec![0u8; PAGE_BYTES];
        f.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf.iter().filter(|&&x| x == 5).count(), 100);
        assert!(f.write_at(&[5u8; PAGE_BYTES], 0).is_err());
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "myriad-backup-log-storage-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn disk_storage_round_trips_in_every_mode() {
        for mode in [IoMode::Auto, IoMode::Buffered] {
            let dir = temp_dir(&format!("{mode:?}"));
            let s = DiskStorage::new(&dir, mode).unwrap();
            let f = s.open("x.log", 8 * PAGE_BYTES as u64).unwrap();
            assert_eq!(f.len(), 8 * PAGE_BYTES as u64);
            if mode == IoMode::Buffered {
                assert!(!f.direct());
            }
            let mut b = AlignedBuf::zeroed(2 * PAGE_BYTES);
            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u8);
            f.write_at(&b, PAGE_BYTES as u64).unwrap();
            f.sync().unwrap();
            drop(f);
            let f = s.open("x.log", 8 * PAGE_BYTES as u64).unwrap();
            let mut r = AlignedBuf::zeroed(2 * PAGE_BYTES);
            f.read_at(&mut r, PAGE_BYTES as u64).unwrap();
            assert_eq!(&r[..], &b[..]);
            assert_eq!(s.list().unwrap(), vec!["x.log".to_string()]);
            s.remove("x.log").unwrap();
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    #[test]
    fn drop_page_cache_counts_the_files_and_leaves_their_data() {
        let dir = temp_dir("drop-cache");
        let s = DiskStorage::new(&dir, IoMode::Buffered).unwrap();
        let f = s.open("a.log", 16 * PAGE_BYTES as u64).unwrap();
        let mut b = AlignedBuf::zeroed(4 * PAGE_BYTES);
        b.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 251) as u8);
        f.write_at(&b, 0).unwrap();
        drop(s.open("empty.log", 0).unwrap());
        let dropped = s.drop_page_cache().unwrap();
        assert_eq!(dropped.files, 2);
        assert_eq!(dropped.bytes, 16 * PAGE_BYTES as u64);
        assert!(dropped.resident_before <= dropped.bytes);
        assert!(dropped.resident_after <= dropped.bytes);
        // Written but not synced by the caller: the drop syncs first, nothing is lost.
        let mut r = AlignedBuf::zeroed(4 * PAGE_BYTES);
        f.read_at(&mut r, 0).unwrap();
        assert_eq!(&r[..], &b[..]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn direct_mode_fails_where_o_direct_is_unsupported_and_auto_falls_back() {
        // /dev/shm is tmpfs: O_DIRECT is refused there on many kernels. Whatever the kernel
        // does, Auto must open the file and Direct must either be truly direct or fail.
        let dir =
            Path::new("/dev/shm").join(format!("myriad-backup-log-shm-{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_err() {
            return;
        }
        let auto = DiskStorage::new(&dir, IoMode::Auto).unwrap();
        let f = auto.open("a", PAGE_BYTES as u64).unwrap();
        let direct_supported = f.direct();
        let strict = DiskStorage::new(&dir, IoMode::Direct).unwrap();
        match strict.open("b", PAGE_BYTES as u64) {
            Ok(g) => assert!(g.direct() && direct_supported),
            Err(_) => assert!(!direct_supported),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
