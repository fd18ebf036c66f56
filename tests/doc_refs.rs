//! Every reference the project makes resolves (issue 38): a reader sent to
//! a document, a section of one, or a file of the repository finds it.
//!
//! What is checked, over the project's own text files (Markdown, Rust,
//! HTML, scripts; not the unmodified original suite, the recorded golden
//! bytes, the fuzz corpora or `node_modules`):
//!
//! * **Markdown links** in `*.md`, read by a CommonMark parser
//!   (pulldown-cmark): a relative link names a file that exists, and an
//!   anchor (`#section`) names a heading of its document.
//! * **Document mentions** (`docs/ACCESS.md`, `FORMAT.md`) in every file:
//!   the document exists, found from the mentioning file's folder, its
//!   crate, `docs/` or the root.
//! * **Section citations**: `PROTOCOL.md 3.7`, `ACCESS.md, section 1b`,
//!   `PROTOCOL.md sections 1, 2 and 4`, `PROTOCOL.md's appendix`, and
//!   quoted titles (`FORMAT.md, "Shared mode"`) name a heading of the
//!   document.
//! * **Repository paths in backticks** in `*.md` (`crates/cgi/src/serve.rs`)
//!   exist.
//! * **What ships**: the crates packaged by `.ci/crates` (kn-journal,
//!   kn-wire) are read apart from the repository, on docs.rs or in a
//!   registry's copy. Their Markdown links stay inside the crate, their
//!   rustdoc links to no file (rustdoc cannot follow one), and a document
//!   they mention by its bare name (`PROTOCOL.md 3.7`) is in the crate.
//!   A path like `docs/ACCESS.md` names the repository and is checked
//!   there.
//! * **What the Debian package installs** (packaging/build-deb's list of
//!   documents, in the repository's layout under /usr/share/doc/knpubsub):
//!   every document an installed document, a man page's source or a
//!   configuration file names is installed too, and so is the target of
//!   an installed document's relative link ([`REPOSITORY_ONLY`] documents,
//!   for contributors, excepted).
//!
//! [`ALLOWED`] lists the few references that cannot resolve, each with its
//! reason.

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::LazyLock;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use regex::Regex;

/// References that cannot resolve in the repository, with why: `(the
/// referring file, the reference as written)`.
const ALLOWED: &[(&str, &str, &str)] = &[(
    "docs/DURABLE-STREAMS.md",
    "shared/reference/durable-streams/",
    "the Durable Streams protocol's own text, laid beside the repository for its sessions and CI; the protocol's public home is named in the same sentence",
)];

/// Where the documents of contributors' tooling live (CI, fuzzing,
/// benchmarks, the original suite, and any `tests` folder): they are read
/// in a clone of the repository, never in an installation, so a packaged
/// document may name them without the package installing them.
const REPOSITORY_ONLY: &[&str] = &[".ci", "fuzz", "bench", "tests", "contract"];

fn repository_only(path: &Path) -> bool {
    let rel = path.strip_prefix(root()).unwrap_or(path);
    REPOSITORY_ONLY.iter().any(|d| rel.starts_with(d)) || rel.components().any(|c| c.as_os_str() == "tests")
}

/// Folders never read: build output, third-party and recorded files.
const SKIPPED: &[&str] = &[
    "target",
    ".git",
    "node_modules",
    // KnowNow's suite, kept unmodified (its own documents are its own).
    "contract/original-suite",
    // Exact bytes of the original server.
    "crates/cgi/tests/golden",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/target",
];

/// The crates `.ci/crates` packages, read apart from the repository.
const SHIPPED_CRATES: &[&str] = &["crates/journal", "crates/wire"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One broken reference: where, what, why.
struct Broken {
    file: String,
    reference: String,
    why: String,
}

#[derive(Default)]
struct Report {
    broken: Vec<Broken>,
    allowed_used: BTreeSet<(&'static str, &'static str)>,
}

impl Report {
    fn fail(&mut self, file: &Path, reference: &str, why: impl Into<String>) {
        let file = rel(file);
        if let Some(&(f, r, _)) = ALLOWED.iter().find(|(f, r, _)| *f == file && *r == reference) {
            self.allowed_used.insert((f, r));
            return;
        }
        self.broken.push(Broken { file, reference: reference.to_string(), why: why.into() });
    }
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).to_string_lossy().into_owned()
}

/// The text files to read.
fn files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root().to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = rel(&path);
            if SKIPPED.iter().any(|s| name == *s || path.file_name().is_some_and(|n| n == *s)) {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                dirs.push(path);
            } else if is_text(&path) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

fn is_text(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if matches!(ext, "md" | "rs" | "html" | "js" | "toml" | "sh" | "conf" | "service") {
        return true;
    }
    // Scripts without an extension: .ci/run, packaging/build-deb, ...
    ext.is_empty() && std::fs::read(path).is_ok_and(|b| b.starts_with(b"#!"))
}

/// The folder of the crate `file` belongs to (the nearest folder below
/// the root with a Cargo.toml), if any.
fn crate_dir(file: &Path) -> Option<PathBuf> {
    let mut dir = file.parent()?;
    while dir != root() {
        if dir.join("Cargo.toml").is_file() {
            return Some(dir.to_path_buf());
        }
        dir = dir.parent()?;
    }
    None
}

fn shipped_crate(file: &Path) -> Option<PathBuf> {
    let dir = crate_dir(file)?;
    SHIPPED_CRATES.iter().any(|c| root().join(c) == dir).then_some(dir)
}

/// `path` with `.` and `..` resolved without touching the file system
/// (a link is read as its reader reads it, not through symlinks).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Where a mentioned document may be, looked for as a reader would, most
/// likely first: beside the mentioning file, in its crate, in `docs/`, at
/// the root, then any document of that name (`FORMAT.md` is
/// crates/journal's wherever it is named). With `within` (a shipped crate)
/// only inside that folder. `/usr/share/doc/knpubsub/` is where the
/// package installs the repository's documents.
fn find_doc(file: &Path, name: &str, within: Option<&Path>, docs: &[PathBuf]) -> Vec<PathBuf> {
    let name = name.trim_start_matches('/');
    let name = name.strip_prefix("usr/share/doc/knpubsub/").map_or(name, |n| n);
    let dir = file.parent().unwrap_or(root());
    let mut bases = vec![dir.to_path_buf()];
    bases.extend(crate_dir(file));
    if within.is_none() {
        bases.push(root().join("docs"));
        bases.push(root().to_path_buf());
    }
    let mut found: Vec<PathBuf> =
        bases.into_iter().map(|b| lexical(&b.join(name))).filter(|p| p.is_file() && within.is_none_or(|w| p.starts_with(w))).collect();
    if within.is_none() && !name.contains('/') {
        found.extend(docs.iter().filter(|d| d.file_name().is_some_and(|n| n == name)).cloned());
    }
    found.dedup();
    found
}

// ----- what a document offers: headings ---------------------------------

/// GitHub's Markdown, as written: no typographic quotes, which would make
/// `reader's` in a heading differ from the citation's.
fn markdown_options() -> Options {
    let mut options = Options::all();
    options.remove(Options::ENABLE_SMART_PUNCTUATION);
    options
}

struct Doc {
    /// Heading texts, as written (inline code without its backticks).
    headings: Vec<String>,
    /// Strong texts (`**Group commit**`): the run-in headings of a
    /// paragraph, which citations name like headings.
    strong: Vec<String>,
    /// GitHub's anchors of the headings.
    anchors: BTreeSet<String>,
}

fn read_doc<'c>(path: &Path, cache: &'c mut HashMap<PathBuf, Doc>) -> &'c Doc {
    cache.entry(path.to_path_buf()).or_insert_with(|| {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut headings = Vec::new();
        let mut strong = Vec::new();
        let mut current: Option<String> = None;
        let mut bold: Option<String> = None;
        for event in Parser::new_ext(&text, markdown_options()) {
            match event {
                Event::Start(Tag::Heading { .. }) => current = Some(String::new()),
                Event::End(TagEnd::Heading(_)) => headings.extend(current.take()),
                Event::Start(Tag::Strong) => bold = Some(String::new()),
                Event::End(TagEnd::Strong) => strong.extend(bold.take()),
                Event::Text(t) | Event::Code(t) => {
                    for open in [current.as_mut(), bold.as_mut()].into_iter().flatten() {
                        open.push_str(&t);
                    }
                }
                Event::SoftBreak => {
                    for open in [current.as_mut(), bold.as_mut()].into_iter().flatten() {
                        open.push(' ');
                    }
                }
                _ => {}
            }
        }
        let mut anchors = BTreeSet::new();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for h in &headings {
            let slug = slug(h);
            let n = seen.entry(slug.clone()).or_insert(0);
            anchors.insert(if *n == 0 { slug.clone() } else { format!("{slug}-{n}") });
            *n += 1;
        }
        Doc { headings, strong, anchors }
    })
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation
/// other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The number a heading starts with (`3.7`, `1b`), if any.
fn heading_number(heading: &str) -> Option<&str> {
    static NUMBER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^(\d+[a-z]?(?:\.\d+)*)\.?(?:\s|$)").unwrap());
    NUMBER.captures(heading.trim()).and_then(|c| c.get(1)).map(|m| m.as_str())
}

fn has_section(doc: &Doc, number: &str) -> bool {
    doc.headings.iter().any(|h| heading_number(h) == Some(number))
}

fn norm(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace('`', "").to_lowercase()
}

fn has_titled(doc: &Doc, title: &str) -> bool {
    let title = norm(title);
    doc.headings.iter().chain(&doc.strong).any(|h| {
        let h = norm(h);
        // With or without its number: "1a. Anonymous visitors: sessions".
        let bare = heading_number(&h).map_or(h.as_str(), |n| h[n.len()..].trim_start_matches('.').trim_start());
        h.starts_with(&title) || bare.starts_with(&title)
    })
}

// ----- the text a reader reads -------------------------------------------

/// The prose of a file: Markdown and HTML as they are; other files with
/// their comment markers (`//!`, `///`, `//`, `#`) stripped, so that a
/// citation wrapped over two comment lines reads as one.
fn prose(path: &Path, text: &str) -> String {
    static RUST: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s*(?://[/!]?|\*)\s?").unwrap());
    static SHELL: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s*#+\s?").unwrap());
    let marker = match path.extension().and_then(|e| e.to_str()) {
        Some("rs" | "js") => &*RUST,
        Some("md" | "html") => return text.to_string(),
        // Scripts, TOML, configuration: `#` comments.
        _ => &*SHELL,
    };
    text.lines().map(|l| marker.replace(l, "").into_owned()).collect::<Vec<_>>().join("\n")
}

/// The doc comments (`//!`, `///`) of a Rust file, as rustdoc reads them.
fn rustdoc(text: &str) -> String {
    text.lines()
        .filter_map(|l| {
            let t = l.trim_start();
            t.strip_prefix("//!").or_else(|| t.strip_prefix("///")).map(|d| d.strip_prefix(' ').unwrap_or(d))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ----- the checks ------------------------------------------------------------

static DOC_NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"(?:\.\./|\./)*(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_-]+\.md\b").unwrap());

/// A citation of sections: a document, then `section(s)` and numbers.
static CITATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?x)
        (?P<doc>(?:[A-Za-z0-9_.-]+/)*[A-Z][A-Za-z0-9_-]*\.md)`?
        (?:
            (?:'s|’s)?\s*,?\s+(?:sections?\s+|§\s*)?
            (?P<nums>\d+[a-z]?(?:\.\d+)*(?:\s*(?:,\s*(?:and\s+)?|\s+and\s+|-|–)\s*\d+[a-z]?(?:\.\d+)*)*)\b(?P<after>[.,;:)\s]|$)
          | (?:'s|’s|,)?\s+\(?(?P<appendix>appendix)\b
          | (?:'s|’s)?,?\s+(?:section\s+)?"(?P<title>[^"]{2,80})"
        )"#,
    )
    .unwrap()
});

static NUMBER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\d+[a-z]?(?:\.\d+)*").unwrap());

/// Is the mention at `start..end` of `text` part of a URL (another
/// project's document)?
fn in_url(text: &str, start: usize) -> bool {
    let before = &text[..start];
    let word_start = before.rfind(|c: char| c.is_whitespace() || "(<\"'`[".contains(c)).map_or(0, |i| i + 1);
    let word = &before[word_start..];
    word.contains("://") || word.contains("github.com/") || word.contains(".org/") || word.contains(".com/")
}

fn check_mentions(path: &Path, text: &str, docs: &[PathBuf], cache: &mut HashMap<PathBuf, Doc>, report: &mut Report) {
    let shipped = shipped_crate(path);
    let prose = prose(path, text);
    for m in DOC_NAME.find_iter(&prose) {
        let name = m.as_str();
        if in_url(&prose, m.start()) || name.contains('*') {
            continue;
        }
        let bare = !name.contains('/');
        let within = if bare { shipped.as_deref() } else { None };
        if find_doc(path, name, within, docs).is_empty() {
            let why = match within {
                Some(c) => format!("no such document in the crate {} (what its package holds)", rel(c)),
                None => "no such document in the repository".to_string(),
            };
            report.fail(path, name, why);
        }
    }
    for c in CITATION.captures_iter(&prose) {
        let name = &c["doc"];
        let start = c.get(0).map_or(0, |m| m.start());
        if in_url(&prose, start) {
            continue;
        }
        let within = if name.contains('/') { None } else { shipped.as_deref() };
        let candidates = find_doc(path, name, within, docs);
        let Some(first) = candidates.first() else {
            continue;
        }; // reported above
        let whole = c.get(0).map_or("", |m| m.as_str()).split_whitespace().collect::<Vec<_>>().join(" ");
        let whole = whole.trim_end_matches([';', ',', '.', ':', ')']);
        // The section is in one of the documents the name may mean.
        let mut cited = |what: String, found: &dyn Fn(&Doc) -> bool| {
            if !candidates.iter().any(|d| found(read_doc(d, cache))) {
                report.fail(path, whole, format!("{} has no {what}", rel(first)));
            }
        };
        if let Some(nums) = c.name("nums") {
            for n in NUMBER.find_iter(nums.as_str()) {
                cited(format!("section {}", n.as_str()), &|doc| has_section(doc, n.as_str()));
            }
        } else if c.name("appendix").is_some() {
            cited("appendix".into(), &|doc| doc.headings.iter().any(|h| h.trim().to_lowercase().starts_with("appendix")));
        } else if let Some(title) = c.name("title") {
            let title = title.as_str().split_whitespace().collect::<Vec<_>>().join(" ");
            let title = title.as_str();
            cited(format!("heading \"{title}\""), &|doc| has_titled(doc, title));
        }
    }
}

/// Markdown links of a Markdown file, or of a Rust file's doc comments.
fn check_links(path: &Path, markdown: &str, is_rustdoc: bool, cache: &mut HashMap<PathBuf, Doc>, report: &mut Report) {
    let shipped = shipped_crate(path);
    for event in Parser::new_ext(markdown, markdown_options()) {
        let dest = match event {
            Event::Start(Tag::Link { dest_url, .. }) | Event::Start(Tag::Image { dest_url, .. }) => dest_url,
            _ => continue,
        };
        let dest = dest.as_ref();
        if dest.contains("://") || dest.starts_with("mailto:") {
            continue;
        }
        if is_rustdoc {
            // Intra-doc links name items (`crate::Store`, `Config::new`).
            if dest.contains('/') || dest.ends_with(".md") {
                report.fail(
                    path,
                    dest,
                    "a rustdoc link to a file: docs.rs and cargo doc cannot follow it (name the document in text, or link an item)",
                );
            }
            continue;
        }
        let (file, anchor) = dest.split_once('#').unwrap_or((dest, ""));
        let target = if file.is_empty() { path.to_path_buf() } else { lexical(&path.parent().unwrap_or(root()).join(file)) };
        if !target.exists() {
            report.fail(path, dest, "no such file");
            continue;
        }
        if let Some(c) = &shipped {
            if !target.starts_with(c) {
                report.fail(path, dest, format!("points outside the crate {}: its package cannot follow it", rel(c)));
            }
        }
        if !anchor.is_empty() && target.extension().is_some_and(|e| e == "md") && !read_doc(&target, cache).anchors.contains(anchor) {
            report.fail(path, dest, format!("{} has no heading with the anchor #{anchor}", rel(&target)));
        }
    }
}

/// Backticked paths of a Markdown file whose first segment is a folder or
/// file of the repository (or of the document's own folder).
fn check_code_paths(path: &Path, markdown: &str, report: &mut Report) {
    static PATH: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^(?:\.\./)*[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?$").unwrap());
    static LINE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r":\d+(?:-\d+)?$").unwrap());
    let dir = path.parent().unwrap_or(root());
    for event in Parser::new_ext(markdown, markdown_options()) {
        let Event::Code(code) = event else { continue };
        let code = LINE.replace(code.trim(), "");
        // Where the package installs a document: the repository's path.
        let code = code.strip_prefix("/usr/share/doc/knpubsub/").unwrap_or(&code);
        let code = code.strip_suffix(".gz").filter(|c| c.ends_with(".md")).unwrap_or(code);
        if !code.contains('/') || !PATH.is_match(code) || code.starts_with("//") {
            continue;
        }
        if code.starts_with("shared/") || code.starts_with("../shared/") {
            report.fail(path, code, "outside the repository");
            continue;
        }
        let first = code.trim_start_matches("../").split('/').next().unwrap_or("");
        let candidates = [root().join(first), dir.join(first)];
        // target/ is what a build makes, not the repository's.
        if first.is_empty() || first == "target" || !candidates.iter().any(|c| c.exists()) || matches!(first, "." | "..") {
            continue; // not a path of ours: `kn_events/what/chat/`, `/what/chat`
        }
        let found = [lexical(&dir.join(code)), lexical(&root().join(code))].iter().any(|p| p.exists());
        if !found {
            report.fail(path, code, "no such path in the repository");
        }
    }
}

#[test]
fn every_reference_to_a_document_section_or_path_resolves() {
    let mut cache = HashMap::new();
    let mut report = Report::default();
    let files = files();
    assert!(files.iter().any(|f| f.ends_with("docs/PROTOCOL.md")), "docs/PROTOCOL.md is not among the files read");
    let docs: Vec<PathBuf> = files.iter().filter(|f| f.extension().is_some_and(|e| e == "md")).cloned().collect();
    for path in &files {
        // This file's own examples are not references.
        if path.ends_with("tests/doc_refs.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        check_mentions(path, &text, &docs, &mut cache, &mut report);
        if path.extension().is_some_and(|e| e == "md") {
            check_links(path, &text, false, &mut cache, &mut report);
            check_code_paths(path, &text, &mut report);
        } else if path.extension().is_some_and(|e| e == "rs") {
            check_links(path, &rustdoc(&text), true, &mut cache, &mut report);
        }
    }
    let unused: Vec<_> = ALLOWED.iter().filter(|(f, r, _)| !report.allowed_used.contains(&(*f, *r))).collect();
    assert!(unused.is_empty(), "allowed references that no longer occur (remove them from ALLOWED): {unused:?}");
    let lines: Vec<String> = report.broken.iter().map(|b| format!("  {}: `{}`: {}", b.file, b.reference, b.why)).collect();
    assert!(lines.is_empty(), "{} broken references:\n{}", lines.len(), lines.join("\n"));
}

/// A document a shipped crate mentions by its bare name must be in the
/// crate; the protocol that kn-journal's and kn-wire's docs cite is.
#[test]
fn the_shipped_crates_carry_the_protocol_they_cite() {
    for krate in SHIPPED_CRATES {
        let copy = root().join(krate).join("PROTOCOL.md");
        let text = std::fs::read_to_string(&copy).unwrap_or_else(|e| panic!("{krate}/PROTOCOL.md: {e}"));
        let original = std::fs::read_to_string(root().join("docs/PROTOCOL.md")).expect("docs/PROTOCOL.md");
        assert_eq!(text, original, "{krate}/PROTOCOL.md must be docs/PROTOCOL.md (a symbolic link, which cargo package copies)");
    }
}

/// The documents packaging/build-deb installs under
/// /usr/share/doc/knpubsub, as repository paths: the words of its
/// `for file in ... .md ...; do` loop, globs expanded (`docs/*.md`).
fn packaged_docs() -> BTreeSet<PathBuf> {
    let script = std::fs::read_to_string(root().join("packaging/build-deb")).expect("packaging/build-deb");
    let line = script
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("for file in ") && l.contains(".md"))
        .expect("packaging/build-deb has no `for file in ... .md ...; do` loop installing the documents: say here where it lists them");
    let words = line.trim_start_matches("for file in ").trim_end_matches("do").trim_end().trim_end_matches(';');
    words.split_whitespace().flat_map(|word| glob(root(), word)).map(|p| lexical(&p)).collect()
}

/// The files a shell glob of `*`s (`docs/*/*.md`) names under `dir`.
fn glob(dir: &Path, pattern: &str) -> Vec<PathBuf> {
    let (first, rest) = pattern.split_once('/').map_or((pattern, None), |(f, r)| (f, Some(r)));
    let names: Vec<PathBuf> = match first.split_once('*') {
        None => vec![dir.join(first)],
        Some((prefix, suffix)) => std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.len() >= prefix.len() + suffix.len() && name.starts_with(prefix) && name.ends_with(suffix)
                    })
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default(),
    };
    match rest {
        None => names.into_iter().filter(|p| p.is_file()).collect(),
        Some(rest) => names.iter().filter(|p| p.is_dir()).flat_map(|p| glob(p, rest)).collect(),
    }
}

/// What the Debian package ships sends its reader only to documents it
/// ships: the installed documents, the man pages' sources and the
/// configuration files name no document that is not installed beside
/// them (in the repository's layout, so that a relative link or a
/// `docs/ACCESS.md` resolves under /usr/share/doc/knpubsub).
#[test]
fn the_package_ships_every_document_it_sends_a_reader_to() {
    let docs: Vec<PathBuf> = files().into_iter().filter(|f| f.extension().is_some_and(|e| e == "md")).collect();
    let packaged = packaged_docs();
    assert!(packaged.contains(&root().join("README.md")), "build-deb's document list does not have README.md: {packaged:?}");
    let mut readers: Vec<PathBuf> = packaged.iter().cloned().collect();
    for dir in ["packaging/deb", "packaging/docgen/src"] {
        readers.extend(files().into_iter().filter(|f| f.starts_with(root().join(dir))));
    }
    let mut missing = Vec::new();
    for path in &readers {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        let prose = prose(path, &text);
        for m in DOC_NAME.find_iter(&prose) {
            if in_url(&prose, m.start()) {
                continue;
            }
            let candidates = find_doc(path, m.as_str(), None, &docs);
            let allowed = candidates.iter().any(|c| repository_only(c));
            // Unresolved names are the other test's to report.
            if !allowed && !candidates.is_empty() && !candidates.iter().any(|c| packaged.contains(c)) {
                missing.push(format!("  {}: `{}` ({} is not installed)", rel(path), m.as_str(), rel(&candidates[0])));
            }
        }
        // A relative link of an installed document reaches an installed file.
        if path.extension().is_some_and(|e| e == "md") && packaged.contains(path) {
            for event in Parser::new_ext(&text, markdown_options()) {
                let (Event::Start(Tag::Link { dest_url, .. }) | Event::Start(Tag::Image { dest_url, .. })) = event else {
                    continue;
                };
                let file = dest_url.split('#').next().unwrap_or("");
                if file.is_empty() || dest_url.contains("://") || dest_url.starts_with("mailto:") {
                    continue;
                }
                let target = lexical(&path.parent().unwrap_or(root()).join(file));
                // A folder is there when a document in it is; a licence's
                // text is in the package's copyright file (Debian policy).
                let licence = target.file_name().is_some_and(|n| n.to_string_lossy().starts_with("LICENSE"));
                if !licence && !packaged.contains(&target) && !packaged.iter().any(|d| d.starts_with(&target) && target.is_dir()) {
                    missing.push(format!("  {}: link `{dest_url}` ({} is not installed)", rel(path), rel(&target)));
                }
            }
        }
    }
    missing.dedup();
    assert!(missing.is_empty(), "the package sends its readers to documents it does not install (packaging/build-deb):\n{}", missing.join("\n"));
}

/// The parts of the check that decide what a citation is.
#[test]
fn citations_are_read_as_a_reader_reads_them() {
    let find = |text: &str| -> Vec<String> {
        CITATION
            .captures_iter(text)
            .map(|c| {
                let what = c.name("nums").or(c.name("appendix")).or(c.name("title")).map_or("", |m| m.as_str());
                format!("{} {}", &c["doc"], what)
            })
            .collect()
    };
    assert_eq!(find("see PROTOCOL.md 3.7 for it"), ["PROTOCOL.md 3.7"]);
    assert_eq!(find("(PROTOCOL.md sections 1, 2 and 4)"), ["PROTOCOL.md 1, 2 and 4"]);
    assert_eq!(find("PROTOCOL.md 3.3-3.4: no"), ["PROTOCOL.md 3.3-3.4"]);
    assert_eq!(find("docs/ACCESS.md, section 1b."), ["docs/ACCESS.md 1b"]);
    assert_eq!(find("as PROTOCOL.md's appendix describes"), ["PROTOCOL.md appendix"]);
    assert_eq!(find("(crates/journal/FORMAT.md, \"Shared mode\")"), ["crates/journal/FORMAT.md Shared mode"]);
    assert_eq!(find("BENCHMARKS.md: 5.8 ms"), Vec::<String>::new());
    assert_eq!(find("PROTOCOL.md v1.0"), Vec::<String>::new());
    assert_eq!(heading_number("3.7 The other methods"), Some("3.7"));
    assert_eq!(heading_number("1a. Anonymous visitors: sessions"), Some("1a"));
    assert_eq!(heading_number("Appendix: the legacy store"), None);
    assert_eq!(slug("3.7 The other `methods`"), "37-the-other-methods");
}

/// The check reports what a reader would not find, and only that.
#[test]
fn broken_references_are_reported_and_sound_ones_are_not() {
    let docs: Vec<PathBuf> = files().into_iter().filter(|f| f.extension().is_some_and(|e| e == "md")).collect();
    let check = |file: &str, text: &str| -> Vec<String> {
        let mut report = Report::default();
        let mut cache = HashMap::new();
        let path = root().join(file);
        check_mentions(&path, text, &docs, &mut cache, &mut report);
        if file.ends_with(".rs") {
            check_links(&path, &rustdoc(text), true, &mut cache, &mut report);
        } else {
            check_links(&path, text, false, &mut cache, &mut report);
        }
        report.broken.into_iter().map(|b| b.reference).collect()
    };
    // Sound: a section, a titled section, a run-in heading, a link with its anchor.
    let sound = "PROTOCOL.md 3.7, ACCESS.md section 1b, (crates/journal/FORMAT.md, \"Group commit\"), \
                 PROTOCOL.md's appendix, [the protocol](PROTOCOL.md#37-the-other-methods)";
    assert_eq!(check("docs/NEW.md", sound), Vec::<String>::new());
    let broken = "PROTOCOL.md 42.1; docs/NOPE.md; (FORMAT.md, \"No such part\"); [x](PROTOCOL.md#no-such-anchor); [y](gone.md)";
    // `gone.md` twice: named, and linked.
    assert_eq!(
        check("docs/NEW.md", broken),
        ["docs/NOPE.md", "gone.md", "PROTOCOL.md 42.1", "FORMAT.md, \"No such part\"", "PROTOCOL.md#no-such-anchor", "gone.md"]
    );
    // kn-journal's docs: a bare name must be in the crate; a path names
    // the repository; rustdoc follows no link to a file.
    assert_eq!(check("crates/journal/src/new.rs", "//! See PROTOCOL.md 3.3 and docs/DEPLOY.md.\n"), Vec::<String>::new());
    assert_eq!(check("crates/journal/src/new.rs", "//! See DEPLOY.md.\n"), ["DEPLOY.md"]);
    assert_eq!(check("crates/journal/src/new.rs", "//! See [the protocol](../../../docs/PROTOCOL.md).\n"), ["../../../docs/PROTOCOL.md"]);
}
