//! Reading streams: metadata (`head`), catch-up reads (`read`, and
//! `read_cached`, which never blocks), and the wakeups of live reads
//! (`watch`).



use crate::*;

impl Streams {
    // ----- read ---------------------------------------------------------

    /// Metadata (`HEAD`); does not reset a sliding TTL.
    pub fn head(&self, path: &str) -> StreamResult<Info> {
        self.check_path(path)?;
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.live(path, &mut entry)?;
        self.import(&mut entry)?;
        Ok(Self::info(&entry))
    }

    /// Reads from `start` (catch-up), at most
    /// `StreamsConfig::max_read_bytes` (at least one record); resets a
    /// sliding TTL.
    pub fn read(&self, path: &str, start: Start) -> StreamResult<Chunk> {
        self.check_path(path)?;
        let cell = self.entry(path);
        let mut entry = self.hold(&cell);
        self.live(path, &mut entry)?;
        self.import(&mut entry)?;
        self.touch(&entry);
        let info = Self::info(&entry);
        let from = match start {
            Start::Beginning => 0,
            Start::Now => info.tail.seq(),
            Start::At(o) => info.accept(o)?.seq(),
        };
        if from > info.tail.seq() {
            return Err(StreamError::new(StreamErrorKind::BadRequest, format!("offset {} is beyond the tail {}", info.offset_at(from), info.next_offset())));
        }
        if from == info.tail.seq() {
            return Ok(Joined::new(info.is_json(), 0).chunk(info, from, from));
        }
        if from >= entry.forgotten {
            return Ok(self.memory_chunk(&mut entry, from, info));
        }
        let mut cursor = match entry.marks.range(..=from).next_back() {
            Some((_, c)) => c.clone(),
            // Not placed: `read_new` starts in the segment holding the
            // record after `from` (found by its name), not at the start.
            None => LogCursor::at(from, 0, 0, 0),
        };
        drop(entry);
        let dir = self.stream_dir(path);
        let max = self.streams_config().max_read_bytes;
        let (mut joined, mut next) = (Joined::new(info.is_json(), 0), from);
        'read: loop {
            let records = log::read_new(&dir, &mut cursor)?;
            if records.is_empty() {
                break;
            }
            for r in records {
                if r.seq > info.tail.seq() {
                    break 'read;
                }
                if r.seq <= from || !has_data(&r) {
                    continue;
                }
                if !joined.add(r.event.payload(), max) {
                    break 'read;
                }
                next = r.seq;
            }
        }
        Ok(joined.chunk(info, from, next))
    }

    /// The data after `from` (at or after `entry.forgotten`: all of it in
    /// memory), at most `StreamsConfig::max_read_bytes` (at least one
    /// record).
    fn memory_chunk(&self, entry: &mut Entry, from: u64, info: Info) -> Chunk {
        if let Some(s) = entry.served.as_ref().filter(|s| s.from == from && s.tail == info.tail.seq()) {
            let (records, next, data) = (s.records, s.next, s.body.clone());
            let (start, next) = (info.offset_at(from), info.offset_at(next));
            return Chunk { up_to_date: next >= info.tail, info, start, next, records, data };
        }
        let max = self.streams_config().max_read_bytes;
        let first = entry.recent.partition_point(|(seq, _)| *seq <= from);
        let wanted = entry.recent.iter().skip(first).take_while(|(seq, _)| *seq <= info.tail.seq());
        // Sized once (the payloads and their commas), however many fit.
        let capacity = wanted.clone().map(|(_, p)| p.len() + 1).sum::<usize>().min(max.saturating_add(1));
        let (mut joined, mut next) = (Joined::new(info.is_json(), capacity), from);
        for (seq, payload) in wanted {
            if !joined.add(payload, max) {
                break;
            }
            next = *seq;
        }
        let chunk = joined.chunk(info, from, next);
        entry.served = Some(Served { from, tail: chunk.info.tail.seq(), records: chunk.records, next, body: chunk.data.clone() });
        chunk
    }

    /// A catch-up read as [`Streams::read`] answers it, when it can be
    /// answered at once from memory without waiting for a lock, with one
    /// system call (a watched process whose cached state of the stream
    /// matches the log, `Streams::fresh`; the data in memory; a plain
    /// stream, `State::is_plain`: no TTL to slide, no bound topic to
    /// import from); `None` otherwise: call [`Streams::read`]. For a
    /// server's event loop, which must not block.
    pub fn read_cached(&self, path: &str, start: Start) -> Option<Chunk> {
        if !self.watched {
            return None;
        }
        let cell = self.entries.try_lock().ok()?.get(path)?.clone();
        let mut guard = self.try_hold(&cell)?;
        let entry = &mut *guard;
        if !self.fresh(entry) || !entry.state.is_plain() || !entry.state.is_of(path) {
            return None;
        }
        let info = Self::info(entry);
        let from = match start {
            Start::Beginning => 0,
            Start::Now => info.tail.seq(),
            // Refused by `read`, which says why.
            Start::At(o) => info.accept(o).ok()?.seq(),
        };
        if from > info.tail.seq() || from < entry.forgotten {
            return None;
        }
        Some(self.memory_chunk(entry, from, info))
    }

    /// Directories whose changes may bring `path` new data: the stream's
    /// and its bound topic's. Live reads wait on them
    /// ([`Streams::watch`]).
    pub fn watch(&self, path: &str) -> StreamResult<StreamWatch> {
        let cell = self.entry(path);
        let entry = self.hold(&cell);
        let mut subs = vec![self.store.hub().subscribe(&entry.dir)];
        if let Some(t) = entry.state.topic.as_deref().and_then(|t| kn_journal::Topic::parse(t).ok()) {
            subs.push(self.store.hub().subscribe(&t.dir(&self.config().root)));
        }
        Ok(StreamWatch { subs, poll: self.config().poll_interval, _live: Live::new(&self.live) })
    }
}
