//! `kn doctor --url URL`: a running server's self-test
//! (`URL?do_method=test`) as an exit status, for health checks and
//! monitoring. It succeeds only when the server answered `200` with at
//! least one check and every check said `Success.`: a server that is down,
//! answers an error page, or fails a check makes it fail (a count of
//! `FAIL` lines alone says 0 for a server that is down).
//!
//! ```
//! use kn_sensors::admin::selftest::{parse, Verdict};
//!
//! let page = "<h1>Store</h1><p> Success.\n<h1>Free space</h1><p> FAIL: 1 MiB left\n";
//! let checks = parse(page);
//! assert_eq!(checks.len(), 2);
//! assert_eq!(checks[1].verdict, Verdict::Fail("1 MiB left".into()));
//! ```

use std::io::{self, Write};

use kn_journal::{Config, HttpRemote, OutboundPolicy};

use crate::{SensorError, SensorErrorKind};

/// One check of the self-test page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Its heading (`Store`, `Free space`, ...), HTML entities decoded.
    pub name: String,
    /// What the server said of it.
    pub verdict: Verdict,
}

/// A check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// `Success.`
    Ok,
    /// `FAIL: why`.
    Fail(String),
    /// Neither: the page is not the self-test's.
    Unknown(String),
}

/// The checks of a `do_method=test` page, in order: each `<h1>` heading
/// and the verdict after it. A page without headings gives none.
pub fn parse(page: &str) -> Vec<Check> {
    let mut checks = Vec::new();
    for part in page.split("<h1>").skip(1) {
        let Some((name, rest)) = part.split_once("</h1>") else { continue };
        let said = rest.trim_start_matches("<p>").trim();
        let said = said.split('<').next().unwrap_or("").trim();
        let verdict = if said == "Success." {
            Verdict::Ok
        } else if let Some(why) = said.strip_prefix("FAIL:") {
            Verdict::Fail(unescape(why.trim()))
        } else {
            Verdict::Unknown(unescape(said))
        };
        checks.push(Check { name: unescape(name.trim()), verdict });
    }
    checks
}

/// The five entities `js::html_escape` writes.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&#39;", "'").replace("&amp;", "&")
}

/// The self-test URL of the server at `url` (its `/kn`): `do_method=test`
/// added to its query.
pub fn test_url(url: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}do_method=test")
}

/// Runs the self-test of the server at `url` through the project's HTTP
/// client (its timeouts and size limit from `config`), writes one line per
/// check (`ok NAME` or `FAIL NAME: why`) and returns whether every check
/// passed. A server that cannot be reached or answers other than `200`
/// is an error ([`SensorErrorKind::TempFail`], exit status 75); a page
/// without a single `Success.` or `FAIL` is one too
/// ([`SensorErrorKind::Unavailable`], 69): it is not the self-test.
pub fn check_server(out: &mut dyn Write, url: &str, config: &Config) -> Result<bool, SensorError> {
    let remote = HttpRemote::from_config(config);
    let target = test_url(url);
    let reply = remote
        .get(&target, &OutboundPolicy::AllowAll)
        .map_err(|e| SensorError::new(SensorErrorKind::TempFail, format!("the self-test at '{target}' did not answer: {e}")))?;
    if reply.status != 200 {
        return Err(SensorError::new(SensorErrorKind::TempFail, format!("the self-test at '{target}' answered {}", reply.status)));
    }
    let checks = parse(&String::from_utf8_lossy(&reply.body));
    if checks.iter().all(|c| matches!(c.verdict, Verdict::Unknown(_))) {
        return Err(SensorError::new(
            SensorErrorKind::Unavailable,
            format!("'{target}' answered 200 without a self-test check: is it a knpubsub server's /kn?"),
        ));
    }
    write_checks(out, &checks).map_err(|e| SensorError::new(SensorErrorKind::TempFail, format!("cannot write the report: {e}")))?;
    Ok(checks.iter().all(|c| c.verdict == Verdict::Ok))
}

/// One line per check: `ok NAME`, `FAIL NAME: why`, or `?? NAME: what it
/// said`. What the server said is shown, never obeyed: a control
/// character (an escape sequence, a carriage return or a line break that
/// would forge an `ok` line) or a bidirectional override is written as
/// `\u{..}`, as a terminal must not take a remote page's orders.
pub fn write_checks(out: &mut dyn Write, checks: &[Check]) -> io::Result<()> {
    for check in checks {
        let name = shown(&check.name);
        match &check.verdict {
            Verdict::Ok => writeln!(out, "ok    {name}")?,
            Verdict::Fail(why) => writeln!(out, "FAIL  {name}: {}", shown(why))?,
            Verdict::Unknown(said) => writeln!(out, "??    {name}: {}", shown(said))?,
        }
    }
    Ok(())
}

/// `text` with every control character and bidirectional override or
/// isolate written `\u{..}`.
fn shown(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_heading_is_a_check_with_its_verdict() {
        let page = "<html><body>\n<h1>Store</h1><p> Success.\n<h1>Group &amp; modes</h1><p> FAIL: /s/a is 0600 &lt;not 0664&gt;\n<h1>Odd</h1><p> maybe\n</body>\n</html>\n";
        let checks = parse(page);
        assert_eq!(
            checks,
            [
                Check { name: "Store".into(), verdict: Verdict::Ok },
                Check { name: "Group & modes".into(), verdict: Verdict::Fail("/s/a is 0600 <not 0664>".into()) },
                Check { name: "Odd".into(), verdict: Verdict::Unknown("maybe".into()) },
            ]
        );
    }

    #[test]
    fn a_page_without_headings_has_no_checks() {
        assert!(parse("<html>It works!</html>").is_empty());
        assert!(parse("").is_empty());
        assert!(parse("<h1>unclosed").is_empty());
    }

    #[test]
    fn a_remote_pages_control_characters_are_shown_not_obeyed() {
        let page = "<h1>Store\x1b]0;owned\x07</h1><p> FAIL: \x1b[31mred\r\nok    forged\u{202e}\n<h1>x\u{9b}2J</h1><p> Success.\n";
        let mut out = Vec::new();
        write_checks(&mut out, &parse(page)).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out.lines().count(), 2, "{out}");
        assert!(!out.chars().any(|c| c != '\n' && (c.is_control() || c == '\u{202e}')), "{out:?}");
        assert!(out.starts_with("FAIL  Store\\u{1b}]0;owned\\u{7}: \\u{1b}[31mred\\u{d}\\u{a}ok    forged\\u{202e}\n"), "{out}");
        assert!(out.ends_with("ok    x\\u{9b}2J\n"), "{out}");
    }

    #[test]
    fn the_test_method_is_added_to_the_query() {
        assert_eq!(test_url("http://h/kn"), "http://h/kn?do_method=test");
        assert_eq!(test_url("http://h/kn?x=1"), "http://h/kn?x=1&do_method=test");
    }
}
