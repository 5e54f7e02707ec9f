//! The reader side of a zone read: reader threads read the version log (in windows) and
//! the segments ahead into a bounded set of buffers ([`Pipe`]), which the calling thread
//! and the validating threads take as they arrive; a second reader gives way when
//! another zone read runs in the engine ([`RunningRead`]). Every buffer is returned, and
//! a failing or panicking thread ends the pipeline for all. See the [parent module](super).

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

use crate::error::{io_context, LogError, LogResult};
use crate::seclog;
use crate::storage::{round_up_to_page, AlignedBuf, LogFile};

/// Counts a zone read as running in its engine while it lives.
pub(super) struct RunningRead<'a> {
    pub(super) count: &'a AtomicUsize,
}

impl<'a> RunningRead<'a> {
    pub(super) fn start(count: &'a AtomicUsize) -> RunningRead<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        RunningRead { count }
    }

    /// Other zone reads running in the engine now.
    pub(super) fn others(&self) -> usize {
        self.count.load(Ordering::Acquire).saturating_sub(1)
    }
}

impl Drop for RunningRead<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes of one read request: a segment is read in pieces of this size (on the virtio
/// disk measured, sequential O_DIRECT reads of 2 MiB reached 1.2–2.1 GB/s where 8 MiB
/// ones stayed at 1.1 GB/s).
pub(super) const READ_PIECE_BYTES: usize = 2 << 20;

/// Reader threads of a zone read running alone: one reads the version log and then
/// segments, the others segments from the start. Two sequential streams read faster than
/// one on the disk measured (fio: 1.5 vs 1.2 GB/s), and the version log no longer delays
/// the first segments.
pub(super) const READERS: usize = 2;

/// Reader threads of each zone read while others run in this engine (a restorer of
/// several zones): the disk already has several streams, and more of them cost (a 2 GiB
/// recovery of 8 zones on 4 restorers, one disk: 1,983 and 2,044 ms to availability with
/// one reader per zone against 2,098–2,373 ms with two).
pub(super) const READERS_SHARED: usize = 1;

/// Read buffers of the version log (the reader fills some while one is decoded).
pub(super) const VERSION_BUFFERS: usize = 4;

/// Bytes of one version-log read (and of its buffers).
pub(super) const VERSION_WINDOW_BYTES: usize = READ_PIECE_BYTES;

/// Read buffers beyond one per validating thread: the reader keeps reading while the
/// versions are turned into a table and while every thread validates.
pub(super) const READ_AHEAD_BUFFERS: usize = 1;

/// One read of the pipeline: a window of the version log or a segment.
#[derive(Copy, Clone, Debug)]
pub(super) enum ReadJob {
    /// Bytes `offset..offset + len` of the version log's active file.
    Versions { offset: u64, len: usize },
    /// Segment `index` of the secondary log, with its `used` bytes and generation.
    Segment {
        index: usize,
        info: seclog::SegmentInfo,
    },
}

/// A filled read buffer.
pub(super) struct Filled {
    pub(super) job: ReadJob,
    pub(super) buf: AlignedBuf,
    pub(super) len: usize,
}

/// The read pipeline's shared state: free buffers, filled ones in read order.
#[derive(Default)]
pub(super) struct PipeState {
    /// Free buffers for segments.
    pub(super) free: Vec<AlignedBuf>,
    /// Free buffers for version-log windows (kept apart, so that segment reads cannot
    /// take every buffer while the versions, needed first, wait for one).
    pub(super) version_free: Vec<AlignedBuf>,
    /// Version-log windows in file order (one reader reads them all).
    pub(super) versions: std::collections::VecDeque<Filled>,
    /// All version-log windows were pushed.
    pub(super) versions_done: bool,
    pub(super) segments: std::collections::VecDeque<Filled>,
    /// Readers still running.
    pub(super) readers_left: usize,
    pub(super) failed: bool,
}

/// Reader threads reading ahead into a few buffers while the others validate: the disk is
/// kept busy from the first version-log read to the last segment.
#[derive(Default)]
pub(super) struct Pipe {
    pub(super) state: Mutex<PipeState>,
    pub(super) versions_cv: Condvar,
    pub(super) segments_cv: Condvar,
    pub(super) free_cv: Condvar,
}

impl Pipe {
    /// Waits for a free buffer for a version-log window (`versions`) or a segment;
    /// `None` once the pipeline failed.
    pub(super) fn take_free(&self, versions: bool) -> Option<AlignedBuf> {
        let mut state = self.state.lock();
        loop {
            if state.failed {
                return None;
            }
            let free = if versions {
                &mut state.version_free
            } else {
                &mut state.free
            };
            if let Some(buf) = free.pop() {
                return Some(buf);
            }
            self.free_cv.wait(&mut state);
        }
    }

    /// Returns a buffer taken for a version-log window (`versions`) or a segment.
    pub(super) fn give_back(&self, buf: AlignedBuf, versions: bool) {
        let mut state = self.state.lock();
        if versions {
            state.version_free.push(buf);
        } else {
            state.free.push(buf);
        }
        self.free_cv.notify_all();
    }

    pub(super) fn push(&self, filled: Filled) {
        let mut state = self.state.lock();
        match filled.job {
            ReadJob::Versions { .. } => {
                state.versions.push_back(filled);
                self.versions_cv.notify_one();
            }
            ReadJob::Segment { .. } => {
                state.segments.push_back(filled);
                self.segments_cv.notify_one();
            }
        }
    }

    /// The next version-log window in file order; `None` after the last one or once the
    /// pipeline failed.
    pub(super) fn next_versions(&self) -> Option<Filled> {
        let mut state = self.state.lock();
        loop {
            if state.failed {
                return None;
            }
            if let Some(filled) = state.versions.pop_front() {
                return Some(filled);
            }
            if state.versions_done || state.readers_left == 0 {
                return None;
            }
            self.versions_cv.wait(&mut state);
        }
    }

    pub(super) fn versions_read(&self) {
        self.state.lock().versions_done = true;
        self.versions_cv.notify_all();
    }

    /// The next filled segment; `None` once every segment was read and taken or the
    /// pipeline failed.
    pub(super) fn next_segment(&self) -> Option<Filled> {
        let mut state = self.state.lock();
        loop {
            if state.failed {
                return None;
            }
            if let Some(filled) = state.segments.pop_front() {
                return Some(filled);
            }
            if state.readers_left == 0 {
                return None;
            }
            self.segments_cv.wait(&mut state);
        }
    }

    pub(super) fn reader_finished(&self) {
        self.state.lock().readers_left -= 1;
        self.versions_cv.notify_all();
        self.segments_cv.notify_all();
    }

    pub(super) fn fail(&self) {
        self.state.lock().failed = true;
        self.versions_cv.notify_all();
        self.segments_cv.notify_all();
        self.free_cv.notify_all();
    }
}

/// Stops the pipeline if the thread holding it unwinds (a panicking sink), so the reader
/// does not wait for buffers that never come back.
pub(super) struct FailOnPanic<'p>(pub(super) &'p Pipe);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}

/// Reads `[0, len)` of `file` into `buf` in pieces of [`READ_PIECE_BYTES`].
pub(super) fn read_pieces(file: &dyn LogFile, buf: &mut [u8], offset: u64) -> LogResult<()> {
    let mut done = 0;
    for piece in buf.chunks_mut(READ_PIECE_BYTES) {
        file.read_at(piece, offset + done as u64)
            .map_err(io_context("reading for recovery"))?;
        done += piece.len();
    }
    Ok(())
}

/// One reader: first every job of `versions` in order (when given), then segments of
/// `segments` taken in turn with the other readers through `next`. Errors go to `error`.
/// An extra reader (`yields` given) stops taking segments once another zone read runs in
/// the engine; the version reader always reads to the end, so every job is read.
#[allow(clippy::too_many_arguments)]
pub(super) fn read_all(
    pipe: &Pipe,
    versions: Option<&[ReadJob]>,
    segments: &[ReadJob],
    next: &AtomicUsize,
    version_file: &dyn LogFile,
    segment_file: &dyn LogFile,
    segment_bytes: usize,
    error: &Mutex<Option<LogError>>,
    yields: Option<&RunningRead<'_>>,
) {
    let _done = ReaderDone(pipe);
    let read = |job: ReadJob| -> bool {
        let (file, offset, len): (&dyn LogFile, u64, usize) = match job {
            ReadJob::Versions { offset, len } => (version_file, offset, len),
            ReadJob::Segment { index, info } => (
                segment_file,
                (index * segment_bytes) as u64,
                round_up_to_page(info.used as usize).min(segment_bytes),
            ),
        };
        let Some(mut buf) = pipe.take_free(matches!(job, ReadJob::Versions { .. })) else {
            return false;
        };
        let len = len.min(buf.len());
        if let Err(e) = read_pieces(file, &mut buf[..len], offset) {
            error.lock().get_or_insert(e);
            pipe.fail();
            return false;
        }
        pipe.push(Filled { job, buf, len });
        true
    };
    if let Some(versions) = versions {
        for &job in versions {
            if !read(job) {
                return;
            }
        }
        pipe.versions_read();
    }
    loop {
        if yields.is_some_and(|running| running.others() > 0) {
            return;
        }
        let Some(&job) = segments.get(next.fetch_add(1, Ordering::Relaxed)) else {
            return;
        };
        if !read(job) {
            return;
        }
    }
}

/// Counts a reader out of the pipeline when it ends, however it ends.
pub(super) struct ReaderDone<'p>(&'p Pipe);

impl Drop for ReaderDone<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
        self.0.reader_finished();
    }
}
