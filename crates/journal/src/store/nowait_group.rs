//! Group commit on a server's event loop ([`Store::notify_nowait_group`]):
//! the notifies to one topic that a server's event loop has in hand at
//! once, made together when every lock is free, as [`Store::notify_nowait`]
//! makes one: one lock of the topic, one write of all their records, one
//! head write, then, with routes, the forwarding state marked once, each
//! destination's copies appended together, the cursor moved past the last
//! (FORMAT.md, "Group commit").

use crate::config::SyncPolicy;
use crate::error::Result;
use crate::event::Event;
use crate::ids::now;
use crate::log::{copy_error, Appended, TopicFiles, Writer};
use crate::topic::Topic;

use super::job::SourceUrls;
use super::nowait::{nothing_pending, Target, NOWAIT_LOCK_TRIES};
use super::outbox_delivery::classify_local;
use super::outbox_state::Outbox;
use super::report::{PostReport, Write};
use super::routes::ListedRoute;
use super::{Kept, Store};

impl Store {
    /// [`Store::notify_nowait`] for several notifies to `topic` at once
    /// (a server's event loop that has them in hand together): made
    /// together when they can be made at once, each answered as
    /// [`Store::notify`] answers it alone (its `kn_id`, duplicate or not,
    /// its own write, then its copies), stored in the order given. `None`,
    /// having done nothing: make each with [`Store::notify`] (where posts
    /// waiting for the topic group as well). One event is
    /// [`Store::notify_nowait`].
    pub fn notify_nowait_group(&self, topic: &Topic, mut events: Vec<Event>) -> Option<Vec<Result<PostReport>>> {
        if events.len() < 2 {
            let event = events.pop()?;
            return self.notify_nowait(topic, event).map(|answer| vec![answer]);
        }
        if topic.is_reserved() || self.config.sync == SyncPolicy::Always || self.is_shared() || self.grouping_now(topic) {
            return None;
        }
        let mut kept = self.take_kept(topic);
        let answer = self.post_group_nowait(topic, events, &mut kept);
        self.put_kept(kept);
        answer
    }

    fn post_group_nowait(&self, topic: &Topic, events: Vec<Event>, kept: &mut (Option<Topic>, Kept)) -> Option<Vec<Result<PostReport>>> {
        kept.1.files.as_ref()?;
        let (generation, routes) = kept.1.routes.clone()?;
        let checked = now();
        let active: Vec<&ListedRoute> = routes.iter().filter(|r| r.route.is_active(checked)).collect();
        if !active.is_empty() && (!self.forwards_at_once(topic, &active) || self.forwarding_now(topic)) {
            return None;
        }
        if topic.is_journal() && self.journal_stale(topic, &mut kept.1) {
            return Some(events.iter().map(|_| Err(self.stale_error(topic))).collect());
        }
        let normalised: Vec<Result<Event>> = events.into_iter().map(|e| self.normalise(e)).collect();
        let group: Vec<&Event> = normalised.iter().filter_map(|e| e.as_ref().ok()).collect();
        if group.is_empty() {
            return Some(normalised.into_iter().map(|e| e.map(|_| PostReport::default())).collect());
        }
        // An event expired already is stored and never forwarded: left to
        // the posts that may wait, as one post made at once leaves it.
        if !active.is_empty() && group.iter().any(|e| e.is_expired(now())) {
            return None;
        }
        let (mut outbox, mut targets, mut copies) = (None, Vec::new(), Vec::new());
        if !active.is_empty() {
            let (locked, locked_targets) = self.lock_forwarding(topic, &active, group[0], &mut kept.1.forwarded)?;
            outbox = Some(locked);
            targets = locked_targets;
            // Each destination's copy of every event, computed before
            // anything is written: a destination that cannot take them
            // all at once leaves the whole group to the posts that wait.
            let urls = SourceUrls::of(self, topic);
            copies = targets.iter().map(|t: &Target<'_>| group.iter().map(|e| self.copy_for(&urls, t.route, (e, None)).map(|(copy, _)| copy)).collect::<Vec<_>>()).collect();
            let fits = targets.iter().zip(&copies).all(|(t, c): (&Target<'_>, &Vec<Option<Event>>)| {
                let c: Vec<&Event> = c.iter().flatten().collect();
                c.is_empty() || t.writer.as_ref().is_some_and(|w| w.appends_at_once_all(&c))
            });
            if !fits {
                self.unlock_forwarding(&mut kept.1.forwarded, outbox, targets);
                return None;
            }
        }
        let tries = if active.is_empty() { NOWAIT_LOCK_TRIES } else { 1 };
        let writer = match self.try_writer(topic, &mut kept.1.files, generation, group[0], tries) {
            Some(writer) if writer.appends_at_once_all(&group) && outbox.as_ref().is_none_or(|outbox| nothing_pending(outbox, writer.last_seq())) => writer,
            writer => {
                if let Some(writer) = writer {
                    kept.1.files = Some(writer.release());
                }
                self.unlock_forwarding(&mut kept.1.forwarded, outbox, targets);
                return None;
            }
        };
        self.groups.grouped.fetch_add(group.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let (appended, files) = self.append_group_held(topic, writer, &group);
        kept.1.files = Some(files);
        let mut reports: Vec<PostReport> = Vec::with_capacity(group.len());
        let mut stored = Vec::with_capacity(group.len());
        let mut failed = Vec::with_capacity(group.len());
        for (event, appended) in group.iter().zip(appended) {
            let id = event.id().unwrap_or(b"").to_vec();
            let mut report = PostReport { id: id.clone(), ..PostReport::default() };
            match appended {
                Ok(Appended::Stored(seq)) => {
                    report.writes.push(Write { topic: topic.clone(), id, checkpoint: seq });
                    stored.push(Some(seq));
                    failed.push(None);
                }
                Ok(Appended::Duplicate) => {
                    report.duplicate = true;
                    stored.push(None);
                    failed.push(None);
                }
                Err(err) => {
                    stored.push(None);
                    failed.push(Some(err));
                }
            }
            reports.push(report);
        }
        match outbox {
            Some(outbox) if stored.iter().any(Option::is_some) => {
                // Stored: a forwarding state that cannot be written leaves
                // the events pending for the next drain, as for one post.
                let _ = self.forward_group_locked(topic, &stored, outbox, targets, copies, &mut reports, &mut kept.1.forwarded);
            }
            outbox => self.unlock_forwarding(&mut kept.1.forwarded, outbox, targets),
        }
        let mut answers = reports.into_iter().zip(failed).map(|(report, failed)| failed.map_or(Ok(report), Err));
        Some(normalised.into_iter().map(|e| e.and_then(|_| answers.next().unwrap_or_else(|| Ok(PostReport::default())))).collect())
    }

    /// Appends `events` to `topic` with `writer` (its lock held, the
    /// appends a few writes), unlocks, and wakes this process's readers
    /// with the records as written; the files back for the caller.
    fn append_group_held(&self, topic: &Topic, mut writer: Writer<'_>, events: &[&Event]) -> (Vec<Result<Appended>>, TopicFiles) {
        let waking = self.appending(topic);
        let appended = writer.append_batch(events, now().max(0.0) as u64, &self.gauge);
        let wrote = appended.iter().any(|a| matches!(a, Ok(Appended::Stored(_))));
        let written = waking.as_ref().and_then(|_| writer.take_written());
        let files = writer.release();
        self.appended_written(waking, wrote, written);
        (appended, files)
    }

    /// Forwards the group's events (`stored`: each one's seq, `None` for
    /// one not stored) to the `targets` locked for them, as one post made
    /// at once forwards its event (`Store::forward_locked`): the state
    /// marked tried up to the last first, each destination's copies
    /// (`copies`, by target then event) appended together in order (a
    /// failure makes the route lag from the first of them), each copy
    /// reported in its own post's answer, the cursor moved past the last.
    #[allow(clippy::too_many_arguments)]
    fn forward_group_locked(
        &self,
        topic: &Topic,
        stored: &[Option<u64>],
        mut outbox: Outbox,
        targets: Vec<Target<'_>>,
        copies: Vec<Vec<Option<Event>>>,
        reports: &mut [PostReport],
        forwarded: &mut Option<std::fs::File>,
    ) -> Result<()> {
        let last = stored.iter().flatten().copied().max().unwrap_or(0);
        let mut state = outbox.state.clone().unwrap_or_default();
        state.tried = Some(state.tried.unwrap_or(last).max(last));
        if let Err(err) = outbox.save_before_delivering(&mut state, &self.config) {
            self.unlock_forwarding(forwarded, Some(outbox), targets);
            return Err(err);
        }
        for (target, copies) in targets.into_iter().zip(copies) {
            let Target { route, topic: dest, writer, mut kept, .. } = target;
            let Some(mut writer) = writer else { continue };
            // The copies of the events stored (moved, not cloned), and
            // whose they are.
            let (run, owned): (Vec<(usize, u64)>, Vec<Event>) =
                copies.into_iter().enumerate().filter_map(|(i, c)| Some(((i, stored[i]?), c?))).unzip();
            let waking = self.appending(&dest);
            let appended: Vec<Result<Appended>> = if dest.is_journal() {
                match writer.append_run(&owned, now().max(0.0) as u64, &self.gauge) {
                    Ok(seqs) => seqs.into_iter().map(|s| Ok(Appended::Stored(s))).collect(),
                    Err(err) => run.iter().map(|_| Err(copy_error(&err))).collect(),
                }
            } else {
                let events: Vec<&Event> = owned.iter().collect();
                writer.append_batch(&events, now().max(0.0) as u64, &self.gauge)
            };
            let wrote = appended.iter().any(|a| matches!(a, Ok(Appended::Stored(_))));
            let written = waking.as_ref().and_then(|_| writer.take_written());
            kept.1.files = Some(writer.release());
            self.appended_written(waking, wrote, written);
            self.put_kept(kept);
            for (((i, seq), copy), appended) in run.iter().zip(&owned).zip(appended) {
                reports[*i].deliveries += 1;
                match appended {
                    Ok(Appended::Stored(at)) => reports[*i].writes.push(Write { topic: dest.clone(), id: copy.id().unwrap_or(b"").to_vec(), checkpoint: at }),
                    Ok(Appended::Duplicate) => {}
                    Err(err) => {
                        self.delivery_failed(topic, route, *seq, classify_local(err), &mut state, &mut reports[*i]);
                        break;
                    }
                }
            }
        }
        state.cursor = last;
        if !state.lagging.is_empty() {
            self.mark_outbox(topic, true);
        }
        let saved = outbox.save(&mut state);
        *forwarded = Some(outbox.release(&self.config));
        saved
    }
}
