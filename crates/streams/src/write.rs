//! Writing streams: `create` (a fork's copy in `forks.rs`) and `append`
//! (idempotent producers, JSON mode, closing), under the stream's lock.




use kn_journal::internal::logs::{self as log, Writer};
use kn_journal::Event;

use crate::offset::Epochs;
use crate::state::{name, op};
use crate::*;

impl Streams {
    // ----- create -------------------------------------------------------

    /// Creates the stream at `path` (`PUT`): `created` false when it
    /// exists with the same configuration; `Conflict` when it exists
    /// otherwise (or was deleted and is kept for its forks).
    pub fn create(&self, path: &str, req: &Create) -> StreamResult<Created> {
        self.check_path(path)?;
        if req.ttl.is_some() && req.expires_at.is_some() {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "Stream-TTL and Stream-Expires-At cannot both be given"));
        }
        if let Some(ttl) = req.ttl {
            if time::deadline(time::now_ms(), ttl).is_none() {
                return Err(StreamError::new(StreamErrorKind::BadRequest, format!("Stream-TTL {ttl} is past the times this server can represent")));
            }
        }
        if let Some(at) = &req.expires_at {
            if parse_rfc3339(at).is_none() {
                return Err(StreamError::new(StreamErrorKind::BadRequest, format!("Stream-Expires-At '{at}' is not an RFC 3339 timestamp")));
            }
        }
        if req.body.len() > self.streams_config().max_append_bytes {
            return Err(too_large(req.body.len(), self.streams_config().max_append_bytes));
        }
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.refresh(&mut entry)?;
        if !entry.state.is_of(path) {
            return Err(collision(path));
        }
        if entry.state.exists && !entry.state.soft_deleted && self.expired(&entry) {
            self.expire(path, &mut entry)?;
        }
        if entry.state.exists {
            return self.recreate(path, req, &entry);
        }
        // The fork's source, read before anything is written.
        let source = match &req.fork_from {
            Some(from) => Some(self.fork_source(from, req)?),
            None => None,
        };
        let mut content_type = req.content_type.clone();
        let (mut ttl, mut expires_at) = (req.ttl, req.expires_at.clone());
        if let Some(src) = &source {
            match &content_type {
                Some(ct) if essence(ct) != essence(&src.info.content_type) => {
                    return Err(StreamError::new(StreamErrorKind::Conflict, format!("content type '{ct}' differs from the source's '{}'", src.info.content_type)));
                }
                Some(_) => {}
                None => content_type = Some(src.info.content_type.clone()),
            }
            if ttl.is_none() && expires_at.is_none() {
                ttl = src.info.ttl;
                expires_at = src.info.expires_at.clone();
            }
        }
        let content_type = content_type.unwrap_or_else(|| "application/octet-stream".to_owned());
        let initial = if is_json(&content_type) && !req.body.is_empty() {
            json::messages(&req.body, true)?.join(",").into_bytes()
        } else {
            req.body.clone()
        };
        if let Some(topic) = &req.topic {
            if !self.bridge_allowed() {
                return Err(StreamError::new(StreamErrorKind::Store(kn_journal::ErrorKind::Forbidden), BRIDGE_OFF));
            }
            kn_journal::Topic::parse(topic).map_err(|e| StreamError::new(StreamErrorKind::BadRequest, e.to_string()))?;
            if !is_json(&content_type) {
                return Err(StreamError::new(StreamErrorKind::BadRequest, "only application/json streams can be bound to a topic"));
            }
        }
        let Some(mut w) = self.writer(&mut entry, true)? else { return Err(not_found(path)) };
        if !entry.state.exists && entry.cursor.as_ref().is_some_and(|c| c.last_seq() > 0) {
            // Records without a create: a creation that crashed half-way
            // (creators hold the lock throughout). Start afresh, so that
            // a fork's copied checkpoints begin at 1.
            drop(w);
            self.remove(path, &mut entry)?;
            w = match self.writer(&mut entry, true)? {
                Some(w) => w,
                None => return Err(not_found(path)),
            };
        }
        if !entry.state.is_of(path) {
            self.release(&mut entry, w);
            return Err(collision(path));
        }
        if entry.state.exists {
            // Another process created it while we looked.
            self.release(&mut entry, w);
            return self.recreate(path, req, &entry);
        }
        let result = (|| {
            if let Some(src) = &source {
                for r in &src.records {
                    self.append_record(&mut entry, &mut w, r.clone())?;
                }
            }
            let mut e = Event::new();
            e.set(name::OP, op::CREATE);
            e.set(name::PATH, path);
            e.set(name::CONTENT_TYPE, content_type.as_str());
            e.set(name::CREATED, format!("{}-{}", time::now_ms(), kn_journal::fresh_id()));
            // A new incarnation's offsets never repeat an earlier one's
            // (offset.rs); a fork's inherited records keep their source's.
            e.set(name::OFFSET_EPOCH, Epochs::draw().to_string());
            if let Some(t) = ttl {
                e.set(name::TTL, t.to_string());
            }
            if let Some(at) = &expires_at {
                e.set(name::EXPIRES_AT, at.as_str());
            }
            if let Some(src) = &source {
                e.set(name::FORK_FROM, src.info.path.as_str());
                e.set(name::FORK_OFFSET, src.offset.to_string());
                e.set(name::FORK_SUB, req.fork_sub_offset.to_string());
                e.set(name::FORK_DEPTH, (src.depth + 1).to_string());
                e.set(name::FORK_EPOCHS, Epochs::format_table(&src.info.epochs.for_fork(src.offset)));
            }
            if let Some(topic) = &req.topic {
                e.set(name::TOPIC, topic.as_str());
                // Only what is notified from now on is imported.
                let dir = kn_journal::Topic::parse(topic).map(|t| t.dir(&self.config().root));
                if let Ok(dir) = dir {
                    let at = log::cursor_at_end(&dir).map(|c| c.last_seq()).unwrap_or(0);
                    e.set(name::TOPIC_SEQ, at.to_string());
                }
            }
            if req.closed {
                e.set(name::CLOSE, "true");
            }
            if !initial.is_empty() {
                e.set(kn_journal::KN_PAYLOAD, initial.clone());
            }
            self.append_record(&mut entry, &mut w, e)?;
            let _ = log::open_shared(&entry.dir.join(ACCESS_FILE), false);
            self.refresh(&mut entry)
        })();
        self.release(&mut entry, w);
        if let Err(e) = result {
            // Never leave half a stream: its create record is what makes
            // it exist, so remove what was written before it.
            if !entry.state.exists {
                let _ = self.remove(path, &mut entry);
            }
            return Err(e);
        }
        if let Some(src) = &source {
            self.count_fork(&src.info.path, op::FORK_ADDED)?;
        }
        Ok(Created { created: true, info: Self::info(&entry) })
    }

    /// `PUT` on an existing stream: the same configuration or a conflict.
    fn recreate(&self, path: &str, req: &Create, entry: &Entry) -> StreamResult<Created> {
        let s = &entry.state;
        let conflict = |why: &str| Err(StreamError::new(StreamErrorKind::Conflict, format!("stream '{path}' exists with {why}")));
        if s.soft_deleted {
            return conflict("its forks still reading it (deleted)");
        }
        if let Some(ct) = &req.content_type {
            if essence(ct) != essence(&s.content_type) {
                return conflict(&format!("another content type ({})", s.content_type));
            }
        }
        if req.fork_from.is_none() && (req.ttl != s.ttl || req.expires_at != s.expires_at) {
            return conflict("another TTL or expiry");
        }
        if req.closed != s.closed {
            return conflict(if s.closed { "closed" } else { "open" });
        }
        if req.fork_from.as_deref().map(source_path) != s.fork_from.as_deref() {
            return conflict("another fork source");
        }
        if req.fork_from.is_some() && req.fork_offset.is_some() && req.fork_offset.map(Offset::seq) != s.fork_offset {
            return conflict("another fork offset");
        }
        if req.fork_from.is_some() && req.fork_sub_offset != s.fork_sub {
            return conflict("another fork sub-offset");
        }
        if req.topic.is_some() && req.topic != s.topic {
            return conflict("another topic");
        }
        Ok(Created { created: false, info: Self::info(entry) })
    }

    // ----- append -------------------------------------------------------

    /// Appends to the stream at `path` (`POST`), closing it with
    /// `close`; checks the producer and `Stream-Seq` and writes their new
    /// state in the same record.
    pub fn append(&self, path: &str, req: &Append<'_>) -> StreamResult<Appended> {
        self.check_path(path)?;
        let max = self.streams_config().max_append_bytes;
        if req.body.len() > max {
            return Err(too_large(req.body.len(), max));
        }
        if req.body.is_empty() && !req.close {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "an append needs a body (or Stream-Closed: true)"));
        }
        if let Some(p) = &req.producer {
            let max = self.streams_config().max_producer_id_bytes;
            if p.id.len() > max {
                return Err(StreamError::new(StreamErrorKind::BadRequest, format!("a Producer-Id of {} bytes is longer than the limit of {max} (KN_STREAM_MAX_PRODUCER_ID_BYTES)", p.id.len())));
            }
        }
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        // The writer brings the state up to date under the lock: the
        // checks of `live` are made there, with one read of the log.
        let Some(mut w) = self.writer(&mut entry, false)? else { return Err(not_found(path)) };
        if entry.state.exists && !entry.state.soft_deleted && self.expired(&entry) {
            drop(w);
            self.expire(path, &mut entry)?;
            return Err(not_found(path));
        }
        let result = self.append_locked(path, req, &mut entry, &mut w);
        self.release(&mut entry, w);
        let (mut appended, posted) = result?;
        self.touch(&entry);
        let bound = entry.state.topic.clone();
        drop(entry);
        if let (Some(topic), Some((at, messages))) = (bound, posted) {
            appended.bridge_error = if self.bridge_allowed() {
                self.post_to_topic(path, &topic, at, &messages).err().map(|e| e.to_string())
            } else {
                Some(BRIDGE_OFF.to_owned())
            };
        }
        Ok(appended)
    }

    /// An append as [`Streams::append`] makes it, when it can be made at
    /// once: in a watched process whose state of the stream matches the
    /// log (the head, read under the lock, names the last record read),
    /// without waiting for a lock (the stream's, in this process or any
    /// other) or reading the log, without a sync (`sync=none`: the record
    /// goes to the page cache) and with nothing more to do (no TTL to
    /// slide, no bound topic to import from or post to); `None`
    /// otherwise: call [`Streams::append`]. For a server's event loop,
    /// which must not block. System calls: `flock` (try), `pread` of the
    /// head, `fstat` of the segment, `pwrite` of the record and of the
    /// head, `flock` (unlock).
    pub fn append_nowait(&self, path: &str, req: &Append<'_>) -> Option<StreamResult<Appended>> {
        // On a shared store every write is a round trip to the file
        // server, and a lock call may wait for its turn (`shared::lock`).
        if self.config().sync == kn_journal::SyncPolicy::Always || self.config().shared == kn_journal::Shared::On || !self.watched {
            return None;
        }
        let long_id = req.producer.as_ref().is_some_and(|p| p.id.len() > self.streams_config().max_producer_id_bytes);
        if req.body.is_empty() || req.body.len() > self.streams_config().max_append_bytes || long_id {
            return None;
        }
        let cell = self.entries.try_lock().ok()?.get(path)?.clone();
        let mut guard = self.try_hold(&cell)?;
        let entry = &mut *guard;
        if entry.ino == 0 || entry.verify.is_some() || !entry.state.is_plain() {
            return None;
        }
        let read = entry.cursor.as_ref()?.last_seq();
        let files = entry.files.take()?;
        if !files.try_lock(self.config()) {
            entry.files = Some(files);
            return None;
        }
        // Held: reopened without a second `flock`. A removed stream's
        // spoiled head, or a segment changed, fails the reopen (the files
        // are closed, the lock released): the slow path opens afresh.
        let mut w = Writer::reopen_held(&self.writing, false, files).ok()??;
        if w.last_seq() != read {
            // Another process appended: the slow path reads its records.
            self.release(entry, w);
            return None;
        }
        let result = self.append_locked(path, req, entry, &mut w);
        self.release(entry, w);
        Some(result.map(|(appended, _)| appended))
    }

    #[allow(clippy::type_complexity)]
    fn append_locked(&self, path: &str, req: &Append<'_>, entry: &mut Entry, w: &mut Writer<'_>) -> StreamResult<(Appended, Option<(Offset, Vec<String>)>)> {
        self.import_locked(entry, w)?;
        let s = &entry.state;
        if !s.exists || s.soft_deleted || !s.is_of(path) {
            return Err(if s.exists && s.is_of(path) { StreamError::new(StreamErrorKind::Gone, format!("stream '{path}' was deleted")) } else { not_found(path) });
        }
        let done = |entry: &Entry, stored: bool, producer| Appended { info: Self::info(entry), stored, producer, bridge_error: None };
        if s.closed {
            if let (Some(p), Some((id, epoch, seq))) = (&req.producer, &s.closed_by) {
                if &p.id == id && p.epoch == *epoch && p.seq == *seq {
                    return Ok((done(entry, false, Some((p.epoch, p.seq))), None));
                }
            }
            if req.body.is_empty() && req.close {
                return Ok((done(entry, false, None), None));
            }
            let mut e = StreamError::new(StreamErrorKind::Closed, format!("stream '{path}' is closed"));
            e.next_offset = Some(s.epochs.offset(s.tail).to_string());
            return Err(e);
        }
        if !req.body.is_empty() {
            match req.content_type {
                None => return Err(StreamError::new(StreamErrorKind::BadRequest, "an append needs a Content-Type")),
                Some(ct) if essence(ct) != essence(&s.content_type) => {
                    return Err(StreamError::new(StreamErrorKind::Conflict, format!("content type '{ct}' is not the stream's '{}'", s.content_type)));
                }
                Some(_) => {}
            }
        }
        if let Some(p) = &req.producer {
            match s.producers.get(&p.id) {
                Some(&(epoch, _)) if p.epoch < epoch => {
                    let mut e = StreamError::new(StreamErrorKind::StaleEpoch, format!("producer '{}' epoch {} is stale (current {epoch})", p.id, p.epoch));
                    e.epoch = Some(epoch);
                    return Err(e);
                }
                Some(&(epoch, _)) if p.epoch > epoch && p.seq != 0 => {
                    return Err(StreamError::new(StreamErrorKind::BadRequest, format!("a new epoch must start at sequence 0, not {}", p.seq)));
                }
                Some(&(epoch, last)) if p.epoch == epoch && p.seq <= last => {
                    return Ok((done(entry, false, Some((epoch, last))), None));
                }
                Some(&(epoch, last)) if p.epoch == epoch && p.seq > last + 1 => {
                    let mut e = StreamError::new(StreamErrorKind::SequenceGap, format!("producer '{}' sent sequence {} after {last}", p.id, p.seq));
                    e.gap = Some((last + 1, p.seq));
                    return Err(e);
                }
                None if p.seq != 0 => {
                    let mut e = StreamError::new(StreamErrorKind::SequenceGap, format!("producer '{}' is new: its first sequence must be 0, not {}", p.id, p.seq));
                    e.gap = Some((0, p.seq));
                    return Err(e);
                }
                None if s.producers.len() >= self.streams_config().max_producers => {
                    return Err(StreamError::new(StreamErrorKind::BadRequest, format!("stream '{path}' has the most producers allowed ({}, KN_STREAM_MAX_PRODUCERS): a new Producer-Id is refused", self.streams_config().max_producers)));
                }
                _ => {}
            }
        }
        if let Some(seq) = req.stream_seq {
            if s.stream_seq.as_deref().is_some_and(|last| seq <= last) {
                return Err(StreamError::new(StreamErrorKind::Conflict, "Stream-Seq is not greater than the last one"));
            }
        }
        let messages: Vec<String> = if s.content_type.is_empty() || !is_json(&s.content_type) || req.body.is_empty() {
            Vec::new()
        } else {
            json::messages(req.body, false)?.into_iter().map(str::to_owned).collect()
        };
        let mut e = Event::new();
        if req.body.is_empty() {
            e.set(name::OP, op::CLOSE);
        } else {
            e.set(name::OP, op::APPEND);
            if is_json(&s.content_type) {
                e.set(kn_journal::KN_PAYLOAD, messages.join(","));
            } else {
                e.set(kn_journal::KN_PAYLOAD, req.body.to_vec());
            }
        }
        if let Some(p) = &req.producer {
            e.set(name::PRODUCER, p.id.as_str());
            e.set(name::EPOCH, p.epoch.to_string());
            e.set(name::SEQ, p.seq.to_string());
        }
        if let Some(seq) = req.stream_seq {
            e.set(name::STREAM_SEQ, seq.to_vec());
        }
        if req.close {
            e.set(name::CLOSE, "true");
        }
        let at = self.append_record(entry, w, e)?;
        self.counted.append(req.body.len());
        if entry.cursor.as_ref().is_none_or(|c| c.last_seq() < at) {
            self.refresh_until(entry, Some(at), None)?;
        }
        let producer = req.producer.as_ref().map(|p| (p.epoch, p.seq));
        let posted = if messages.is_empty() { None } else { Some((entry.state.epochs.offset(at), messages)) };
        Ok((done(entry, true, producer), posted))
    }
}

/// `PUT` of a path whose directory holds another stream (the hashes of
/// the two paths collide): refused, the other stream untouched.
fn collision(path: &str) -> StreamError {
    StreamError::new(StreamErrorKind::Conflict, format!("stream '{path}' cannot be created: its directory holds another stream (the hashes of the two paths collide)"))
}
