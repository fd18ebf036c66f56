//! Cookies and other sites (docs/ACCESS.md, "Cookies and other sites"):
//! a browser attaches a cookie by itself, to requests any page makes, so
//! a cookie credential alone shows no intent. It authorises reading;
//! anything else needs the request to show that it comes from this
//! server's own pages.
//!
//! ```
//! use kn_journal::access::{Operation, Principal, Site};
//! use kn_journal::{ErrorKind, Topic};
//!
//! let notes = Topic::parse("/who/anna/notes").unwrap();
//! // A cross-site top-level GET carrying anna's token cookie:
//! let site = Site::of(Some(b"cross-site"), None, "pubsub.example");
//! let anna = Principal::user("anna").through_cookie(site);
//! assert!(anna.check_claim(Operation::Read, &notes).is_ok());
//! assert_eq!(anna.check_claim(Operation::Post, &notes).unwrap_err().kind(), ErrorKind::Forbidden);
//! // The same from one of the server's own pages:
//! let site = Site::of(None, Some(b"https://pubsub.example"), "pubsub.example");
//! assert!(Principal::user("anna").through_cookie(site).check_claim(Operation::Post, &notes).is_ok());
//! ```

use crate::error::{Error, ErrorKind, Result};

use super::Principal;

/// Where a request comes from, as far as the browser that sent it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A page of this server's own origin, or the user (a typed URL, a
    /// bookmark): `Sec-Fetch-Site: same-origin` or `none`, or, from a
    /// browser without `Sec-Fetch-Site`, an `Origin` naming this server.
    Own,
    /// Another origin: `Sec-Fetch-Site: same-site` or `cross-site`, or an
    /// `Origin` naming another server (`null` included).
    Elsewhere,
    /// Nothing says: neither header (a client that is no browser, an old
    /// browser, an old browser's `GET`).
    Unknown,
}

impl Site {
    /// Where a request with `Sec-Fetch-Site` `fetch_site` and `Origin`
    /// `origin` comes from, for a server reached as `authority` (the
    /// request's `host[:port]`; a default port, 80 or 443, may be left
    /// out on either side). `Sec-Fetch-Site`, which no page can set,
    /// decides when present; an `Origin` is compared by host and port.
    ///
    /// ```
    /// use kn_journal::access::Site;
    /// assert_eq!(Site::of(Some(b"same-origin"), None, "h:8080"), Site::Own);
    /// assert_eq!(Site::of(Some(b"same-site"), None, "h:8080"), Site::Elsewhere);
    /// assert_eq!(Site::of(None, Some(b"http://h:8080"), "h:8080"), Site::Own);
    /// assert_eq!(Site::of(None, Some(b"https://h"), "h:443"), Site::Own);
    /// assert_eq!(Site::of(None, Some(b"http://h:8081"), "h:8080"), Site::Elsewhere);
    /// assert_eq!(Site::of(None, None, "h"), Site::Unknown);
    /// ```
    pub fn of(fetch_site: Option<&[u8]>, origin: Option<&[u8]>, authority: &str) -> Site {
        if let Some(value) = fetch_site {
            let value = value.trim_ascii();
            return if value.eq_ignore_ascii_case(b"same-origin") || value.eq_ignore_ascii_case(b"none") { Site::Own } else { Site::Elsewhere };
        }
        match origin {
            Some(origin) if same_authority(origin.trim_ascii(), authority) => Site::Own,
            Some(_) => Site::Elsewhere,
            None => Site::Unknown,
        }
    }
}

/// Whether `origin` (`scheme://host[:port]`, RFC 6454) names the server
/// reached as `authority`.
fn same_authority(origin: &[u8], authority: &str) -> bool {
    let Ok(origin) = std::str::from_utf8(origin) else { return false };
    let Some((scheme, host)) = origin.split_once("://") else { return false };
    let default = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => return false,
    };
    let bare = |a: &str| a.strip_suffix(default).unwrap_or(a).to_ascii_lowercase();
    !host.is_empty() && !host.contains('/') && bare(host) == bare(authority)
}

impl Principal {
    /// This principal, whose credential is a cookie (the `kn_token` or
    /// the `kn_session` cookie), on a request from `site`: from anywhere
    /// but the server's own pages ([`Site::Own`]) it may only read
    /// ([`Principal::check_change`]).
    pub fn through_cookie(mut self, site: Site) -> Principal {
        self.reading_only = site != Site::Own;
        self
    }

    /// True when this principal may only read ([`Principal::through_cookie`]).
    pub fn is_reading_only(&self) -> bool {
        self.reading_only
    }

    /// Whether this principal may change anything: `doing` (e.g. `post to
    /// '/what/chat'`, `acknowledge events of '...'`) is refused `403` for
    /// a cookie credential on a request not shown to come from this
    /// server's own pages.
    pub fn check_change(&self, doing: &str) -> Result<()> {
        if !self.reading_only {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Forbidden,
            format!(
                "{} may not {doing} with a cookie on a request that does not show it comes from this server's own pages \
                 (no Sec-Fetch-Site: same-origin, no Origin of this server): a cookie only reads; \
                 send the token in the Authorization header or the kn_token parameter (docs/ACCESS.md, \"Cookies and other sites\")",
                self.describe()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Operation, Rules};
    use crate::topic::Topic;

    #[test]
    fn sec_fetch_site_decides_before_origin() {
        for (fetch, origin, site) in [
            (Some(&b"same-origin"[..]), None, Site::Own),
            (Some(b"none"), None, Site::Own),
            (Some(b" Same-Origin "), None, Site::Own),
            (Some(b"same-site"), None, Site::Elsewhere),
            (Some(b"cross-site"), Some(&b"http://h:8080"[..]), Site::Elsewhere),
            (Some(b"same-origin"), Some(b"http://evil.example"), Site::Own),
            (Some(b""), None, Site::Elsewhere),
            (None, Some(b"http://h:8080"), Site::Own),
            (None, Some(b"http://H:8080"), Site::Own),
            (None, Some(b"null"), Site::Elsewhere),
            (None, Some(b"http://h:8080.evil.example"), Site::Elsewhere),
            (None, Some(b"http://h:8080/"), Site::Elsewhere),
            (None, Some(b"ftp://h:8080"), Site::Elsewhere),
            (None, Some(b"\xff"), Site::Elsewhere),
            (None, None, Site::Unknown),
        ] {
            assert_eq!(Site::of(fetch, origin, "h:8080"), site, "{fetch:?} {origin:?}");
        }
        assert_eq!(Site::of(None, Some(b"http://h"), "h"), Site::Own);
        assert_eq!(Site::of(None, Some(b"http://h"), "h:80"), Site::Own);
        assert_eq!(Site::of(None, Some(b"http://h:80"), "h"), Site::Own);
        assert_eq!(Site::of(None, Some(b"http://g"), "h"), Site::Elsewhere);
    }

    #[test]
    fn a_cookie_from_elsewhere_reads_and_changes_nothing_whatever_the_rules() {
        let rules = Rules::parse("allow all /** *\n", "r".as_ref()).unwrap();
        let chat = Topic::parse("/what/chat").unwrap();
        for site in [Site::Elsewhere, Site::Unknown] {
            for who in [Principal::user("anna"), Principal::anonymous_session("s1"), Principal::nobody()] {
                let who = who.through_cookie(site);
                assert!(who.is_narrowed());
                for op in Operation::ALL {
                    let answer = rules.check(&who, op, &chat);
                    if op == Operation::Read && who.name().is_some() || op == Operation::Read && who.session().is_some() {
                        assert!(answer.is_ok(), "{who:?} {op:?}");
                    } else if op != Operation::Read {
                        let err = answer.unwrap_err();
                        assert_eq!(err.kind(), ErrorKind::Forbidden, "{who:?} {op:?}");
                    }
                }
                assert!(who.check_change("acknowledge").is_err());
            }
        }
        let own = Principal::user("anna").through_cookie(Site::Own);
        assert!(!own.is_narrowed() && Operation::ALL.iter().all(|op| rules.check(&own, *op, &chat).is_ok()));
    }
}
