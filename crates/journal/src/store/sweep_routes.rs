//! The routes a removal owes (FORMAT.md, "Removal", step 2): the reverse
//! index `.sources` of the routes into a journal, the deletions owed by
//! removed journals settled at each source in one append, and the routes
//! into journals that do not exist, deleted when the sweep visits their
//! source. The sweep (`sweep.rs`) decides what is removed; this file
//! deletes the routes left pointing at it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::event::*;
use crate::ids::now;
use crate::log::Appended;
use crate::topic::Topic;

use super::job::{Job, Stored};
use super::report::PostReport;
use super::routes::RouteList;
use super::sweep_index::{self as index, Owed};
use super::{Destination, Store};

/// In a journal: the source topics of the routes created into it.
pub(super) const SOURCES_FILE: &str = ".sources";
/// A route deletion owed this long (its source failing every slice since)
/// is given up: the route's first delivery poisons it anyway.
const OWED_GIVE_UP: u64 = 24 * 3600;

impl Store {
    /// Deletes the routes owed by the journals this run removed (and by a
    /// run that died before), grouped by source: one read of each
    /// source's routes and one append of all its deletions. What fails is
    /// kept in `.sweep-routes` for the next run (given up after a day).
    /// Returns how many routes were deleted, and the first error.
    pub(super) fn settle_owed(&self, owed: Vec<Owed>) -> (u64, Option<Error>) {
        let mut by_source: BTreeMap<Topic, Vec<Owed>> = BTreeMap::new();
        for owed in owed {
            by_source.entry(owed.source.clone()).or_default().push(owed);
        }
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let threads = self.config.sweep_threads.clamp(1, by_source.len().max(1));
        let mut parts: Vec<Vec<(Topic, Vec<Owed>)>> = vec![Vec::new(); threads];
        for (i, group) in by_source.into_iter().enumerate() {
            parts[i % threads].push(group);
        }
        // Each part: the routes removed, what is still owed, the first error.
        let settle = |part: Vec<(Topic, Vec<Owed>)>| {
            let (mut removed, mut left, mut failed) = (0, Vec::new(), None);
            for (source, owed) in part {
                match self.delete_routes_into(&source, &owed) {
                    Ok(n) => removed += n,
                    Err(e) => {
                        left.extend(owed.into_iter().filter(|o| o.removed_at + OWED_GIVE_UP > t));
                        failed = failed.or(Some(e));
                    }
                }
            }
            (removed, left, failed)
        };
        let settled: Vec<(u64, Vec<Owed>, Option<Error>)> = if threads == 1 {
            parts.into_iter().map(settle).collect()
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = parts.into_iter().map(|part| scope.spawn(move || settle(part))).collect();
                handles.into_iter().filter_map(|h| h.join().ok()).collect()
            })
        };
        let (mut removed, mut left, mut first) = (0, Vec::new(), None);
        for (n, more, failed) in settled {
            removed += n;
            left.extend(more);
            first = first.or(failed);
        }
        if let Err(e) = index::write_owed(&self.config.root, &left) {
            first = first.or(Some(e));
        }
        (removed, first)
    }

    /// Deletes the active routes of `source` into the journals of `owed`
    /// made before their removal (or into one that does not exist now),
    /// each replaced by an inactive route expiring after `tombstone_ttl`,
    /// as [`Store::delete_route`] does, but all in one append; returns how
    /// many.
    fn delete_routes_into(&self, source: &Topic, owed: &[Owed]) -> Result<u64> {
        if !self.dir(&source.routes()).is_dir() {
            return Ok(0);
        }
        let mut into: HashMap<&Topic, u64> = HashMap::new();
        for o in owed {
            let at = into.entry(&o.journal).or_default();
            *at = (*at).max(o.removed_at);
        }
        let mut ids = Vec::new();
        let t = now();
        for listed in self.current_routes(source)?.iter() {
            let route = &listed.route;
            if !route.is_active(t) {
                continue;
            }
            let Ok(Destination::Local(to)) = listed.destination(self) else { continue };
            let Some(&removed_at) = into.get(&to) else { continue };
            // A route made after the removal is into a journal created
            // again since (by a tunnel): it stays.
            if made_at(&route.event) < removed_at as f64 || !self.dir(&to).is_dir() {
                ids.push(route.id().to_vec());
            }
        }
        self.delete_routes_at_once(source, &ids)
    }

    /// Replaces routes `ids` of `source` by deletions expiring after
    /// `tombstone_ttl`, in one append under the locks a route write takes
    /// (the source's, whose route generation changes once, then
    /// `kn_routes`'s); the deletions are then forwarded along the routes
    /// of `kn_routes` like any write there. Returns how many were stored.
    fn delete_routes_at_once(&self, source: &Topic, ids: &[Vec<u8>]) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let t = now();
        let time = format_time(t.floor());
        let expires = format_time(t + self.config.tombstone_ttl.as_secs_f64());
        let events: Vec<Event> = ids
            .iter()
            .map(|id| {
                let mut event = Event::new();
                event.set(KN_ID, id.as_slice()).set(KN_PAYLOAD, "").set(KN_TIME_T, time.as_str()).set(KN_EXPIRES, expires.as_str());
                event
            })
            .collect();
        let routes = source.routes();
        let mut prepare = || Ok(());
        let (mut source_writer, source_kept) = self.writer(source, self.take_kept(source), &mut prepare)?;
        let opened = source_writer.routes_changing().and_then(|_| self.writer(&routes, self.take_kept(&routes), &mut prepare));
        let (mut writer, kept) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                self.keep(source_writer, source_kept);
                return Err(e);
            }
        };
        let waking = self.appending(&routes);
        let mut stored = Vec::new();
        let mut result = Ok(());
        for event in &events {
            // Its window closed first, under the source's lock (follow.rs).
            if let Err(e) = self.route_deleting_windows(&routes, source_writer.last_seq(), event) {
                result = Err(e);
                break;
            }
            match writer.append(event, t.max(0.0) as u64, &self.gauge) {
                Ok(Appended::Stored(seq)) => stored.push((seq, event)),
                Ok(_) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if !stored.is_empty() && writer.wants_compaction() {
            // Best effort: the deletions are stored whatever happens here.
            let _ = writer.compact_wanted(t);
        }
        self.keep(writer, kept);
        self.keep(source_writer, source_kept);
        self.appended(waking, !stored.is_empty());
        if !stored.is_empty() {
            self.changed(&routes);
        }
        let n = stored.len() as u64;
        let jobs: VecDeque<Job> = stored
            .into_iter()
            .map(|(seq, event)| {
                let mut event = event.clone();
                event.set(KN_ROUTE_CHECKPOINT, seq.to_string());
                Job::stored(routes.clone(), event, None, Stored { seq, routes_generation: None, routes: None, listed: false })
            })
            .collect();
        self.run_forwarding(jobs, &mut PostReport::default())?;
        result.map(|_| n)
    }

    /// The routes of `source` (active or not): the list a post to it
    /// kept when the source's route generation still names it (one look
    /// at the source's head, under its lock), else read (and kept). A
    /// source that many removed journals were routed from (a chat room)
    /// is posted to often, and its list is then read once per change, not
    /// once per slice.
    fn current_routes(&self, source: &Topic) -> Result<RouteList> {
        let mut prepare = || Ok(());
        let (writer, kept) = self.writer(source, self.take_kept(source), &mut prepare)?;
        let generation = writer.routes_generation();
        let listed = kept.1.routes.as_ref().filter(|(g, _)| *g == generation).map(|(_, r)| Arc::clone(r));
        self.keep(writer, kept);
        match listed {
            Some(routes) => Ok(routes),
            None => self.read_routes(source, Some(generation)),
        }
    }

    /// Deletes the active routes of `source` into local journals that do
    /// not exist, made longer than `grace` ago: routes no `.sources` lists
    /// (made into a journal not opened yet that never was, made by an
    /// older version, or racing with the removal), which a source without
    /// posts would otherwise keep for ever. Its first delivery would have
    /// poisoned such a route; this ends it the same way, earlier.
    pub(super) fn drop_routes_into_nothing(&self, source: &Topic, grace: Duration) -> Result<u64> {
        if !self.dir(&source.routes()).is_dir() {
            return Ok(0);
        }
        let horizon = now() - grace.as_secs_f64();
        let mut ids = Vec::new();
        for route in self.routes(source)? {
            let Ok(Destination::Local(to)) = self.route_target(route.destination()) else { continue };
            if to.is_journal() && made_at(&route.event) < horizon && !self.dir(&to).is_dir() {
                ids.push(route.id().to_vec());
            }
        }
        self.delete_routes_at_once(source, &ids)
    }
}

/// The source topics listed in a journal's `.sources` (lines that do not
/// name a topic, e.g. one cut by a crash, are skipped).
pub(super) fn read_sources(dir: &Path) -> Vec<Topic> {
    let text = fs::read_to_string(dir.join(SOURCES_FILE)).unwrap_or_default();
    let mut out: Vec<Topic> = text.lines().filter_map(|l| Topic::parse(l).ok()).collect();
    out.sort();
    out.dedup();
    out
}

/// When a route was made (its `kn_time_t`; 0 without one).
fn made_at(route: &Event) -> f64 {
    route.get_str(KN_TIME_T).and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0)
}
