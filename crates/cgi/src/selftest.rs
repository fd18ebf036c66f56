//! `do_method=test`: checks that this installation can do its job: that
//! a post to the store is stored and read back, that the disk has room
//! above the reserve, that the server's names are usable URLs, and that
//! the store's directories and files carry the modes a sensor of the
//! store's group needs (docs/DEPLOY.md: directories `2775`, files `0664`,
//! all in the store's group), and on a network file system the mode
//! chosen and the mount and volume settings shared mode needs
//! (docs/DEPLOY.md, "Several web servers on one store").

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kn_journal::Store;

/// Most directory entries the permission checks look at: a self-test
/// answers in bounded time however large the store.
pub const MAX_CHECKED_ENTRIES: usize = 100_000;

/// Runs every self-check: its name and `Err(why)` when it failed.
pub fn run(store: &Store, reached_by: &[&str]) -> Vec<(std::borrow::Cow<'static, str>, Result<(), String>)> {
    let tree = Tree::walk(store.root());
    let checks: Vec<(&'static str, Result<(), String>)> = vec![
        ("Event store stores and reads back a post", store.probe().map_err(|e| e.to_string())),
        ("Free space above the reserve", free_space(store)),
        ("Server names", server_names(store, reached_by)),
        ("Store directories are group-writable (2775)", tree.as_ref().map_err(Clone::clone).and_then(Tree::directories)),
        ("Store files are group-writable (0664)", tree.as_ref().map_err(Clone::clone).and_then(Tree::files)),
    ];
    let mut all: Vec<_> = checks.into_iter().map(|(name, result)| (name.into(), result)).collect();
    all.push((format!("File system: {}", store.describe_mode()).into(), shared_settings(store)));
    all
}

/// The settings of a shared store's mount and volume that can be checked:
/// a failure names each wrong one; settings that cannot be verified do
/// not fail the test.
fn shared_settings(store: &Store) -> Result<(), String> {
    let wrong: Vec<String> = store
        .mount_checks()
        .into_iter()
        .filter(|c| c.ok == Some(false))
        .map(|c| format!("{} is {} (needs {})", c.setting, c.found, c.required))
        .collect();
    if wrong.is_empty() {
        return Ok(());
    }
    Err(format!("{}: see docs/DEPLOY.md, \"Several web servers on one store\"", wrong.join("; ")))
}

fn free_space(store: &Store) -> Result<(), String> {
    let free = fs4::available_space(store.root()).map_err(|e| format!("cannot query free space: {e}"))?;
    let reserve = store.config().reserve_bytes;
    if free < reserve {
        return Err(format!("{free} bytes free, below the reserve of {reserve} bytes: posts will fail with 507"));
    }
    Ok(())
}

/// The names the store resolves absolute URLs with: the configured
/// `KN_SERVER_URL` and the `.names` list must be absolute `http(s)` URLs,
/// else routes to this server's own URLs would be taken for remote ones.
/// The URLs this request reached the server by must name it too: else
/// clients that write them into `kn_to`, `kn_status_to` or a route would
/// be sent to "another server".
fn server_names(store: &Store, reached_by: &[&str]) -> Result<(), String> {
    if let Some(url) = &store.config().server_url {
        usable_url(url).map_err(|why| format!("the configured server URL (KN_SERVER_URL) '{url}' {why}"))?;
    }
    for name in store.server_names() {
        usable_url(&name).map_err(|why| format!("the server name '{name}' ({}/.names) {why}", store.root().display()))?;
    }
    for url in reached_by {
        if !matches!(store.resolve(format!("{url}/what/kn_selftest").as_bytes()), Ok(kn_journal::internal::Destination::Local(_))) {
            return Err(format!(
                "this request reached the server by '{url}', which the store does not take for one of its names ({}): absolute URLs by it would be remote; add it with `kn names add {url}` (KN_MAX_NAMES is {})",
                store.server_names().join(", "),
                store.config().max_names
            ));
        }
    }
    Ok(())
}

fn usable_url(url: &str) -> Result<(), &'static str> {
    let Some(rest) = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://")) else {
        return Err("is not an absolute http:// or https:// URL");
    };
    if rest.is_empty() || rest.starts_with('/') {
        return Err("has no host");
    }
    if url.bytes().any(|b| b.is_ascii_control() || b == b' ' || b == b'"' || b == b'\'' || b == b'<' || b == b'>') {
        return Err("contains a space, a quote or a control character");
    }
    if url.ends_with('/') || url.contains(['?', '#']) {
        return Err("must end with the script's path, without a final '/', query or fragment");
    }
    Ok(())
}

/// The store's directories and files with their modes and groups (links
/// are not followed; the self-test's own probe directories are skipped).
struct Tree {
    group: u32,
    dirs: Vec<(PathBuf, fs::Metadata)>,
    files: Vec<(PathBuf, fs::Metadata)>,
}

impl Tree {
    fn walk(root: &Path) -> Result<Tree, String> {
        let meta = fs::symlink_metadata(root).map_err(|e| format!("cannot read '{}': {e}", root.display()))?;
        let mut tree = Tree { group: meta.gid(), dirs: vec![(root.to_path_buf(), meta)], files: Vec::new() };
        let mut next = 0;
        while next < tree.dirs.len() && tree.dirs.len() + tree.files.len() < MAX_CHECKED_ENTRIES {
            let dir = tree.dirs[next].0.clone();
            next += 1;
            let entries = fs::read_dir(&dir).map_err(|e| format!("cannot list '{}': {e}", dir.display()))?;
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(kn_journal::internal::PROBE_PREFIX) {
                    continue;
                }
                let Ok(meta) = fs::symlink_metadata(entry.path()) else { continue };
                if meta.is_dir() {
                    tree.dirs.push((entry.path(), meta));
                } else if meta.is_file() {
                    tree.files.push((entry.path(), meta));
                }
            }
        }
        Ok(tree)
    }

    /// Every directory setgid and group-writable (`2775`), in the store's
    /// group, never world-writable: a sensor of the group creates topics.
    fn directories(&self) -> Result<(), String> {
        self.check(&self.dirs, 0o2070, "directories", "2775")
    }

    /// Every file group-readable and -writable (`0664`), in the store's
    /// group, never world-writable: a sensor of the group appends to it.
    fn files(&self) -> Result<(), String> {
        self.check(&self.files, 0o060, "files", "0664")
    }

    fn check(&self, entries: &[(PathBuf, fs::Metadata)], needed: u32, what: &str, mode: &str) -> Result<(), String> {
        let bad: Vec<String> = entries
            .iter()
            .filter_map(|(path, meta)| {
                let m = meta.mode() & 0o7777;
                let why = if m & needed != needed {
                    format!("mode {m:04o}")
                } else if m & 0o002 != 0 {
                    format!("mode {m:04o}, world-writable")
                } else if meta.gid() != self.group {
                    format!("group {} instead of the store's {}", meta.gid(), self.group)
                } else {
                    return None;
                };
                Some(format!("'{}' ({why})", path.display()))
            })
            .collect();
        if bad.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = bad.iter().take(3).map(String::as_str).collect();
        let more = if bad.len() > 3 { format!(" and {} more", bad.len() - 3) } else { String::new() };
        Err(format!(
            "{} of the store's {what} cannot be written by every member of its group (docs/DEPLOY.md: {mode}, in the store's group): {}{more}",
            bad.len(),
            shown.join(", ")
        ))
    }
}
