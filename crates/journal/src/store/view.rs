//! A journal as a view (issue 39; FORMAT.md, "Journals: windows over
//! their sources", from format version 5): the journal's own records
//! merged, by checkpoint, with the events of its windows over their
//! sources.
//!
//! The numbering, from these inputs alone:
//!
//! 1. each of J's own records at its `s`;
//! 2. for each window W (source S, `from`, `base`, `until` or open) and
//!    each S event `s` with `from < s <= until` that W shows (its route's
//!    filter passes, it was not expired when stored): `s + base + k(s)`,
//!    `k(s)` being the number of J's records placed in W with `b < s`.
//!
//! A record placed in W at `b` (the primary source's last seq when it was
//! written, under that source's append lock) is numbered
//! `b + base + k(b + 1) + 1`: after every S event up to `b`, before
//! `b + 1`'s, which counts it. A window opening as primary takes
//! `base = L - from`, `L` the highest number J ever gave
//! ([`Span::last_number`] of every earlier window, J's last record, the
//! number `.removed` keeps for J), so its first event follows it.
//!
//! This module is the arithmetic and the merge, kept free of files so
//! that the property test (bench/journal/tests/view_properties.rs) can
//! hold it against today's copying code; the readers of step 2's files
//! build [`Span`]s from `store/windows.rs` and J's log.

/// One window as the numbering needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// The window shows S's events with seq above this.
    pub from: u64,
    /// The offset from S's numbers to J's.
    pub base: i64,
    /// On a closed window: the last S seq it shows, and S's last seq when
    /// it closed (`spent >= until`).
    pub closed: Option<(u64, u64)>,
    /// The `b` of every record placed in the window, ascending (records
    /// are placed in order, under S's lock, so J's log gives them sorted).
    pub placed: Vec<u64>,
}

impl Span {
    /// A window opening at S's seq `from` as the primary of a journal
    /// whose highest number given so far is `last_given`.
    pub fn opening(from: u64, last_given: u64) -> Span {
        Span { from, base: last_given as i64 - from as i64, closed: None, placed: Vec::new() }
    }

    /// True when S's event `s` is in the window's range.
    pub fn holds(&self, s: u64) -> bool {
        s > self.from && self.closed.is_none_or(|(until, _)| s <= until)
    }

    /// How many records were placed in the window with `b < s`.
    pub fn placed_before(&self, s: u64) -> u64 {
        self.placed.partition_point(|&b| b < s) as u64
    }

    /// J's checkpoint of S's event `s` (in the window's range).
    pub fn checkpoint(&self, s: u64) -> u64 {
        offset(s, self.base) + self.placed_before(s)
    }

    /// The checkpoint of a record placed now at `b` (S's last seq), after
    /// every record placed before it.
    pub fn placed_checkpoint(&self, b: u64) -> u64 {
        offset(b, self.base) + self.placed_before(b + 1) + 1
    }

    /// Records a placement at `b` (after [`Span::placed_checkpoint`]).
    pub fn place(&mut self, b: u64) {
        let at = self.placed.partition_point(|&x| x <= b);
        self.placed.insert(at, b);
    }

    /// The highest number the window can have given: on a closed window,
    /// every number up to S's last seq when it closed, with every record
    /// placed in it; on an open one, up to S's last seq `end` now.
    pub fn last_number(&self, end: u64) -> u64 {
        let upto = self.closed.map_or(end, |(_, spent)| spent);
        offset(upto, self.base) + self.placed.len() as u64
    }
}

fn offset(s: u64, base: i64) -> u64 {
    (s as i64).saturating_add(base).max(0) as u64
}

/// Where one event of a view comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// J's own record of this index in the list given to [`merge`].
    Own(usize),
    /// S's event `seq`, shown by window `window` of the list given.
    Source {
        /// The window's index.
        window: usize,
        /// S's seq.
        seq: u64,
    },
}

/// A view's events in the order of their checkpoints: `own` holds J's
/// records' seqs (ascending), `shown[i]` the S seqs window `spans[i]`
/// shows (ascending; those outside its range are left out here).
/// Checkpoints that two entries would share (an input no writer makes)
/// keep the first and drop the other, so that a view never repeats one.
pub fn merge(own: &[u64], spans: &[Span], shown: &[Vec<u64>]) -> Vec<(u64, Entry)> {
    let mut all: Vec<(u64, Entry)> = own.iter().enumerate().map(|(i, &s)| (s, Entry::Own(i))).collect();
    for (window, (span, seqs)) in spans.iter().zip(shown).enumerate() {
        all.extend(seqs.iter().filter(|&&s| span.holds(s)).map(|&seq| (span.checkpoint(seq), Entry::Source { window, seq })));
    }
    all.sort_by_key(|&(c, _)| c);
    all.dedup_by_key(|&mut (c, _)| c);
    all
}

/// What a resume after checkpoint `after` finds in a view (`entries` as
/// [`merge`] gives them): the index of the first entry after it, or
/// `None` when `after` is above the last number the view has given
/// (`last_given`), which no event of this journal ever had.
pub fn resume_at(entries: &[(u64, Entry)], after: u64, last_given: u64) -> Option<usize> {
    if after > last_given {
        return None;
    }
    Some(entries.partition_point(|&(c, _)| c <= after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(entries: &[(u64, Entry)]) -> Vec<u64> {
        entries.iter().map(|&(c, _)| c).collect()
    }

    #[test]
    fn a_window_opened_on_an_empty_journal_numbers_from_one() {
        let span = Span::opening(40, 0);
        let view = merge(&[], &[span], &[vec![41, 42, 43]]);
        assert_eq!(numbers(&view), [1, 2, 3]);
    }

    #[test]
    fn placed_records_sit_between_the_events_they_were_written_between() {
        let mut span = Span::opening(10, 0);
        // S gets 11; a direct post; two more at the same b; S gets 12.
        let mut own = Vec::new();
        for _ in 0..3 {
            let c = span.placed_checkpoint(11);
            own.push(c);
            span.place(11);
        }
        let view = merge(&own, std::slice::from_ref(&span), &[vec![11, 12]]);
        assert_eq!(numbers(&view), [1, 2, 3, 4, 5]);
        assert_eq!(view[0].1, Entry::Source { window: 0, seq: 11 });
        assert_eq!(view[1].1, Entry::Own(0));
        assert_eq!(view[4].1, Entry::Source { window: 0, seq: 12 });
    }

    #[test]
    fn a_window_after_a_closed_one_numbers_on_past_what_it_spent() {
        let mut first = Span::opening(0, 0);
        first.place(2);
        // Poisoned at S's 5: shows up to 4, but 5 may have been numbered.
        first.closed = Some((4, 5));
        let given = first.last_number(0);
        assert_eq!(given, 6);
        let second = Span::opening(100, given);
        let view = merge(&[3], &[first, second], &[vec![1, 2, 3, 4, 5], vec![101]]);
        assert_eq!(numbers(&view), [1, 2, 3, 4, 5, 7]);
    }

    #[test]
    fn a_filtered_event_leaves_a_hole_not_a_repeat() {
        let span = Span::opening(0, 0);
        let view = merge(&[], &[span], &[vec![1, 3]]);
        assert_eq!(numbers(&view), [1, 3]);
    }

    #[test]
    fn a_journal_made_again_numbers_on_from_removed() {
        let span = Span::opening(7, 12);
        assert_eq!(numbers(&merge(&[], &[span], &[vec![8]])), [13]);
    }

    #[test]
    fn resume_finds_the_next_event_and_refuses_numbers_never_given() {
        let span = Span::opening(0, 0);
        let view = merge(&[], std::slice::from_ref(&span), &[vec![1, 2, 4]]);
        let given = span.last_number(5);
        assert_eq!(resume_at(&view, 0, given), Some(0));
        assert_eq!(resume_at(&view, 2, given), Some(2));
        assert_eq!(resume_at(&view, 3, given), Some(2));
        assert_eq!(resume_at(&view, 5, given), Some(3));
        assert_eq!(resume_at(&view, 6, given), None);
    }
}
