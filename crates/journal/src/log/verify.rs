//! Checking every record of a topic directory.

use std::path::{Path, PathBuf};

use crate::error::Result;

use super::blob::verify_links;
use super::segment::{Stop, list_segments, scan_segment, segment_name};

/// Checks every record of a topic directory: the number of valid records
/// and, for each segment with a bad frame, where and why; then the blobs
/// the records refer to (missing, wrong length or hash) and blob links no
/// record refers to.
pub(crate) fn verify_dir(dir: &Path) -> Result<(usize, Vec<(PathBuf, u64, Stop)>)> {
    let mut good = 0;
    let mut bad = Vec::new();
    let mut records = Vec::new();
    for first in list_segments(dir)? {
        let path = dir.join(segment_name(first));
        let Some(scan) = scan_segment(&path, 0)? else { continue };
        good += scan.records.len();
        if let Some(stop) = scan.stop {
            bad.push((path.clone(), scan.end, stop));
        }
        records.extend(scan.records.into_iter().map(|(offset, r)| (path.clone(), offset, r)));
    }
    for (path, offset, why) in verify_links(dir, &records)? {
        bad.push((path, offset, Stop::Corrupt(why)));
    }
    Ok((good, bad))
}
