//! Journals that follow their sources (issue 39), as far as it is built:
//! with `Config::follow` on, a route change into a local journal writes
//! its window (`windows.rs`), and a journal can be read as a view of its
//! windows (`view.rs`) beside its copies, which stay the truth until the
//! switch (docs/design/one-copy.md, "The plan", step 6).
//!
//! What this stage does not do yet, and so where the view and the copies
//! may differ: records placed in a window (direct posts to a journal with
//! a primary window, a secondary route's events) carry no placement, so
//! a journal with a primary window and such records numbers them as
//! copies do but the view cannot (the record field they need is step 3's
//! rest); the window is written after the route record, not before it,
//! and without the journal's lock (the design's order is the journal's
//! lock, then the source's).

use crate::event::{Event, KN_PAYLOAD, KN_ROUTED_FROM, KN_ROUTE_ID, KN_ROUTE_LOCATION};
use crate::log::{self, LogCursor};
use crate::topic::Topic;

use super::view::{self, Entry, Span};
use super::windows::{self, Hop, SourceWindows, WindowChange};
use super::{Destination, Result, Store};

impl Store {
    /// Before a deletion of a route (a record with an empty destination:
    /// a client's deletion, the sweep's, a poisoning) is stored in the
    /// source's `kn_routes` (`routes`), under the source's lock, whose log
    /// ends at `source_end`: the closing record of the route's open
    /// window, first, as FORMAT.md orders it. A failure fails the
    /// deletion, which its client retries: a window is never left open
    /// for a route stored as deleted. A no-op unless `Config::follow`.
    pub(super) fn route_deleting_windows(&self, routes: &Topic, source_end: u64, route: &Event) -> Result<()> {
        if !self.config.follow || route.get(KN_PAYLOAD).is_some_and(|d| !d.is_empty()) {
            return Ok(());
        }
        let Some(source) = routes.parent() else { return Ok(()) };
        self.write_route_windows(&source, source_end, route)
    }

    /// After a route record with a destination was stored in the source's
    /// `kn_routes` (`routes`), under the source's lock, whose log ends at
    /// `source_end`: the window changes it makes (a replaced route's
    /// window closed, a new window opened). Written after the route
    /// record: a crash in between leaves a route without a window, read as
    /// a version-4 route (copies only). A failure is not the route's: the
    /// record is stored, and the copies, which readers read, do not depend
    /// on it. A no-op unless `Config::follow`.
    pub(super) fn route_changed_windows(&self, routes: &Topic, source_end: u64, route: &Event) {
        if !self.config.follow || route.get(KN_PAYLOAD).is_none_or(|d| d.is_empty()) {
            return;
        }
        let Some(source) = routes.parent() else { return };
        let _ = self.write_route_windows(&source, source_end, route);
    }

    fn write_route_windows(&self, source: &Topic, end: u64, route: &Event) -> Result<()> {
        let Some(id) = route.id().filter(|id| !id.is_empty()) else { return Ok(()) };
        let dir = self.dir(source);
        let known = self.windows.get(&dir)?;
        let reason = route.get(super::KN_POISONED).unwrap_or_default().to_vec();
        let mut changes: Vec<WindowChange> = known
            .windows
            .iter()
            .filter(|w| w.is_open() && w.route == id)
            .map(|w| WindowChange::Close { route: id.to_vec(), journal: w.journal.clone(), until: end, spent: end, reason: reason.clone() })
            .collect();
        if let Some(journal) = self.followed_journal(route) {
            if !self.has_primary(&journal, source, &known, id)? {
                let last = self.last_given(&journal, source, &known, id)?;
                let span = Span::opening(end, last);
                let urls = super::job::SourceUrls::of(self, source);
                let location = match route.get("kn_uri") {
                    Some(uri) => uri.to_vec(),
                    None => format!("{}/{}", urls.routes, String::from_utf8_lossy(id)).into_bytes(),
                };
                let hop = Hop { location, routed_from: urls.topic.into_bytes(), route_id: id.to_vec() };
                let filter = route.get("kn_content_filter").map(<[u8]>::to_vec);
                changes.push(WindowChange::Open { route: id.to_vec(), journal: journal.as_str().to_string(), from: end, base: span.base, hop, filter });
            }
        }
        if !changes.is_empty() {
            windows::append(&dir, &self.config, &self.gauge, &changes)?;
        }
        Ok(())
    }

    /// The local journal an active route record delivers to, when a
    /// window can show its events: not poisoned, no content transform
    /// (whose output is new bytes, recorded as copies).
    fn followed_journal(&self, route: &Event) -> Option<Topic> {
        let destination = route.get(KN_PAYLOAD).filter(|d| !d.is_empty())?;
        if route.contains(super::KN_POISONED) || route.contains("kn_content_transform") || route.is_expired(super::now()) {
            return None;
        }
        match self.route_target(destination) {
            Ok(Destination::Local(journal)) if journal.is_journal() => Some(journal),
            _ => None,
        }
    }

    /// The windows into `journal` of every source it names in `.sources`
    /// and of `source` (`known`, without route `changing`'s windows, which
    /// the change closes), with their sources.
    fn windows_into(&self, journal: &Topic, source: &Topic, known: &SourceWindows, changing: &[u8]) -> Result<Vec<(Topic, windows::Window)>> {
        let mut sources = super::sweep_routes::read_sources(&self.dir(journal));
        sources.retain(|s| s != source);
        let mut out: Vec<(Topic, windows::Window)> =
            known.into_journal(journal.as_str()).filter(|w| !(w.is_open() && w.route == changing)).map(|w| (source.clone(), w.clone())).collect();
        for other in sources {
            let found = self.windows.get(&self.dir(&other))?;
            out.extend(found.into_journal(journal.as_str()).map(|w| (other.clone(), w.clone())));
        }
        Ok(out)
    }

    fn has_primary(&self, journal: &Topic, source: &Topic, known: &SourceWindows, changing: &[u8]) -> Result<bool> {
        Ok(self.windows_into(journal, source, known, changing)?.iter().any(|(_, w)| w.is_open()))
    }

    /// The highest checkpoint `journal` has given: its log's last record
    /// (or the number its removal left, FORMAT.md, "Readers and
    /// checkpoints") and every closed window's last number.
    fn last_given(&self, journal: &Topic, source: &Topic, known: &SourceWindows, changing: &[u8]) -> Result<u64> {
        let own = self.journal_last_seq(journal)?;
        let closed = self.windows_into(journal, source, known, changing)?;
        Ok(closed.iter().filter_map(|(_, w)| w.closed.as_ref().map(|c| span_of(w).last_number(c.spent))).fold(own, u64::max))
    }

    fn journal_last_seq(&self, journal: &Topic) -> Result<u64> {
        let dir = self.dir(journal);
        if let Ok(head) = log::open_read(&dir.join(log::HEAD_FILE)) {
            if let Some(last) = log::last_seq_of(&head) {
                return Ok(last);
            }
        }
        Ok(log::removed_first_seq(&self.config, &dir)?.saturating_sub(1))
    }

    /// `journal` read as a view (`view.rs`): its own records, those its
    /// windows' routes copied left out, merged with its windows' events of
    /// their sources, each with its checkpoint and the hop-by-hop elements
    /// of its window; unexpired, oldest first. For tests until the
    /// switch: what a reader will read then.
    pub fn journal_view(&self, journal: &Topic) -> Result<Vec<Event>> {
        let now = super::now();
        Ok(self.view_items(journal)?.0.into_iter().filter(|i| !i.event.is_expired(now)).map(|i| i.event).collect())
    }

    /// [`Store::journal_view`] selected as [`Store::events`] selects from
    /// a journal (PROTOCOL.md 3.4): a resume after a checkpoint (`Exact`,
    /// or `Unknown` for a number the journal never gave), else the newest
    /// `max_n` and those stored within `max_age`.
    pub fn journal_view_selected(&self, journal: &Topic, selection: &super::Selection) -> Result<super::Selected> {
        use super::{Resume, Selected};
        let (items, last_given) = self.view_items(journal)?;
        let t = super::now();
        let (after, resume) = match &selection.since_checkpoint {
            Some(cp) => match std::str::from_utf8(cp).ok().and_then(|s| s.trim().parse::<u64>().ok()) {
                Some(c) if c > 0 && c <= last_given => (c, Resume::Exact),
                _ => (0, Resume::Unknown),
            },
            None if selection.is_empty() => return Ok(Selected { events: Vec::new(), resume: Resume::NotAsked }),
            None => (0, Resume::NotAsked),
        };
        let since = selection.since_checkpoint.is_some();
        let max_n = if since { usize::MAX } else { selection.max_n.unwrap_or(usize::MAX) };
        let cutoff = match selection.max_age {
            Some(a) if !since && a.is_finite() => (t - a).floor(),
            _ => f64::MIN,
        };
        let live: Vec<ViewItem> =
            items.into_iter().filter(|i| i.checkpoint > after && i.stored_secs as f64 >= cutoff && !i.event.is_expired(t)).collect();
        let skip = live.len().saturating_sub(max_n);
        Ok(Selected { events: live.into_iter().skip(skip).map(|i| i.event).collect(), resume })
    }

    /// Every event of the view, expired ones too, oldest first, and the
    /// highest number the journal has given.
    fn view_items(&self, journal: &Topic) -> Result<(Vec<ViewItem>, u64)> {
        let jdir = self.dir(journal);
        let mut sources = super::sweep_routes::read_sources(&jdir);
        sources.sort();
        let mut spans = Vec::new();
        let mut windows_of = Vec::new();
        // A journal removed by the sweep and made again starts above every
        // number it had (`.removed`): a window closed below that was the
        // earlier journal's. (Interim: `.removed` shares a slot among
        // names, so another removal may raise it; a record of the removal
        // in the window log is the lasting rule, docs/design/one-copy.md.)
        let start = log::removed_first_seq(&self.config, &jdir)?;
        for source in &sources {
            for w in self.windows.get(&self.dir(source))?.into_journal(journal.as_str()) {
                let span = span_of(w);
                if w.closed.as_ref().is_some_and(|c| span.last_number(c.spent) < start) {
                    continue;
                }
                spans.push(span);
                windows_of.push((source.clone(), w.clone()));
            }
        }
        let own_records = read_all(&jdir)?;
        // Copies along a route that has a window are what the window
        // shows (shadow mode: both are written until the switch); a route
        // without one (made before windows, or killed before its opening
        // record) is read as its copies.
        let copied = |r: &crate::record::Record| {
            let route_id = r.event.get(KN_ROUTE_ID);
            windows_of.iter().any(|(_, w)| route_id == Some(&w.hop.route_id[..]) && r.event.get(KN_ROUTED_FROM) == Some(&w.hop.routed_from[..]))
        };
        let own: Vec<&crate::record::Record> = own_records.iter().filter(|r| !copied(r)).collect();
        let mut source_records = Vec::new();
        let mut shown = Vec::new();
        for (source, w) in &windows_of {
            let records = read_all(&self.dir(source))?;
            let filter = w.filter.as_ref().and_then(|p| self.compile_filter(p).ok());
            let seqs = records.iter().filter(|r| w.holds(r.seq) && filter.as_ref().is_none_or(|f| f.is_match(r.event.payload()))).map(|r| r.seq).collect();
            shown.push(seqs);
            source_records.push(records);
        }
        let seqs: Vec<u64> = own.iter().map(|r| r.seq).collect();
        let mut last_given = self.journal_last_seq(journal)?;
        for ((source, w), span) in windows_of.iter().zip(&spans) {
            let end = match &w.closed {
                Some(c) => c.spent,
                None => log::cursor_at_end(&self.dir(source))?.last_seq(),
            };
            last_given = last_given.max(span.last_number(end));
        }
        let mut out = Vec::new();
        for (checkpoint, entry) in view::merge(&seqs, &spans, &shown) {
            let (mut event, stored_secs) = match entry {
                Entry::Own(k) => (own[k].event.clone(), own[k].stored_secs),
                Entry::Source { window, seq } => {
                    let Some(r) = source_records[window].iter().find(|r| r.seq == seq) else { continue };
                    let hop = &windows_of[window].1.hop;
                    let mut e = r.event.clone();
                    e.strip_hop_by_hop();
                    e.set(KN_ROUTE_LOCATION, hop.location.clone()).set(KN_ROUTE_ID, hop.route_id.clone()).set(KN_ROUTED_FROM, hop.routed_from.clone());
                    (e, r.stored_secs)
                }
            };
            event.set(crate::event::KN_ROUTE_CHECKPOINT, checkpoint.to_string());
            out.push(ViewItem { checkpoint, stored_secs, event });
        }
        Ok((out, last_given))
    }
}

impl Store {
    /// The store's format, from one walk of its topics (`kn doctor`).
    pub fn store_format(&self) -> Result<windows::StoreFormat> {
        let mut format = windows::StoreFormat { version: 4, ..Default::default() };
        for topic in self.topics()? {
            let dir = self.dir(&topic);
            if !windows::windows_dir(&dir).is_dir() {
                continue;
            }
            let found = windows::read(&dir)?;
            format.window_logs += 1;
            format.converted += usize::from(found.converted);
            format.unreadable += found.unreadable;
        }
        Ok(format)
    }
}

/// One event of a view, with what a selection needs of it.
struct ViewItem {
    checkpoint: u64,
    stored_secs: u64,
    event: Event,
}

fn span_of(w: &windows::Window) -> Span {
    Span { from: w.from, base: w.base, closed: w.closed.as_ref().map(|c| (c.until, c.spent)), placed: Vec::new() }
}

/// Every record of the log in `dir`, blobs put back (none when it has no
/// log).
fn read_all(dir: &std::path::Path) -> Result<Vec<crate::record::Record>> {
    let mut cursor = LogCursor::at(0, 0, 0, 0);
    let mut out = Vec::new();
    if !dir.is_dir() {
        return Ok(out);
    }
    loop {
        let batch = log::read_new(dir, &mut cursor)?;
        if batch.is_empty() {
            return Ok(out);
        }
        out.extend(batch);
    }
}
