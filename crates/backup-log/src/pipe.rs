//! Writes handed to I/O threads, so the writer thread fills the next buffer while the disk
//! takes the last one, and writes to different files reach the disk at the same time.
//!
//! # Job
//! [`WritePipe`] owns a few page-aligned buffers and `threads` I/O threads. The writer
//! thread asks it for a buffer, fills it and submits it ([`WritePipe::write_with`]); an
//! I/O thread issues the `pwrite` and returns the buffer to the pool. [`TrackedFile`]
//! wraps a [`LogFile`] and records the byte ranges of its writes still in flight:
//! - a write overlapping one in flight waits for it (consecutive writes of a segment share
//!   its partial last page, and the later one must reach the disk last);
//! - a read waits for the writes in flight that overlap it, so readers (reorganization,
//!   recovery, reopen) see what was submitted;
//! - `sync` waits for every write in flight first, so a sync covers all writes submitted
//!   before it.
//!
//! # Invariants
//! - A write that failed makes the file fail: every later read, write and sync of it
//!   returns the error (the engine stops accepting appends on the first one; nothing the
//!   failed write held is ever reported durable).
//! - Memory is bounded: at most `buffers` buffers, each as large as the largest write.
//! - Dropping the pipe finishes every write submitted and joins the threads.
//!
//! # Who calls it
//! The engine's writer thread through `SecondaryLog::append_walked`. Other writers
//! (reorganization, primary log, version logs) write synchronously through the
//! [`TrackedFile`] or their plain file.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::storage::{round_up_to_page, AlignedBuf, LogFile};

/// A [`LogFile`] whose writes may be in flight on a [`WritePipe`]. See the module docs.
#[derive(Debug)]
pub struct TrackedFile {
    inner: Arc<dyn LogFile>,
    state: Mutex<Tracked>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct Tracked {
    /// Byte ranges `[start, end)` of writes in flight.
    pending: Vec<(u64, u64)>,
    /// The first failed write: (kind, message).
    failed: Option<(io::ErrorKind, String)>,
}

impl Tracked {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.pending.iter().any(|&(s, e)| s < end && start < e)
    }

    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some((kind, msg)) => Err(io::Error::new(
                *kind,
                format!("an earlier write of this file failed: {msg}"),
            )),
            None => Ok(()),
        }
    }
}

impl TrackedFile {
    /// Wraps `inner`; nothing is in flight.
    pub fn new(inner: Arc<dyn LogFile>) -> TrackedFile {
        TrackedFile {
            inner,
            state: Mutex::new(Tracked::default()),
            cv: Condvar::new(),
        }
    }

    /// Waits until no write in flight overlaps `[start, end)` (every write when `None`),
    /// then reports an earlier failure, if any.
    fn wait_clear(&self, range: Option<(u64, u64)>) -> io::Result<()> {
        let mut t = self.state.lock();
        loop {
            let busy = match range {
                Some((s, e)) => t.overlaps(s, e),
                None => !t.pending.is_empty(),
            };
            if !busy {
                return t.check();
            }
            self.cv.wait(&mut t);
        }
    }

    /// Registers a write of `[start, end)` as in flight, once no write in flight overlaps
    /// it.
    fn begin(&self, start: u64, end: u64) -> io::Result<()> {
        let mut t = self.state.lock();
        while t.overlaps(start, end) {
            self.cv.wait(&mut t);
        }
        t.check()?;
        t.pending.push((start, end));
        Ok(())
    }

    /// Ends the write of `[start, end)` with its result.
    fn end(&self, start: u64, end: u64, result: &io::Result<()>) {
        let mut t = self.state.lock();
        if let Some(i) = t.pending.iter().position(|&r| r == (start, end)) {
            t.pending.swap_remove(i);
        }
        if let Err(e) = result {
            if t.failed.is_none() {
                t.failed = Some((e.kind(), e.to_string()));
            }
        }
        self.cv.notify_all();
    }
}

impl LogFile for TrackedFile {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.wait_clear(Some((offset, offset + buf.len() as u64)))?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        self.begin(offset, end)?;
        let result = self.inner.write_at(buf, offset);
        self.end(offset, end, &result);
        result
    }
    fn sync(&self) -> io::Result<()> {
        self.wait_clear(None)?;
        self.inner.sync()
    }
    fn direct(&self) -> bool {
        self.inner.direct()
    }
}

/// One write handed to an I/O thread.
struct Job {
    file: Arc<TrackedFile>,
    buf: AlignedBuf,
    len: usize,
    offset: u64,
}

struct PipeState {
    queue: VecDeque<Job>,
    free: Vec<AlignedBuf>,
    /// Buffers in existence (free, being filled, queued or being written).
    buffers: usize,
    closed: bool,
}

struct Shared {
    state: Mutex<PipeState>,
    /// I/O threads wait here for jobs; the submitter for a free buffer.
    cv: Condvar,
    buffers_max: usize,
}

/// A pool of write buffers and I/O threads. See the module docs.
pub struct WritePipe {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for WritePipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePipe")
            .field("threads", &self.threads.len())
            .field("buffers_max", &self.shared.buffers_max)
            .finish()
    }
}

impl WritePipe {
    /// A pipe with `threads` I/O threads (at least 1) and at most `threads + 1` buffers.
    pub fn new(threads: usize) -> io::Result<WritePipe> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(PipeState {
                queue: VecDeque::new(),
                free: Vec::new(),
                buffers: 0,
                closed: false,
            }),
            cv: Condvar::new(),
            buffers_max: threads + 1,
        });
        let mut handles = Vec::with_capacity(threads);
        for _ in 0..threads {
            let s = shared.clone();
            match std::thread::Builder::new()
                .name("log-io".into())
                .spawn(move || io_loop(&s))
            {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // Stop the ones started.
                    drop(WritePipe {
                        shared,
                        threads: handles,
                    });
                    return Err(e);
                }
            }
        }
        Ok(WritePipe {
            shared,
            threads: handles,
        })
    }

    /// Fills a buffer of `len` bytes (rounded up to whole pages, the part past `len`
    /// unspecified) with `fill` and submits it as a write of `file` at `offset`. Waits for
    /// a free buffer first, and before submitting for writes in flight that overlap it.
    /// Returns what `fill` returned; the write's own result surfaces at the file's next
    /// read, write or sync.
    pub fn write_with<R>(
        &self,
        file: &Arc<TrackedFile>,
        len: usize,
        offset: u64,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        let len = round_up_to_page(len.max(1));
        let mut buf = self.take_buffer(len);
        let result = fill(&mut buf[..len]);
        if let Err(e) = file.begin(offset, offset + len as u64) {
            self.give_back(buf);
            return Err(e);
        }
        let mut s = self.shared.state.lock();
        s.queue.push_back(Job {
            file: file.clone(),
            buf,
            len,
            offset,
        });
        self.shared.cv.notify_all();
        Ok(result)
    }

    /// A buffer of at least `len` bytes: a free one, or a new one while fewer than the
    /// maximum exist, else the next one an I/O thread frees.
    fn take_buffer(&self, len: usize) -> AlignedBuf {
        let mut s = self.shared.state.lock();
        loop {
            if let Some(buf) = s.free.pop() {
                drop(s);
                return if buf.len() >= len {
                    buf
                } else {
                    AlignedBuf::zeroed(len)
                };
            }
            if s.buffers < self.shared.buffers_max {
                s.buffers += 1;
                drop(s);
                return AlignedBuf::zeroed(len);
            }
            self.shared.cv.wait(&mut s);
        }
    }

    /// Frees the buffers no write holds now (the next writes allocate them again): the
    /// writer thread's idle release.
    pub fn release_free(&self) {
        let mut s = self.shared.state.lock();
        let freed = s.free.len();
        s.free.clear();
        s.buffers -= freed;
    }

    fn give_back(&self, buf: AlignedBuf) {
        let mut s = self.shared.state.lock();
        s.free.push(buf);
        self.shared.cv.notify_all();
    }
}

impl Drop for WritePipe {
    fn drop(&mut self) {
        {
            let mut s = self.shared.state.lock();
            s.closed = true;
            self.shared.cv.notify_all();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

/// An I/O thread: writes jobs in submission order until the pipe is closed and empty.
fn io_loop(shared: &Shared) {
    loop {
        let job = {
            let mut s = shared.state.lock();
            loop {
                if let Some(job) = s.queue.pop_front() {
                    break job;
                }
                if s.closed {
                    return;
                }
                shared.cv.wait(&mut s);
            }
        };
        let Job {
            file,
            buf,
            len,
            offset,
        } = job;
        let result = file.inner.write_at(&buf[..len], offset);
        file.end(offset, offset + len as u64, &result);
        let mut s = shared.state.lock();
        s.free.push(buf);
        shared.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{MemStorage, Storage, PAGE_BYTES};

    fn file(storage: &MemStorage, name: &str, len: u64) -> Arc<TrackedFile> {
        let f: Arc<dyn LogFile> = Arc::from(storage.open(name, len).unwrap());
        Arc::new(TrackedFile::new(f))
    }

    #[test]
    fn overlapping_writes_land_in_submission_order_and_reads_see_them() {
        let storage = MemStorage::new();
        let f = file(&storage, "a", 64 * PAGE_BYTES as u64);
        let pipe = WritePipe::new(3).unwrap();
        // Every write rewrites page 0 and one more page: the last one submitted must win.
        for i in 0..200u32 {
            let page = u64::from(i % 60) + 1;
            pipe.write_with(&f, PAGE_BYTES, 0, |b| b.fill(i as u8))
                .unwrap();
            pipe.write_with(&f, PAGE_BYTES, page * PAGE_BYTES as u64, |b| {
                b.fill(i as u8)
            })
            .unwrap();
        }
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
        f.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 199), "page 0 holds an older write");
        f.sync().unwrap();
        // The same content straight from the wrapped file: nothing in flight after a sync.
        let mut direct = AlignedBuf::zeroed(PAGE_BYTES);
        f.inner.read_at(&mut direct, 0).unwrap();
        assert_eq!(&direct[..], &buf[..]);
        for page in 1..=60u64 {
            f.inner
                .read_at(&mut direct, page * PAGE_BYTES as u64)
                .unwrap();
            // The last i with i % 60 + 1 == page.
            let last = (0..200u32)
                .rev()
                .find(|i| u64::from(i % 60) + 1 == page)
                .unwrap();
            assert!(direct.iter().all(|&b| b == last as u8), "page {page}");
        }
    }

    #[test]
    fn a_failed_write_fails_every_later_use_of_the_file() {
        let storage = MemStorage::new();
        let f = file(&storage, "a", 4 * PAGE_BYTES as u64);
        let pipe = WritePipe::new(2).unwrap();
        // The in-memory backend fails every write once its budget is spent.
        storage.set_write_budget(Some(0));
        pipe.write_with(&f, PAGE_BYTES, 0, |b| b.fill(1)).unwrap();
        assert!(f.sync().is_err());
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
        assert!(f.read_at(&mut buf, 0).is_err());
        assert!(f.write_at(&buf, 0).is_err());
        assert!(pipe.write_with(&f, PAGE_BYTES, 0, |_| ()).is_err());
        storage.set_write_budget(None);
        assert!(f.sync().is_err(), "a failed file stays failed");
    }

    #[test]
    fn dropping_the_pipe_finishes_every_write() {
        let storage = MemStorage::new();
        let f = file(&storage, "a", 32 * PAGE_BYTES as u64);
        {
            let pipe = WritePipe::new(2).unwrap();
            for page in 0..32u64 {
                pipe.write_with(&f, PAGE_BYTES, page * PAGE_BYTES as u64, |b| {
                    b.fill(page as u8 + 1)
                })
                .unwrap();
            }
        }
        assert!(f.state.lock().pending.is_empty());
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
        for page in 0..32u64 {
            f.inner.read_at(&mut buf, page * PAGE_BYTES as u64).unwrap();
            assert!(buf.iter().all(|&b| b == page as u8 + 1));
        }
    }

    #[test]
    fn released_buffers_are_freed_and_writes_go_on() {
        let storage = MemStorage::new();
        let f = file(&storage, "a", 8 * PAGE_BYTES as u64);
        let pipe = WritePipe::new(2).unwrap();
        for page in 0..8u64 {
            pipe.write_with(&f, PAGE_BYTES, page * PAGE_BYTES as u64, |b| b.fill(1))
                .unwrap();
        }
        f.sync().unwrap();
        // An I/O thread gives its buffer back just after its write ended (which is all a
        // sync waits for): wait until every buffer is back in the free list.
        let start = std::time::Instant::now();
        while {
            let s = pipe.shared.state.lock();
            s.free.len() != s.buffers
        } {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "buffers not back"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let made = pipe.shared.state.lock().buffers;
        assert!(made >= 1 && made <= pipe.shared.buffers_max, "{made}");
        pipe.release_free();
        {
            let s = pipe.shared.state.lock();
            assert_eq!((s.buffers, s.free.len()), (0, 0));
        }
        pipe.write_with(&f, PAGE_BYTES, 0, |b| b.fill(2)).unwrap();
        f.sync().unwrap();
        let mut buf = AlignedBuf::zeroed(PAGE_BYTES);
        f.inner.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 2));
        assert_eq!(pipe.shared.state.lock().buffers, 1);
    }
}
