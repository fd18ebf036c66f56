//! A journal as a view (issue 39, docs/design/one-copy.md step 2) against
//! today's copying code as the oracle: for any interleaving of posts to
//! two sources, direct posts to the journal, and routes made and deleted,
//! the view's numbering (`store/view.rs`), fed what the design's writers
//! would have written (windows opened and closed, records placed under
//! the primary source's lock), gives exactly the events today's store
//! holds in the journal, in the same order, at the same checkpoints; and
//! a resume after each checkpoint finds what today's resume finds.

use kn_journal::internal::view::{merge, resume_at, Entry, Span};
use kn_journal::{Config, Event, Resume, Selection, Store, Topic};
use proptest::prelude::*;

const SOURCES: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    /// An event posted to source i.
    Post(usize),
    /// An event posted to the journal itself (a status event, a client's
    /// notify).
    Direct,
    /// A route from source i into the journal (a no-op if it has one).
    Route(usize),
    /// That route deleted (a no-op if it has none).
    Unroute(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..SOURCES).prop_map(Op::Post),
        2 => Just(Op::Direct),
        2 => (0..SOURCES).prop_map(Op::Route),
        1 => (0..SOURCES).prop_map(Op::Unroute),
    ]
}

/// What the design's writers would have written, step by step: windows
/// (one primary at a time), J's own records (direct posts and a secondary
/// route's events, placed in the primary), S's events.
#[derive(Default)]
struct Model {
    /// S's events' payloads; S's seq n is index n - 1.
    source: [Vec<String>; SOURCES],
    /// Windows, each with its source.
    spans: Vec<(usize, Span)>,
    primary: Option<usize>,
    /// A route with no window (the journal had a primary when it was made).
    secondary: [bool; SOURCES],
    routed: [bool; SOURCES],
    /// When each secondary last had a record placed (op number): the most
    /// recent is promoted.
    placed_at: [usize; SOURCES],
    /// J's own records: seq and payload, ascending.
    own: Vec<(u64, String)>,
}

impl Model {
    fn end(&self, i: usize) -> u64 {
        self.source[i].len() as u64
    }

    /// The highest number the journal ever gave while it has no primary.
    fn last_given(&self) -> u64 {
        let own = self.own.last().map_or(0, |&(s, _)| s);
        self.spans.iter().map(|(i, span)| span.last_number(self.end(*i))).fold(own, u64::max)
    }

    fn open_primary(&mut self, i: usize) {
        let span = Span::opening(self.end(i), self.last_given());
        self.spans.push((i, span));
        self.primary = Some(self.spans.len() - 1);
    }

    /// A record of J: placed in the primary under its source's lock, or a
    /// plain append above every number given.
    fn record(&mut self, payload: String) {
        let seq = match self.primary {
            Some(p) => {
                let (src, _) = self.spans[p];
                let b = self.end(src);
                let span = &mut self.spans[p].1;
                let seq = span.placed_checkpoint(b);
                span.place(b);
                seq
            }
            None => self.last_given() + 1,
        };
        self.own.push((seq, payload));
    }

    fn apply(&mut self, n: usize, op: &Op, payload: &str) {
        match *op {
            Op::Post(i) => {
                self.source[i].push(payload.to_string());
                if self.secondary[i] {
                    self.placed_at[i] = n;
                    self.record(payload.to_string());
                }
            }
            Op::Direct => self.record(payload.to_string()),
            Op::Route(i) if !self.routed[i] => {
                self.routed[i] = true;
                if self.primary.is_none() {
                    self.open_primary(i);
                } else {
                    self.secondary[i] = true;
                }
            }
            Op::Unroute(i) if self.routed[i] => {
                self.routed[i] = false;
                if self.secondary[i] {
                    self.secondary[i] = false;
                    return;
                }
                let p = self.primary.take().expect("a routed source without a window is secondary");
                let end = self.end(i);
                self.spans[p].1.closed = Some((end, end));
                let promoted = (0..SOURCES).filter(|&k| self.secondary[k]).max_by_key(|&k| self.placed_at[k]);
                if let Some(k) = promoted {
                    self.secondary[k] = false;
                    self.open_primary(k);
                }
            }
            Op::Route(_) | Op::Unroute(_) => {}
        }
    }

    /// The journal as the view shows it: (checkpoint, payload).
    fn view(&self) -> (Vec<(u64, String)>, u64) {
        let own: Vec<u64> = self.own.iter().map(|&(s, _)| s).collect();
        let spans: Vec<Span> = self.spans.iter().map(|(_, s)| s.clone()).collect();
        let shown: Vec<Vec<u64>> = self.spans.iter().map(|&(i, _)| (1..=self.end(i)).collect()).collect();
        let entries = merge(&own, &spans, &shown);
        let given = self.spans.iter().map(|(i, span)| span.last_number(self.end(*i))).fold(own.last().copied().unwrap_or(0), u64::max);
        let events = entries
            .iter()
            .map(|&(c, e)| match e {
                Entry::Own(k) => (c, self.own[k].1.clone()),
                Entry::Source { window, seq } => (c, self.source[self.spans[window].0][seq as usize - 1].clone()),
            })
            .collect();
        (events, given)
    }
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

fn event(id: &str) -> Event {
    Event::from_pairs([(b"kn_id".to_vec(), id.as_bytes().to_vec()), (b"kn_payload".to_vec(), id.as_bytes().to_vec())])
}

fn checkpoint_and_payload(e: &Event) -> (u64, String) {
    let c = std::str::from_utf8(e.checkpoint().expect("a journal event has a checkpoint")).unwrap().parse().unwrap();
    (c, String::from_utf8_lossy(e.payload()).into_owned())
}

/// Runs `ops` on today's store and on the model; both journals, and the
/// resumes after each checkpoint.
fn run(ops: &[Op]) -> Result<(), TestCaseError> {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let mut config = Config::new(dir.path());
    config.reserve_bytes = 0;
    config.server_url = Some("http://test.example/kn".to_string());
    let store = Store::open_with(config).unwrap();
    let journal = topic("/page/kn_journal");
    let sources: Vec<Topic> = (0..SOURCES).map(|i| topic(&format!("/room{i}"))).collect();
    // An open tunnel's heartbeat: routes into a stale journal are poisoned.
    drop(store.tunnel(&journal, &Selection::none()).unwrap());

    let mut model = Model::default();
    let mut routes: [Option<String>; SOURCES] = Default::default();
    for (n, op) in ops.iter().enumerate() {
        let payload = format!("e{n}");
        match *op {
            Op::Post(i) => {
                store.notify(&sources[i], event(&payload)).unwrap();
            }
            Op::Direct => {
                store.notify(&journal, event(&payload)).unwrap();
            }
            Op::Route(i) if routes[i].is_none() => {
                let id = format!("r{i}-{n}");
                let r = store.route(&sources[i], journal.as_str().as_bytes(), Event::from_pairs([(b"kn_id".to_vec(), id.as_bytes().to_vec())])).unwrap();
                prop_assert!(!r.ignored);
                routes[i] = Some(id);
            }
            Op::Unroute(i) => {
                if let Some(id) = routes[i].take() {
                    store.delete_route(&sources[i], id.as_bytes(), None).unwrap();
                }
            }
            Op::Route(_) => {}
        }
        model.apply(n, op, &payload);
    }

    let today: Vec<(u64, String)> = store.events(&journal, &Selection::all()).unwrap().events.iter().map(checkpoint_and_payload).collect();
    let (view, given) = model.view();
    prop_assert!(view.windows(2).all(|w| w[0].0 < w[1].0), "view numbers strictly increase: {:?}", view);
    prop_assert_eq!(&view, &today, "the view against today's copies, ops {:?}", ops);

    // Resume after each checkpoint given, and after numbers never given.
    let entries: Vec<(u64, Entry)> = view.iter().enumerate().map(|(k, &(c, _))| (c, Entry::Own(k))).collect();
    for after in 0..=given + 1 {
        let selection = Selection { since_checkpoint: Some(after.to_string().into_bytes()), ..Selection::none() };
        let selected = store.events(&journal, &selection).unwrap();
        let got: Vec<(u64, String)> = selected.events.iter().map(checkpoint_and_payload).collect();
        match resume_at(&entries, after, given) {
            Some(k) => {
                prop_assert_eq!(&view[k..], &got[..], "resume after {}", after);
                if after > 0 {
                    prop_assert_eq!(selected.resume, Resume::Exact, "resume after {}", after);
                }
            }
            None => prop_assert_eq!(selected.resume, Resume::Unknown, "after {} was never given", after),
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn a_journal_view_numbers_as_todays_copies_do(ops in prop::collection::vec(op(), 0..40)) {
        run(&ops)?;
    }
}

#[test]
fn a_page_with_a_room_and_a_status_topic_numbers_as_today() {
    use Op::*;
    let ops = [Post(0), Route(0), Post(0), Direct, Route(1), Post(1), Post(0), Direct, Direct, Post(1), Unroute(0), Post(0), Post(1), Direct, Route(0), Post(0), Unroute(1), Post(1), Post(0), Direct];
    run(&ops).unwrap();
}
