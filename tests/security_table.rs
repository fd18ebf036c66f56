//! docs/SECURITY.md lists every entry point with the test that shows its
//! checks (issue 37). This keeps the table honest: every row names at least
//! one test, and every test function it names exists in the repository, so
//! a renamed or deleted test breaks the build of the table, not just its
//! meaning.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `fn name` defined in the Rust sources under `dir`.
fn functions_under(dir: &Path, found: &mut HashSet<String>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == ".git" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            functions_under(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = fs::read_to_string(&path).unwrap_or_default();
            for rest in text.split("fn ").skip(1) {
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    found.insert(name);
                }
            }
        }
    }
}

/// The backticked words of a table cell.
fn backticked(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// The rows of every table in the document whose header's last column is
/// "tests": (entry point, tests cell).
fn rows(doc: &str) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in doc.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.last() == Some(&"tests") {
            in_table = true;
            continue;
        }
        if !in_table || cells.iter().all(|c| c.chars().all(|ch| ch == '-')) {
            continue;
        }
        rows.push((cells[0].to_string(), cells.last().unwrap_or(&"").to_string()));
    }
    rows
}

#[test]
fn every_entry_point_names_a_test_that_exists() {
    let doc = fs::read_to_string(root().join("docs/SECURITY.md")).expect("docs/SECURITY.md");
    let mut functions = HashSet::new();
    for dir in ["crates", "tests", "bench", "fuzz"] {
        functions_under(&root().join(dir), &mut functions);
    }
    let rows = rows(&doc);
    assert!(rows.len() >= 25, "the entry-point tables hold {} rows: did the table format change?", rows.len());

    let mut problems = Vec::new();
    for (entry, tests) in &rows {
        let mut named = 0;
        for word in backticked(tests) {
            let is_test_name = word.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') && word.contains('_');
            if is_test_name {
                named += 1;
                if !functions.contains(word) {
                    problems.push(format!("{entry}: no test function `{word}` in the repository"));
                }
            }
        }
        // A row may name a whole test file instead (a path that exists).
        let files = tests
            .split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',')
            .filter(|w| w.ends_with(".rs"))
            .inspect(|w| {
                if !root().join(w).exists() {
                    problems.push(format!("{entry}: no file {w}"));
                }
            })
            .count();
        let by_suite = tests.contains("the property test");
        if named + files == 0 && !by_suite {
            problems.push(format!("{entry}: names no test"));
        }
    }
    assert!(problems.is_empty(), "docs/SECURITY.md:\n{}", problems.join("\n"));
}

#[test]
fn the_table_check_sees_a_missing_test() {
    let doc = "| entry | tests |\n|---|---|\n| notify | `no_such_test_anywhere` |\n| route | nothing |\n";
    let rows = rows(doc);
    assert_eq!(rows.len(), 2);
    assert_eq!(backticked(&rows[0].1), vec!["no_such_test_anywhere"]);
    assert!(backticked(&rows[1].1).is_empty());
}
