//! kn-journal: the knpubsub event store and every PubSub rule.
#![deny(missing_docs)]

mod error;
mod event;
mod topic;

pub use error::{Error, ErrorKind, Result};
pub use event::*;
pub use topic::{Topic, JOURNAL_SEGMENT, ROUTES_SEGMENT, SUBTOPICS_SEGMENT};
