//! The Debian copyright file (machine-readable format 1.0) of the package:
//! a header written by hand (packaging/deb/copyright: the project's own
//! files and licence), then one paragraph per crate linked into the
//! installed programs, with the licence its Cargo.toml declares, then
//! the text of every licence named.
//!
//! Which crates: `cargo metadata --locked` (the resolution of Cargo.lock)
//! for this machine's target, walked from the packages whose programs are
//! installed (kn-cgi: pubsub-cgi; kn-sensors: kn and the sensors) along
//! normal dependencies only (build scripts' and tests' dependencies are
//! not linked). Licence expressions are parsed, and their texts taken,
//! with the `spdx` crate (the SPDX licence list); a licence Debian ships
//! in /usr/share/common-licenses is referred to there instead of quoted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use spdx::expression::{ExprNode, Operator};

/// The packages whose binaries the Debian package installs.
pub const ROOTS: &[&str] = &["kn-cgi", "kn-sensors"];

/// Licences whose full text Debian keeps in /usr/share/common-licenses.
const COMMON: &[&str] = &[
    "Apache-2.0", "Artistic-1.0", "BSD-3-Clause-Regents", "CC0-1.0", "GFDL-1.2", "GFDL-1.3", "GPL-1.0", "GPL-2.0",
    "GPL-3.0", "LGPL-2.0", "LGPL-2.1", "LGPL-3.0", "MPL-1.1", "MPL-2.0",
];

/// One linked crate.
#[derive(Debug)]
pub struct Linked {
    pub name: String,
    pub version: String,
    pub authors: Vec<String>,
    /// Its licence in the copyright format's syntax (`MIT or Apache-2.0`).
    pub license: String,
}

/// The copyright file: `header`, then the crates and the licence texts.
pub fn render(header: &Path) -> Result<String, String> {
    let header = std::fs::read_to_string(header).map_err(|e| format!("cannot read {}: {e}", header.display()))?;
    let metadata = metadata()?;
    let (crates, licenses) = linked(&metadata)?;
    let mut out = header.trim_end().to_string();
    out.push_str("\n\n");
    for c in &crates {
        let copyright = if c.authors.is_empty() { format!("the {} developers", c.name) } else { c.authors.join(", ") };
        out.push_str(&format!(
            "Files: cargo-registry/{name}-{version}/*\nCopyright: {copyright}\nLicense: {license}\n\
             Comment: the Rust crate {name} {version} (Cargo.lock), linked statically into the programs.\n\n",
            name = c.name,
            version = c.version,
            copyright = field(&copyright),
            license = c.license,
        ));
    }
    let declared: BTreeSet<String> = header.lines().filter_map(|l| l.strip_prefix("License: ")).map(|l| l.trim().to_string()).collect();
    for (name, text) in &licenses {
        if declared.contains(name) {
            continue;
        }
        out.push_str(&format!("License: {name}\n{}\n\n", text_field(text)));
    }
    Ok(out.trim_end().to_string() + "\n")
}

/// `cargo metadata` of the workspace for this machine's target.
fn metadata() -> Result<Value, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let host = Command::new("rustc").arg("-vV").output().map_err(|e| format!("cannot run rustc -vV: {e}"))?;
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or("rustc -vV names no host")?;
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--filter-platform", &host, "--manifest-path"])
        .arg(&manifest)
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("cargo metadata's output: {e}"))
}

/// The crates linked into [`ROOTS`]' programs, sorted by name and
/// version, and the text of each licence they name.
pub fn linked(metadata: &Value) -> Result<(Vec<Linked>, BTreeMap<String, String>), String> {
    let packages: BTreeMap<&str, &Value> =
        metadata["packages"].as_array().ok_or("no packages")?.iter().filter_map(|p| Some((p["id"].as_str()?, p))).collect();
    let nodes: BTreeMap<&str, &Value> =
        metadata["resolve"]["nodes"].as_array().ok_or("no resolve")?.iter().filter_map(|n| Some((n["id"].as_str()?, n))).collect();
    let mut todo: Vec<&str> =
        packages.iter().filter(|(_, p)| ROOTS.contains(&p["name"].as_str().unwrap_or(""))).map(|(id, _)| *id).collect();
    if todo.len() != ROOTS.len() {
        return Err(format!("cargo metadata does not list all of {ROOTS:?}"));
    }
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        let Some(node) = nodes.get(id) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            // Linked: a normal dependency (kind null) on this target.
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            if let (true, Some(pkg)) = (normal, dep["pkg"].as_str()) {
                todo.push(pkg);
            }
        }
    }
    let mut crates = Vec::new();
    let mut licenses = BTreeMap::new();
    for id in seen {
        let p = packages[id];
        // The workspace's own crates are the header's `Files: *`.
        if p["source"].is_null() {
            continue;
        }
        let name = p["name"].as_str().unwrap_or("").to_string();
        let version = p["version"].as_str().unwrap_or("").to_string();
        let license = match (p["license"].as_str(), p["license_file"].as_str()) {
            (Some(expr), _) => dep5(expr, &mut licenses).map_err(|e| format!("{name} {version}: {e}"))?,
            (None, Some(file)) => {
                let dir = Path::new(p["manifest_path"].as_str().unwrap_or("")).parent().unwrap_or(Path::new("."));
                let text = std::fs::read_to_string(dir.join(file)).map_err(|e| format!("{name}'s {file}: {e}"))?;
                let short = format!("{name}-license");
                licenses.insert(short.clone(), text);
                short
            }
            (None, None) => return Err(format!("{name} {version} declares no licence")),
        };
        let authors = p["authors"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(str::to_string)).collect();
        crates.push(Linked { name, version, authors, license });
    }
    crates.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok((crates, licenses))
}

/// An SPDX expression in the copyright format's syntax (`and`, `or`,
/// `with X exception`), each licence's text added to `texts`.
pub fn dep5(expr: &str, texts: &mut BTreeMap<String, String>) -> Result<String, String> {
    let parsed = spdx::Expression::parse_mode(expr, spdx::ParseMode::LAX).map_err(|e| format!("licence '{expr}': {e}"))?;
    // The expression is in postfix order: (text, operator at its top).
    let mut stack: Vec<(String, Option<Operator>)> = Vec::new();
    for node in parsed.iter() {
        match node {
            ExprNode::Req(req) => {
                let (short, text) = license_text(&req.req)?;
                texts.entry(short.clone()).or_insert(text);
                stack.push((short, None));
            }
            ExprNode::Op(op) => {
                let (Some(right), Some(left)) = (stack.pop(), stack.pop()) else {
                    return Err(format!("licence '{expr}': malformed"));
                };
                let word = if *op == Operator::And { "and" } else { "or" };
                let wrap = |(text, top): (String, Option<Operator>)| match top {
                    Some(inner) if inner != *op => format!("({text})"),
                    _ => text,
                };
                stack.push((format!("{} {word} {}", wrap(left), wrap(right)), Some(*op)));
            }
        }
    }
    match (stack.pop(), stack.is_empty()) {
        (Some((text, _)), true) => Ok(text),
        _ => Err(format!("licence '{expr}': malformed")),
    }
}

/// A licence's short name and its standalone paragraph's text.
fn license_text(req: &spdx::LicenseReq) -> Result<(String, String), String> {
    let Some(id) = req.license.id() else {
        return Err(format!("'{}' is not on the SPDX licence list", req.license));
    };
    let mut short = req.license.to_string();
    let mut text = if COMMON.contains(&id.name) {
        format!("On Debian systems, the complete text of the {} licence is in\n/usr/share/common-licenses/{}.", id.full_name, id.name)
    } else {
        id.text().to_string()
    };
    if let Some(addition) = &req.addition {
        let exception = addition.id().ok_or_else(|| format!("'{addition}' is not on the SPDX exception list"))?;
        short = format!("{short} with {} exception", exception.name);
        text = format!("{text}\n\n{}", exception.text());
    }
    Ok((short, text))
}

/// A one-line field value (authors may write anything).
fn field(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A multi-line field's text: each line indented by one space, blank
/// lines written " .".
fn text_field(text: &str) -> String {
    text.trim()
        .lines()
        .map(|l| l.trim_end())
        .map(|l| if l.is_empty() { " .".to_string() } else { format!(" {l}") })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_take_the_copyright_formats_words() {
        let mut texts = BTreeMap::new();
        assert_eq!(dep5("MIT OR Apache-2.0", &mut texts).unwrap(), "MIT or Apache-2.0");
        assert_eq!(dep5("MIT/Apache-2.0", &mut texts).unwrap(), "MIT or Apache-2.0");
        assert_eq!(dep5("(MIT OR Apache-2.0) AND Unicode-3.0", &mut texts).unwrap(), "(MIT or Apache-2.0) and Unicode-3.0");
        assert_eq!(
            dep5("Apache-2.0 WITH LLVM-exception OR MIT", &mut texts).unwrap(),
            "Apache-2.0 with LLVM-exception exception or MIT"
        );
        assert!(texts["MIT"].contains("Permission is hereby granted"));
        assert!(texts["Apache-2.0"].contains("/usr/share/common-licenses/Apache-2.0"));
        assert!(texts["Unicode-3.0"].contains("UNICODE"));
        assert!(texts["Apache-2.0 with LLVM-exception exception"].contains("LLVM"));
        assert!(dep5("NOT-A-LICENCE", &mut texts).is_err());
    }

    #[test]
    fn a_text_field_marks_blank_lines() {
        assert_eq!(text_field("a\n\nb  \n"), " a\n .\n b");
    }

    #[test]
    fn every_linked_crate_has_a_licence_and_each_licence_a_text() {
        let metadata = metadata().unwrap();
        let (crates, licenses) = linked(&metadata).unwrap();
        let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
        // Linked into the programs: yes; a test or build dependency: no.
        for linked in ["clap", "serde_json", "hyper", "mail-parser"] {
            assert!(names.contains(&linked), "{linked} missing from {names:?}");
        }
        for unlinked in ["tempfile", "criterion", "proptest", "cc"] {
            assert!(!names.contains(&unlinked), "{unlinked} is not linked");
        }
        for c in &crates {
            for short in c.license.replace(['(', ')'], "").split(" or ").flat_map(|s| s.split(" and ")) {
                assert!(licenses.contains_key(short), "{} {}: no text for '{short}'", c.name, c.version);
            }
        }
    }
}
