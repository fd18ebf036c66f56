//! `kn receipts TOPIC KN_ID`: one line per journal routed from the topic
//! (docs/PRESENCE.md, "Receipts"): the journal, then whether it holds the
//! event (and at which checkpoint), has sent it to a live client, and
//! whose client confirmed it; then the route's id and creator.
//!
//! ```
//! use kn_journal::{Event, Selection, Store, Topic};
//! use kn_sensors::admin::receipts;
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path()).unwrap();
//! let news = Topic::parse("/what/news").unwrap();
//! let anna = Topic::parse("/who/anna/kn_journal").unwrap();
//! drop(store.tunnel(&anna, &Selection::none()).unwrap()); // a live journal
//! store.route(&news, anna.as_str().as_bytes(), Event::from_pairs([("kn_id", "r1")])).unwrap();
//! store.notify(&news, Event::from_pairs([("kn_id", "e1"), ("kn_payload", "hi")])).unwrap();
//! let lines = receipts::lines(&store, &news, b"e1").unwrap();
//! assert_eq!(lines, vec!["/who/anna/kn_journal\tholds=1\tsent=no\tconfirmed=no\troute=r1"]);
//! ```

use kn_journal::{Store, Topic};

use crate::{SensorError, SensorErrorKind};

/// The lines `kn receipts` prints; an error (69) when the topic has no
/// current event with kn_id `id`.
pub fn lines(store: &Store, topic: &Topic, id: &[u8]) -> Result<Vec<String>, SensorError> {
    let receipts = store.receipts(topic, id).map_err(|e| SensorError::from_journal(e, &format!("cannot read the receipts of '{topic}'")))?;
    let Some(receipts) = receipts else {
        let id = String::from_utf8_lossy(id);
        return Err(SensorError::new(SensorErrorKind::Unavailable, format!("'{topic}' has no current event with kn_id '{id}'")));
    };
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let not_read = (receipts.not_read > 0).then(|| {
        format!("# {} more journals not read: at most {} (KN_RECEIPTS_MAX_JOURNALS)", receipts.not_read, receipts.journals.len())
    });
    Ok(receipts
        .journals
        .iter()
        .map(|r| {
            let holds = r.holds.map_or_else(|| "no".to_string(), |at| at.to_string());
            let mut line = format!("{}\tholds={holds}\tsent={}\tconfirmed={}\troute={}", r.journal, yes_no(r.sent), yes_no(r.confirmed), String::from_utf8_lossy(r.route.id()));
            if let Some(creator) = kn_journal::access::Principal::creator_of(&r.route.event).name() {
                line.push_str(&format!("\tcreator={creator}"));
            }
            line
        })
        .chain(not_read)
        .collect())
}
