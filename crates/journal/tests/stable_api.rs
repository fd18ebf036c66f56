//! The crate root exports what its front page lists under "What is
//! stable", and nothing else: a new root export is either listed there
//! (and in CHANGELOG.md) or goes into the hidden `internal` module.

use std::path::Path;

fn lib_rs() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).expect("src/lib.rs")
}

/// The names the root re-exports (`pub use` lines before `mod internal`).
fn root_exports(lib: &str) -> Vec<String> {
    let code: String = lib.lines().filter(|l| !l.starts_with("//")).collect::<Vec<_>>().join("\n");
    let root = &code[..code.find("pub mod internal").expect("the internal module")];
    let mut names = Vec::new();
    for statement in root.split(';') {
        let Some(at) = statement.find("pub use ") else { continue };
        let path = &statement[at + "pub use ".len()..];
        let items = match (path.find('{'), path.rfind('}')) {
            (Some(open), Some(close)) => path[open + 1..close].split(',').map(str::to_string).collect(),
            _ => vec![path.rsplit("::").next().unwrap_or(path).to_string()],
        };
        for item in items {
            let item = item.trim();
            let name = item.rsplit(" as ").next().unwrap_or(item).trim();
            if !name.is_empty() && name != "*" {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// The "What is stable" section of the front page.
fn stable_section(lib: &str) -> String {
    let start = lib.find("//! # What is stable").expect("a 'What is stable' section");
    let rest = &lib[start + 5..];
    rest[..rest.find("//! # ").expect("a section after it")].to_string()
}

#[test]
fn every_root_export_is_listed_as_stable() {
    let lib = lib_rs();
    let exports = root_exports(&lib);
    assert!(exports.len() > 30 && exports.iter().any(|n| n == "Store"), "{exports:?}");
    let stable = stable_section(&lib);
    let unlisted: Vec<&String> = exports.iter().filter(|name| !stable.contains(&format!("[`{name}`]"))).collect();
    assert!(unlisted.is_empty(), "exported at the root but not listed under 'What is stable': {unlisted:?}");
    for hidden in ["encode_record", "decode_record", "magic_of", "GLUSTER_MOUNT_OPTIONS", "now"] {
        assert!(!exports.iter().any(|n| n == hidden), "{hidden} is at the root");
    }
}

#[test]
fn the_export_reader_reads_groups_renames_and_single_items() {
    let lib = "pub use a::{B, c as D,\n    E};\n#[cfg(x)]\npub use f::G;\npub mod internal {\npub use h::I;\n}";
    assert_eq!(root_exports(lib), ["B", "D", "E", "G"]);
}
