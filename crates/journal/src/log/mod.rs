//! One topic's log: append-only segments, the writer's `.head` (state and
//! duplicate index), torn-tail repair, reading, compaction and retention.
//!
//! FORMAT.md explains the files; this module is the code that keeps the
//! promises made there. It sits below the store and knows nothing of it
//! (nor of `watch`): it takes a topic directory and a [`Config`].
//!
//! * `segment`: segment names, listing, scanning (resynchronising after a
//!   bad frame), reading (backwards, new records behind a [`LogCursor`]).
//! * `head`: the `.head` header (read and written with pread/pwrite, never
//!   mapped), the `kn_id` index slots, writing and rebuilding a head.
//! * `writer`: [`Writer`], the locked appender (attach or reuse, torn-tail
//!   recovery, duplicate check, append, roll) and the free-space gauge.
//! * `blob`: payloads stored once in `.blobs/` and linked into each topic
//!   that holds them; readers that put payloads back.
//! * `blob_gc`: the sweep's pass over `.blobs/`: blobs nothing links,
//!   removed once past their grace, a bounded share at a time.
//! * `compact`: compaction and journal retention ([`CompactReport`]).
//! * `verify`: checking every record of a topic.
//! * `removed`: the last sequence numbers of removed topics (`.removed`),
//!   after which a topic created again goes on numbering.
//! * here: the shared file names and modes, opening files group-writable,
//!   syncing a directory, and the test failpoints.
//!
//! [`Config`]: crate::Config

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind as IoKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{Error, Result};

mod batch;
mod blob;
mod blob_gc;
mod compact;
mod head;
mod removed;
mod segment;
mod space;
mod verify;
mod writer;

pub use compact::CompactReport;
pub(crate) use blob_gc::sweep_orphan_blobs;
pub use blob_gc::write_cursor;
pub(crate) use compact::remove_topic_dir;
pub(crate) use segment::unlinked;
pub use segment::LogCursor;
pub(crate) use head::indexed_ids;
pub use head::last_seq_of;
pub(crate) use removed::record as record_removed;
pub(crate) use removed::first_seq as removed_first_seq;
pub(crate) use blob::{orphan_blobs, read_backwards, read_backwards_after, read_new_hinted, sweep as sweep_blobs, SharedPayload};
pub use blob::{blobs_of, read_new, release as release_blobs};
pub use segment::cursor_at_end;
pub(crate) use segment::{is_segment_file, list_segments, read_written, segment_name, stat_fd, KeptSegment, ReadHints, Stop, Written};
pub(crate) use verify::{BadFrame, verify_dir};
pub(crate) use writer::removed;
pub use space::SpaceGauge;
pub use writer::{Appended, TopicFiles, Writer};
pub(crate) use batch::copy_error;

pub(crate) const LOCK_FILE: &str = ".lock";
/// The file of a log directory that holds its head (next seq, active
/// segment, the `kn_id` index): FORMAT.md, "`.head`".
pub const HEAD_FILE: &str = ".head";

/// Modes of files and directories the store creates: group-writable so the
/// web server and sensors run by other users of one group can all write,
/// never world-writable (the umask may remove more).
pub(crate) const FILE_MODE: u32 = 0o664;

/// Fault injection for tests, compiled in only with the `failpoints`
/// feature: true when the file named by `KN_FAILPOINT` lists `name`
/// (`append-eio`: half a record is written, then EIO; `fsync-eio`: the
/// `fdatasync` of `KN_SYNC=always` fails with EIO; `blob-stored`: a blob
/// is stored, then EIO before it is linked; `blob-linked`: a blob is
/// linked into the topic, then EIO before the record is written;
/// `forward-eio`, `forward-enospc`, `forward-emfile`: a local delivery
/// along a route fails with that error before it appends, see
/// `store/outbox.rs`; `window-eio`: a window log record is not written,
/// see `store/windows.rs`).
#[cfg(feature = "failpoints")]
pub(crate) fn failpoint(name: &str) -> bool {
    std::env::var_os("KN_FAILPOINT")
        .and_then(|path| fs::read_to_string(path).ok())
        .is_some_and(|armed| armed.split_whitespace().any(|w| w == name))
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub(crate) fn failpoint(_name: &str) -> bool {
    false
}

fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(libc::EIO)
}

fn open_rw(path: &Path, create: bool) -> std::io::Result<File> {
    match without_atime(OpenOptions::new().read(true).write(true), path) {
        Err(e) if create && e.kind() == IoKind::NotFound => open_shared(path, false),
        other => other,
    }
}

/// Opens `path` for reading only, as [`without_atime`] does.
pub(crate) fn open_read(path: &Path) -> std::io::Result<File> {
    without_atime(OpenOptions::new().read(true), path)
}

/// Set once the kernel refused `O_NOATIME` (the files belong to another
/// user and this process may not bypass that): later opens do not ask.
static NOATIME_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Opens `path` with `options` and `O_NOATIME`, so that reading a
/// segment or a `.head` written since its last read does not write its
/// inode (with `relatime`, every read after a write updates the access
/// time: a tunnel's read of each delivery and a writer's read of the
/// head of each append did). Nothing in the store uses access times.
/// Where the kernel refuses the flag (`EPERM`: another user's file), it
/// opens without it, and stops asking.
pub(super) fn without_atime(options: &mut OpenOptions, path: &Path) -> std::io::Result<File> {
    use std::sync::atomic::Ordering;
    if NOATIME_REFUSED.load(Ordering::Relaxed) {
        return options.open(path);
    }
    match options.clone().custom_flags(libc::O_NOATIME).open(path) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            NOATIME_REFUSED.store(true, Ordering::Relaxed);
            options.open(path)
        }
        other => other,
    }
}

/// Replaces `path` by a file holding `bytes`: written to `temp` (created
/// group-writable as [`open_shared`] does, or emptied) and renamed over
/// `path`, so that a reader sees the old file or the new, never half of
/// one. The temporary is removed when that fails. Every small state file
/// of the store that is rewritten whole goes through it.
pub fn write_replacing(temp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let written = open_shared(temp, false).and_then(|f| {
        f.set_len(0)?;
        f.write_all_at(bytes, 0)
    });
    written.and_then(|()| std::fs::rename(temp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(temp);
    })
}

/// Opens `path` for reading and writing (appending if `append`), creating
/// it group-writable if it does not exist. The mode is set only on
/// creation: changing the mode of another user's file is not allowed.
pub fn open_shared(path: &Path, append: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).append(append);
    match without_atime(&mut options, path) {
        Err(e) if e.kind() == IoKind::NotFound => {
            // A file this process creates is its own: `O_NOATIME` is allowed.
            let mut create = options.clone();
            match create.create_new(true).mode(FILE_MODE).custom_flags(libc::O_NOATIME).open(path) {
                Ok(f) => group_writable(&f).map(|_| f),
                // Another process created it first: it set the mode.
                Err(e) if e.kind() == IoKind::AlreadyExists => without_atime(&mut options, path),
                Err(e) => Err(e),
            }
        }
        other => other,
    }
}

/// Reads into `buf` from `at` until it is full or the file ends (a
/// `pread` may return less than asked); how many bytes were read.
pub(crate) fn read_at_most(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match read_once(file, &mut buf[got..], at + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// One `pread` at `at` (retried only when interrupted): what it read,
/// which may be short of `buf`.
pub(crate) fn read_once(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    loop {
        match file.read_at(buf, at) {
            Err(e) if e.kind() == IoKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Gives a file the store's mode whatever the umask: group-writable, so
/// that the web server and sensors of one group can all write, and never
/// world-writable. Called only when a file is created.
pub(crate) fn group_writable(f: &File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(fs::Permissions::from_mode(FILE_MODE))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io("cannot sync directory", dir, e))
}
