//! What this process's [`Streams`] did, for a server's `/metrics`: appends
//! and their bytes (counted in memory, per process: an append is far too
//! frequent for the store's shared `.stats`), and the live reads waiting
//! now. How many streams the store holds comes from a walk
//! ([`Usage::streams`](kn_journal::internal::Usage::streams)).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Streams;

/// The counters a [`Streams`] keeps.
#[derive(Debug, Default)]
pub(super) struct Counted {
    appends: AtomicU64,
    bytes: AtomicU64,
}

impl Counted {
    /// One append of `bytes` bytes of data stored.
    pub(super) fn append(&self, bytes: usize) {
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A snapshot of [`Streams::figures`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamFigures {
    /// Appends (`POST`s, through [`Streams::append`] or
    /// [`Streams::append_nowait`]) stored by this process; a duplicate
    /// that an idempotent producer sent again is not counted.
    pub appends: u64,
    /// Bytes of data those appends stored (their bodies).
    pub appended_bytes: u64,
    /// Live reads (long-poll, SSE) of this process waiting for data now:
    /// the [`StreamWatch`](super::StreamWatch)es alive.
    pub live_readers: u64,
}

impl Streams {
    /// What this process's streams did so far, and its live readers now.
    pub fn figures(&self) -> StreamFigures {
        StreamFigures {
            appends: self.counted.appends.load(Ordering::Relaxed),
            appended_bytes: self.counted.bytes.load(Ordering::Relaxed),
            live_readers: self.live.load(Ordering::Relaxed) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::{Append, Create, Producer, Streams};
    use kn_journal::Store;

    #[test]
    fn appends_bytes_and_live_readers_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let streams = Streams::new(Arc::new(Store::open(dir.path()).unwrap()));
        streams.create("s/1", &Create::new("text/plain")).unwrap();
        assert_eq!(streams.figures(), Default::default());
        streams.append("s/1", &Append::data(Some("text/plain"), b"hello")).unwrap();
        let mut again = Append::data(Some("text/plain"), b"abc");
        again.producer = Some(Producer { id: "p".into(), epoch: 0, seq: 0 });
        streams.append("s/1", &again).unwrap();
        // The same producer sequence again: a duplicate, not stored.
        assert!(!streams.append("s/1", &again).unwrap().stored);
        // Refused (no such stream): not counted.
        assert!(streams.append("s/2", &Append::data(Some("text/plain"), b"x")).is_err());
        let watch = streams.watch("s/1").unwrap();
        let figures = streams.figures();
        assert_eq!((figures.appends, figures.appended_bytes, figures.live_readers), (2, 8, 1));
        drop(watch);
        assert_eq!(streams.figures().live_readers, 0);
    }
}
