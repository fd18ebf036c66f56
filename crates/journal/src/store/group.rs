//! Group commit: the posts of this process waiting for the same topic
//! (the threads of `serve` under a busy chat room) are stored together,
//! with one lock of the topic, one write of all their records, one head
//! write and one forwarding pass, each post answered for its own event
//! (FORMAT.md, "Group commit").
//!
//! The technique is `.changes`'s (`changes.rs`): a post queues itself,
//! then takes the topic's turn; whoever has the turn takes every post
//! queued (at most `Config::group_commit`), stores and forwards them, and
//! leaves each its answer; a post whose answer is there when it gets the
//! turn returns it at once. A group of one is an ordinary post
//! ([`Store::run`]), byte for byte. Other processes take the topic's file
//! lock as before and see whole records: nothing on disk is new.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, ErrorKind, Result};
use crate::event::Event;
use crate::ids::now;
use crate::log::{copy_error, Appended};
use crate::topic::Topic;

use super::job::{Job, Stored};
use super::outbox::{InFlight, Own};
use super::report::{PostReport, Write};
use super::routes::RouteList;
use super::Store;

/// The groups of this process's posts, by topic; a topic's entry lives
/// while a post to it is queued or being stored.
#[derive(Default)]
pub(super) struct Groups {
    topics: Mutex<HashMap<Topic, Arc<Group>>>,
    /// Posts stored in a group of more than one ([`Store::grouped_posts`]).
    pub(super) grouped: AtomicU64,
}

/// The posts waiting for one topic, and the turn to store them.
#[derive(Default)]
struct Group {
    waiting: Mutex<Waiting>,
    /// Held by the post storing a group (and by each post looking for its
    /// answer): one group of a topic at a time.
    turn: Mutex<()>,
}

#[derive(Default)]
struct Waiting {
    queue: VecDeque<Post>,
    /// Tickets handed out so far: a post's is its place in the queue.
    tickets: u64,
    /// The answers of posts stored by another post's turn, until taken.
    answers: HashMap<u64, Result<PostReport>>,
    /// How many posts the group being stored now holds.
    storing: usize,
}

/// A post queued for its topic's group.
struct Post {
    ticket: u64,
    job: Job,
    defer: bool,
}

/// What the store step of a group left: each post's append, the topic's
/// route generation and routes (if kept), and whether the stored events
/// were listed in flight.
struct GroupStored {
    appended: Vec<Result<Appended>>,
    generation: u64,
    routes: Option<RouteList>,
    listed: bool,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// How many posts this store has written in a group of more than one
    /// since it was opened (`Config::group_commit`): how often posts to
    /// one topic met and shared a write.
    pub fn grouped_posts(&self) -> u64 {
        self.groups.grouped.load(Ordering::Relaxed)
    }

    /// The posts of this process waiting for `topic` now: how many are
    /// queued for its next group, and how many the group being stored
    /// holds. For diagnostics and tests (a post waits here only while
    /// another post to the topic is being stored).
    pub fn posts_waiting(&self, topic: &Topic) -> (usize, usize) {
        let Some(group) = locked(&self.groups.topics).get(topic).cloned() else {
            return (0, 0);
        };
        let waiting = locked(&group.waiting);
        (waiting.queue.len(), waiting.storing)
    }

    /// Whether `job` (a post's, not stored yet) goes through its topic's
    /// group: group commit on, no blob, not a reserved topic (a write to
    /// `kn_routes` holds its source's lock; the server writes the others).
    pub(super) fn groups_posts(&self, job: &Job) -> bool {
        self.config.group_commit > 1
            && job.payload.is_none()
            && job.stored.is_none()
            && !job.topic.is_reserved()
    }

    /// Whether posts of this process are queued for `topic` or being
    /// stored together now: a post made at once would only race them.
    pub(super) fn grouping_now(&self, topic: &Topic) -> bool {
        locked(&self.groups.topics).contains_key(topic)
    }

    /// [`Store::run`] for a post, through its topic's group: queued, then
    /// stored (and forwarded) by whichever post has the topic's turn, this
    /// one or an earlier one. Returns whether the event was stored, its
    /// report in `report`.
    pub(super) fn run_grouped(
        &self,
        job: Job,
        report: &mut PostReport,
        defer: bool,
    ) -> Result<bool> {
        let topic = job.topic.clone();
        let group = {
            let mut topics = locked(&self.groups.topics);
            Arc::clone(topics.entry(topic.clone()).or_default())
        };
        let ticket = {
            let mut waiting = locked(&group.waiting);
            waiting.tickets += 1;
            let ticket = waiting.tickets;
            waiting.queue.push_back(Post { ticket, job, defer });
            ticket
        };
        let answer = loop {
            let _turn = locked(&group.turn);
            let posts: Vec<Post> = {
                let mut waiting = locked(&group.waiting);
                if let Some(answer) = waiting.answers.remove(&ticket) {
                    break answer;
                }
                if !waiting.queue.iter().any(|p| p.ticket == ticket) {
                    // Taken by a turn that ended without an answer (it
                    // panicked): never stored by it.
                    break Err(Error::new(ErrorKind::Io, format!("the post to '{topic}' was lost by the post storing its group (a bug: please report it)")));
                }
                let n = waiting.queue.len().min(self.config.group_commit.max(1));
                waiting.storing = n;
                waiting.queue.drain(..n).collect()
            };
            let answers = self.commit_group(&topic, posts);
            let mut waiting = locked(&group.waiting);
            waiting.storing = 0;
            waiting.answers.extend(answers);
        };
        {
            let mut topics = locked(&self.groups.topics);
            // Only the map and this post hold it: no one else is queued.
            if Arc::strong_count(&group) == 2 {
                topics.remove(&topic);
            }
        }
        let mut answer = answer?;
        answer.id = std::mem::take(&mut report.id);
        *report = answer;
        Ok(!report.duplicate)
    }

    /// Stores `posts` (all to `topic`, in the order they queued) and
    /// forwards them; each post's answer by its ticket.
    fn commit_group(&self, topic: &Topic, mut posts: Vec<Post>) -> Vec<(u64, Result<PostReport>)> {
        if posts.len() == 1 {
            let Some(post) = posts.pop() else {
                return Vec::new();
            };
            let mut report = PostReport::default();
            let answer = self.run(post.job, &mut report, post.defer).map(|stored| {
                report.duplicate = !stored;
                report
            });
            return vec![(post.ticket, answer)];
        }
        self.groups
            .grouped
            .fetch_add(posts.len() as u64, Ordering::Relaxed);
        // Readers of this process woken once for the group's records.
        let _wakes = crate::watch::WakeBatch::open();
        let mut reports: Vec<PostReport> = posts.iter().map(|_| PostReport::default()).collect();
        let mut queue = VecDeque::new();
        let stored = match self.store_group(topic, &posts, &mut reports[0], &mut queue) {
            Ok(stored) => stored,
            Err(err) => {
                return posts
                    .iter()
                    .map(|p| (p.ticket, Err(copy_error(&err))))
                    .collect()
            }
        };
        let mut errors: Vec<Option<Error>> = posts.iter().map(|_| None).collect();
        // Unlisted once the group's forwarding is over (or left pending).
        let mut in_flight = Vec::new();
        for (i, (post, appended)) in posts.iter().zip(&stored.appended).enumerate() {
            match appended {
                Ok(Appended::Stored(seq)) => {
                    reports[i].writes.push(Write {
                        topic: topic.clone(),
                        id: post.job.event.id().unwrap_or(b"").to_vec(),
                        checkpoint: *seq,
                    });
                    if stored.listed {
                        in_flight.push(InFlight::listed(self, topic, *seq));
                    }
                }
                Ok(Appended::Duplicate) => reports[i].duplicate = true,
                Err(err) => errors[i] = Some(copy_error(err)),
            }
        }
        self.forward_group(topic, &posts, &stored, &mut reports, &mut errors, queue);
        drop(in_flight);
        posts
            .iter()
            .zip(reports.into_iter().zip(errors))
            .map(|(post, (report, error))| (post.ticket, error.map_or(Ok(report), Err)))
            .collect()
    }

    /// The store step of a group: every post's event appended under one
    /// lock of `topic` ([`crate::log::Writer::append_batch`]), those
    /// stored listed in flight before the lock is let go (the forwarding
    /// pass takes them from there), the topic created first if need be
    /// (its announcements reported in `lead` and their forwarding queued).
    fn store_group(
        &self,
        topic: &Topic,
        posts: &[Post],
        lead: &mut PostReport,
        queue: &mut VecDeque<Job>,
    ) -> Result<GroupStored> {
        let kept = self.take_kept(topic);
        let (mut writer, kept) = {
            let mut create = Some(|| -> Result<()> {
                queue.extend(self.ensure_topic(topic, lead)?);
                Ok(())
            });
            let mut prepare = || create.take().map_or(Ok(()), |mut c| c());
            self.writer(topic, kept, &mut prepare)?
        };
        let waking = self.appending(topic);
        let events: Vec<&Event> = posts.iter().map(|p| &p.job.event).collect();
        let appended = writer.append_batch(&events, now().max(0.0) as u64, &self.gauge);
        let wrote = appended
            .iter()
            .any(|a| matches!(a, Ok(Appended::Stored(_))));
        let listed = kept
            .1
            .routes
            .as_ref()
            .is_none_or(|(_, routes)| !routes.is_empty());
        if listed {
            for (appended, event) in appended.iter().zip(&events) {
                if let Ok(Appended::Stored(seq)) = appended {
                    self.list_in_flight(topic, *seq, event);
                }
            }
        }
        let (generation, routes, written) =
            self.after_append(writer, kept, waking.is_some(), wrote);
        self.appended_written(waking, wrote, written);
        if wrote {
            self.changed(topic);
        }
        Ok(GroupStored {
            appended,
            generation,
            routes,
            listed,
        })
    }

    /// The forwarding pass of a group: one drain of `topic` whose own
    /// event is the group's last stored event that has not expired, the
    /// group's earlier events pending before it (taken from memory, in
    /// order, superseded and expired ones left out as a drain reading the
    /// log leaves them out). A group of deferring posts on a topic with
    /// more than `Config::forward_inline` routes leaves it pending
    /// instead, as one such post does. The copies' own forwarding, and a
    /// failure of the pass, are that last post's.
    fn forward_group(
        &self,
        topic: &Topic,
        posts: &[Post],
        stored: &GroupStored,
        reports: &mut [PostReport],
        errors: &mut [Option<Error>],
        mut queue: VecDeque<Job>,
    ) {
        let seq_of = |i: usize| match stored.appended[i] {
            Ok(Appended::Stored(seq)) => Some(seq),
            _ => None,
        };
        let t = now();
        let first = (0..posts.len()).find_map(seq_of);
        let own = (0..posts.len())
            .rev()
            .find(|&i| seq_of(i).is_some() && !posts[i].job.event.is_expired(t));
        let owner = own.unwrap_or(0);
        if let (Some(i), Some(first)) = (own, first) {
            let seq = seq_of(i).unwrap_or(first);
            let stored_at = |seq: u64| Stored {
                seq,
                routes_generation: Some(stored.generation),
                routes: stored.routes.clone(),
                listed: stored.listed,
            };
            // The outbox records the group pending from its first event.
            let mut deferred = Job::stored(topic.clone(), Event::new(), None, stored_at(first));
            if posts.iter().all(|p| p.defer) && self.defer_forwarding(&mut deferred) {
                for (i, report) in reports.iter_mut().enumerate() {
                    report.forwarding_deferred = seq_of(i).is_some();
                }
            } else if let Err(err) = self.drain_group(
                topic,
                Own {
                    seq,
                    event: &posts[i].job.event,
                    payload: None,
                },
                first,
                stored,
                &mut reports[i],
                &mut queue,
            ) {
                if err.kind() == ErrorKind::TooManyDeliveries {
                    errors[i] = Some(err);
                }
            }
        }
        if let Err(err) = self.run_forwarding(queue, &mut reports[owner]) {
            errors[owner] = Some(err);
        }
    }

    /// The drain of [`Store::forward_group`]: along `topic`'s active routes
    /// (read if the store did not keep them), with `own` last and the
    /// group's events from `first` on before it.
    fn drain_group(
        &self,
        topic: &Topic,
        own: Own<'_>,
        first: u64,
        stored: &GroupStored,
        report: &mut PostReport,
        queue: &mut VecDeque<Job>,
    ) -> Result<()> {
        let routes = match &stored.routes {
            Some(routes) => Arc::clone(routes),
            None => self.read_routes(topic, Some(stored.generation))?,
        };
        let t = now();
        if !routes.iter().any(|r| r.route.is_active(t)) {
            return Ok(());
        }
        self.drain_from(topic, Some(own), first, &routes, report, queue)
    }
}
