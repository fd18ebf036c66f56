//! What a sweep slice does besides topics and journals: the orphan blobs
//! of `.blobs/` past `Config::blob_grace` (`log::sweep_orphan_blobs`,
//! FORMAT.md, "Orphan blobs"), and the pass that a layer above the store
//! registers for its own files (Durable Streams: expired streams nobody
//! reads, kn-streams' `expiry.rs`). The store knows nothing of that layer:
//! it calls what was registered ([`Store::set_extra_sweep`]).

use std::time::Duration;

use crate::error::Result;
use crate::log;

use super::sweep::SweepReport;
use super::Store;

/// A pass registered by a layer above the store: given a budget (`None`:
/// a whole pass), it returns the bytes it reclaimed.
pub(crate) type ExtraSweep = Box<dyn Fn(Option<usize>) -> u64 + Send + Sync>;

/// How many `.blobs/` entries a slice looks at per unit of its budget.
const BLOBS_PER_BUDGET: usize = 16;

impl Store {
    /// Registers `pass`, run by every sweep slice of this store (and by a
    /// whole pass) after the topics. Only the first registration counts:
    /// returns false when one was made already.
    pub fn set_extra_sweep(&self, pass: Box<dyn Fn(Option<usize>) -> u64 + Send + Sync>) -> bool {
        self.extra_sweep.set(pass).is_ok()
    }

    /// The rest of a sweep slice of `budget` (`None`: a whole pass, `kn
    /// gc`, with `grace` overriding `blob_grace`): orphan blobs, then the
    /// registered pass. Counts the bytes reclaimed into `report`.
    pub(super) fn sweep_extra(&self, budget: Option<usize>, grace: Option<Duration>, report: &mut SweepReport) -> Result<()> {
        let limit = budget.map(|b| b.saturating_mul(BLOBS_PER_BUDGET));
        // A bounded pass lists `.blobs/` at most this often.
        let every = self.config.sweep_interval.saturating_mul(16);
        let blobs = log::sweep_orphan_blobs(&self.config.root, grace.unwrap_or(self.config.blob_grace), limit, every)?;
        report.bytes_reclaimed += blobs.bytes;
        if let Some(pass) = self.extra_sweep.get() {
            report.bytes_reclaimed += pass(budget);
        }
        Ok(())
    }
}
