//! Files and directories the store creates are group-writable and never
//! world-writable (files `0664`, directories `2775`), whatever the umask.
//!
//! One test in its own binary: the umask is per process, so nothing else
//! may run beside it.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use kn_journal::{Event, Selection, Store, Topic};

fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, fs::Metadata)>) {
    for entry in fs::read_dir(dir).expect("read_dir").flatten() {
        let meta = fs::symlink_metadata(entry.path()).expect("stat");
        if meta.is_dir() {
            walk(&entry.path(), out);
        }
        out.push((entry.path(), meta));
    }
}

#[test]
fn store_files_are_group_writable_never_world_writable_whatever_the_umask() {
    for umask in [0o000, 0o077, 0o022] {
        // SAFETY: umask only sets the process's file mode creation mask.
        let old = unsafe { libc::umask(umask) };
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("kn_events");
        let store = Store::open(&root).expect("store");
        let chat = Topic::parse("/what/chat").unwrap();
        let journal = Topic::parse("/who/me/kn_journal").unwrap();
        let mut e = Event::new();
        e.set("kn_payload", "hello");
        store.notify(&chat, e.clone()).expect("notify");
        store.route(&chat, journal.as_str().as_bytes(), Event::new()).expect("route");
        drop(store.tunnel(&journal, &Selection::all()).expect("a tunnel creates the journal and its heartbeat"));
        store.heartbeat(&journal).expect("heartbeat");
        store.notify(&chat, e).expect("routed notify");
        store.add_server_name("http://example.test/kn").expect(".names");
        store.events(&journal, &Selection::all()).expect("read");
        // SAFETY: as above.
        unsafe { libc::umask(old) };

        let mut entries = vec![(root.clone(), fs::metadata(&root).unwrap())];
        walk(&root, &mut entries);
        assert!(entries.len() >= 12, "only {} entries", entries.len());
        let names: Vec<String> = entries.iter().filter_map(|(p, _)| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        assert!(names.iter().any(|n| n == ".names"), "{names:?}");
        assert!(names.iter().any(|n| n == ".heartbeat"), "{names:?}");
        for (path, meta) in entries {
            let mode = meta.mode() & 0o7777;
            assert_eq!(mode & 0o002, 0, "{} is world-writable ({mode:o}, umask {umask:03o})", path.display());
            assert_ne!(mode & 0o020, 0, "{} is not group-writable ({mode:o}, umask {umask:03o})", path.display());
            let want = if meta.is_dir() { 0o2775 } else { 0o664 };
            assert_eq!(mode, want, "{} (umask {umask:03o})", path.display());
        }
    }
}
