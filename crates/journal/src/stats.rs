//! What the store's background work did, counted across every process that
//! opens the store: the sweep (removed journals, pruned topics, reclaimed
//! bytes), the forwarding outbox (retried and recovered deliveries) and
//! poisoned routes by reason.
//!
//! The counters live in `<root>/.stats`: one little-endian `u64` per
//! [`Counter`], at `8 * counter as usize`. An increment takes the file's
//! `flock`, reads the slot, adds and writes it back, so CGI processes,
//! `serve`, sensors and `kn` all add to the same figures without losing
//! any. Counting happens on rare events (a removal, a retry, a poisoning),
//! never on every post. The file only ever grows by new counters appended at
//! the end; a reader treats a short file as zeros (FORMAT.md, "`.stats`").

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::error::{Error, Result};
use crate::log::open_shared;

/// The name of the counters file in the store's root.
pub const STATS_FILE: &str = ".stats";

/// One counter of [`Counters`]. The discriminant is the slot in `.stats`:
/// never reorder or reuse one; add new counters at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum Counter {
    /// Stale journals removed by the sweep (files, directory, announcement).
    JournalsRemoved = 0,
    /// Empty topics removed by the sweep.
    TopicsPruned = 1,
    /// Bytes of files the sweep and compaction removed.
    BytesReclaimed = 2,
    /// Routes removed because their destination journal was removed, or
    /// deleted routes whose tombstone expired.
    RoutesRemoved = 3,
    /// Deliveries that failed transiently and were kept for a retry.
    DeliveriesRetried = 4,
    /// Deliveries completed from the outbox after the notify that stored
    /// the event could not (killed, or a transient fault).
    DeliveriesRecovered = 5,
    /// Routes poisoned: the destination is not a valid topic name.
    PoisonedBadName = 6,
    /// Routes poisoned: the destination journal is stale.
    PoisonedStale = 7,
    /// Routes poisoned: the destination refused them (the remote server
    /// answered 4xx, or the outbound policy, `KN_OUTBOUND`, forbids the
    /// URL).
    PoisonedRefused = 8,
    /// Routes poisoned: no answer (or 5xx) after every retry.
    PoisonedUnreachable = 9,
    /// Routes poisoned for another permanent reason (a content
    /// transform's failure, access rules).
    PoisonedOther = 10,
    /// Sweep passes run (a CGI slice, a `serve` round or a `kn gc`).
    Sweeps = 11,
}

impl Counter {
    /// Every counter, in slot order.
    pub const ALL: [Counter; 12] = [
        Counter::JournalsRemoved,
        Counter::TopicsPruned,
        Counter::BytesReclaimed,
        Counter::RoutesRemoved,
        Counter::DeliveriesRetried,
        Counter::DeliveriesRecovered,
        Counter::PoisonedBadName,
        Counter::PoisonedStale,
        Counter::PoisonedRefused,
        Counter::PoisonedUnreachable,
        Counter::PoisonedOther,
        Counter::Sweeps,
    ];

    /// The counter's name in `kn stat` and in the Prometheus text format
    /// (there with a `kn_` prefix and a `_total` suffix).
    pub fn name(self) -> &'static str {
        match self {
            Counter::JournalsRemoved => "journals_removed",
            Counter::TopicsPruned => "topics_pruned",
            Counter::BytesReclaimed => "bytes_reclaimed",
            Counter::RoutesRemoved => "routes_removed",
            Counter::DeliveriesRetried => "deliveries_retried",
            Counter::DeliveriesRecovered => "deliveries_recovered",
            Counter::PoisonedBadName => "poisoned_bad_name",
            Counter::PoisonedStale => "poisoned_stale",
            Counter::PoisonedRefused => "poisoned_refused",
            Counter::PoisonedUnreachable => "poisoned_unreachable",
            Counter::PoisonedOther => "poisoned_other",
            Counter::Sweeps => "sweeps",
        }
    }

    /// For a poisoning counter, the `reason` label of
    /// `kn_routes_poisoned_total` it is counted under (a fixed set:
    /// `bad_name`, `stale`, `refused`, `unreachable`, `other`); `None`
    /// for the others.
    pub fn poison_reason(self) -> Option<&'static str> {
        match self {
            Counter::PoisonedBadName => Some("bad_name"),
            Counter::PoisonedStale => Some("stale"),
            Counter::PoisonedRefused => Some("refused"),
            Counter::PoisonedUnreachable => Some("unreachable"),
            Counter::PoisonedOther => Some("other"),
            _ => None,
        }
    }

    /// One line of help for the Prometheus `# HELP` line.
    pub fn help(self) -> &'static str {
        match self {
            Counter::JournalsRemoved => "Stale journals removed by the sweep.",
            Counter::TopicsPruned => "Empty topics removed by the sweep.",
            Counter::BytesReclaimed => "Bytes of files removed by the sweep and compaction.",
            Counter::RoutesRemoved => "Routes removed with their destination journal, or expired tombstones.",
            Counter::DeliveriesRetried => "Deliveries that failed transiently and were kept for a retry.",
            Counter::DeliveriesRecovered => "Deliveries completed from the outbox after their notify could not.",
            Counter::PoisonedBadName => "Routes poisoned because the destination is not a valid topic.",
            Counter::PoisonedStale => "Routes poisoned because the destination journal is stale.",
            Counter::PoisonedRefused => "Routes poisoned because the remote server answered 4xx or the outbound policy forbids the URL.",
            Counter::PoisonedUnreachable => "Routes poisoned because no answer came after every retry.",
            Counter::PoisonedOther => "Routes poisoned for another permanent reason.",
            Counter::Sweeps => "Sweep passes run.",
        }
    }
}

/// A snapshot of every counter (see [`crate::Store::counters`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    values: [u64; Counter::ALL.len()],
}

impl Counters {
    /// The value of `counter`.
    pub fn get(&self, counter: Counter) -> u64 {
        self.values[counter as usize]
    }

    /// Every counter with its value, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (Counter, u64)> + '_ {
        Counter::ALL.iter().map(|&c| (c, self.get(c)))
    }
}

/// Adds `n` to `counter` in the `.stats` of the store `config` describes.
pub(crate) fn add(config: &crate::Config, counter: Counter, n: u64) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let path = config.root.join(STATS_FILE);
    let f = open_shared(&path, false).map_err(|e| Error::io("cannot open counters", &path, e))?;
    crate::shared::lock(&f, crate::shared::LockKind::Exclusive, config).map_err(|e| Error::io("cannot lock counters", &path, e))?;
    let result = (|| {
        let at = 8 * counter as u64;
        let value = read_slot(&f, at)?.wrapping_add(n);
        f.write_all_at(&value.to_le_bytes(), at)
    })();
    crate::shared::unlock(&f, config);
    result.map_err(|e| Error::io("cannot update counters", &path, e))
}

/// Reads every counter of the store `config` describes (zeros where
/// `.stats` is missing or short).
pub(crate) fn read(config: &crate::Config) -> Result<Counters> {
    let path = config.root.join(STATS_FILE);
    let f = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Counters::default()),
        Err(e) => return Err(Error::io("cannot open counters", &path, e)),
    };
    crate::shared::lock(&f, crate::shared::LockKind::Shared, config).map_err(|e| Error::io("cannot lock counters", &path, e))?;
    let mut counters = Counters::default();
    let result = Counter::ALL.iter().try_for_each(|&c| {
        counters.values[c as usize] = read_slot(&f, 8 * c as u64)?;
        Ok::<_, std::io::Error>(())
    });
    crate::shared::unlock(&f, config);
    result.map_err(|e| Error::io("cannot read counters", &path, e))?;
    Ok(counters)
}

/// The slot at `at`, zero past the end of the file.
fn read_slot(f: &File, at: u64) -> std::io::Result<u64> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        match f.read_at(&mut buf[got..], at + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(if got == 8 { u64::from_le_bytes(buf) } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_and_missing_file_reads_zero() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::Config::new(dir.path());
        assert_eq!(read(&config).unwrap(), Counters::default());
        add(&config, Counter::PoisonedStale, 2).unwrap();
        add(&config, Counter::PoisonedStale, 3).unwrap();
        add(&config, Counter::Sweeps, 1).unwrap();
        let c = read(&config).unwrap();
        assert_eq!(c.get(Counter::PoisonedStale), 5);
        assert_eq!(c.get(Counter::Sweeps), 1);
        assert_eq!(c.get(Counter::JournalsRemoved), 0);
    }

    #[test]
    fn threads_lose_no_increment() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::Config::new(dir.path());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100 {
                        add(&config, Counter::DeliveriesRetried, 1).unwrap();
                    }
                });
            }
        });
        assert_eq!(read(&config).unwrap().get(Counter::DeliveriesRetried), 400);
    }
}
