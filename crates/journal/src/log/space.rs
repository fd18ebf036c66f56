//! The free-space check of every append (the reserve, `KN_RESERVE_BYTES`),
//! shared by the writer and the blob store: the lowest floor of `log/`.

use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

/// Free space as last queried, so that the free-space check of every
/// append does not need a `statvfs` each time: it is queried again after
/// 100 ms, or as soon as the bytes written since approach half of the
/// headroom above the reserve.
#[derive(Default)]
pub struct SpaceGauge {
    pub(super) state: std::sync::Mutex<Option<(std::time::Instant, u64, u64)>>,
}

impl SpaceGauge {
    /// Fails with [`ErrorKind::DiskFull`] unless `needed` bytes fit above
    /// the reserve on the file system of `dir`.
    pub(crate) fn check(&self, dir: &Path, reserve: u64, needed: u64) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = match *state {
            Some((at, free, written)) => {
                let headroom = free.saturating_sub(reserve);
                at.elapsed() < std::time::Duration::from_millis(100) && (written + needed) * 2 < headroom
            }
            None => false,
        };
        if fresh {
            if let Some((_, _, written)) = state.as_mut() {
                *written += needed;
            }
            return Ok(());
        }
        let free = fs4::available_space(dir).map_err(|e| Error::io("cannot query free space of", dir, e))?;
        if free < reserve.saturating_add(needed) {
            *state = None;
            return Err(Error::new(
                ErrorKind::DiskFull,
                format!(
                    "disk full: {free} bytes free on the file system of '{}', below the reserve of {reserve} bytes",
                    dir.display()
                ),
            ));
        }
        *state = Some((std::time::Instant::now(), free, needed));
        Ok(())
    }
}
