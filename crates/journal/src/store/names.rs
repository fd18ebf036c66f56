//! The server's names: every absolute URL that names this server, so that
//! an absolute `kn_to`, `kn_from`, `kn_status_to` or route destination
//! starting with one of them is a local topic (PROTOCOL.md 6: the
//! original "remembered every URL it was reached by", this server keeps a
//! bounded list).
//!
//! Where names come from, and how long they stay (`.names`, FORMAT.md
//! "`.heartbeat`, `.names`, temporaries"):
//!
//! * the configured `KN_SERVER_URL` (never written to the file);
//! * **pinned** names: `kn names add`, the legacy import, and any line
//!   of an older `.names` (a bare URL): kept until removed by hand;
//! * **server** names: what `pubsub-cgi serve` listens on and its
//!   `--public-url`, recorded at its start under its host's name, and
//!   replaced by that host's next start;
//! * **learned** names: the URL each request reached the server by (the
//!   host of its `Host` with the port it arrived on, and the web server's
//!   own name and port), when that host is this machine (a loopback or
//!   interface address, `localhost`, its host name; no DNS), or, once, the
//!   first name of a store that has no name from elsewhere yet. At most
//!   [`Config::max_names`] of them: a new one pushes out the one least
//!   recently seen, and one unseen for [`NAME_TTL_SECS`] is dropped. A
//!   stranger sending random `Host` headers thus moves the learned set
//!   around but never grows it, and cannot make a peer elsewhere local.
//!
//! On top of the list, an absolute URL whose host is this machine
//! (`localhost`, a loopback address, an address of one of its interfaces,
//! its host name) and whose port and script path are those of one of its
//! names is this server too ([`Store::resolve`]): a route made through
//! `http://127.0.0.1:8080/kn` is delivered locally by a tool that only
//! knows `http://localhost:8080/kn`, never poisoned as remote.

use std::fs;
use std::io::ErrorKind as IoKind;
use std::net::IpAddr;
use std::path::Path;
use std::sync::OnceLock;

use crate::error::{Error, ErrorKind, Result};
use crate::ids::now;
use crate::log;

use super::Store;

pub(super) const NAMES_FILE: &str = ".names";

/// A learned or server name not seen for this long (30 days) is dropped
/// at the next change of `.names`.
pub const NAME_TTL_SECS: u64 = 30 * 24 * 3600;

/// A known learned name is written again (its time of last use) at most
/// this often, so that requests by a known name write nothing.
const REFRESH_SECS: u64 = 600;

/// How a name came to be known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameKind {
    /// Added by an administrator or imported: kept until removed.
    Pinned,
    /// What a `serve` process on host `.0` listens on.
    Server(String),
    /// A URL a request reached the server by.
    Learned,
}

/// One of the store's names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerName {
    /// The absolute URL of the script, e.g. `http://127.0.0.1:8080/kn`.
    pub url: String,
    /// Where it came from.
    pub kind: NameKind,
    /// When it was last seen (seconds since the epoch; 0 for pinned ones).
    pub seen: u64,
}

impl ServerName {
    fn line(&self) -> String {
        match &self.kind {
            NameKind::Pinned => format!("{}\n", self.url),
            NameKind::Learned => format!("{}\tlearned\t{}\n", self.url, self.seen),
            NameKind::Server(host) => format!("{}\tserve:{}\t{}\n", self.url, host, self.seen),
        }
    }

    fn parse(line: &str) -> Option<ServerName> {
        let mut fields = line.split('\t').map(str::trim);
        let url = fields.next().filter(|u| !u.is_empty())?.to_string();
        let kind = match fields.next() {
            None => return Some(ServerName { url, kind: NameKind::Pinned, seen: 0 }),
            Some("learned") => NameKind::Learned,
            Some(k) => NameKind::Server(k.strip_prefix("serve:")?.to_string()),
        };
        let seen = fields.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        Some(ServerName { url, kind, seen })
    }
}

impl Store {
    /// This server's URL: the configured one, else the first pinned name,
    /// else a name a `serve` recorded, else the learned name seen last,
    /// else `http://localhost/kn`.
    pub fn server_url(&self) -> String {
        // Per post along routes (`kn_routed_from`): the first name only,
        // without listing the others.
        if let Some(url) = &self.config.server_url {
            return url.clone();
        }
        let names = self.names.read().ok();
        let first = names.as_deref().and_then(|n| n.iter().min_by_key(|n| order_key(n)).map(|n| n.url.clone()));
        first.unwrap_or_else(|| "http://localhost/kn".to_string())
    }

    /// Every URL this store knows itself by, in [`Store::server_url`]'s
    /// order: the configured one, pinned names, `serve`'s, learned ones
    /// (the most recently seen first).
    pub fn server_names(&self) -> Vec<String> {
        let names = self.names.read().map(|n| n.clone()).unwrap_or_default();
        let mut out: Vec<String> = self.config.server_url.iter().cloned().collect();
        for name in ordered(&names) {
            if !out.contains(&name.url) {
                out.push(name.url.clone());
            }
        }
        if out.is_empty() {
            out.push("http://localhost/kn".to_string());
        }
        out
    }

    /// Every name in `.names`, with where it came from and when it was
    /// last seen (for `kn names` and `kn verify`).
    pub fn server_name_entries(&self) -> Vec<ServerName> {
        let names = self.names.read().map(|n| n.clone()).unwrap_or_default();
        ordered(&names).cloned().collect()
    }

    /// Records that the server is reachable at `url` (a pinned name, kept
    /// in `.names` until removed), so absolute URLs starting with it name
    /// local topics. For an administrator (`kn names add`) and the legacy
    /// import. `url` must be an absolute `http(s)://` URL without spaces
    /// or control bytes (400 otherwise).
    pub fn add_server_name(&self, url: &str) -> Result<()> {
        check_server_name(url)?;
        self.change_names(|names| {
            if let Some(n) = names.iter_mut().find(|n| n.url == url) {
                let changed = n.kind != NameKind::Pinned;
                n.kind = NameKind::Pinned;
                n.seen = 0;
                return changed;
            }
            names.push(ServerName { url: url.to_string(), kind: NameKind::Pinned, seen: 0 });
            true
        })?;
        Ok(())
    }

    /// Forgets the name `url` (removes its line from `.names`); true when
    /// it was there. The configured `server_url` is not in `.names` and
    /// stays this server's name.
    pub fn remove_server_name(&self, url: &str) -> Result<bool> {
        self.change_names(|names| {
            let before = names.len();
            names.retain(|x| x.url != url);
            names.len() != before
        })
    }

    /// True when every URL of `urls` is already known and was seen
    /// recently enough that [`Store::learn_names`] would write nothing:
    /// a request by these names may be answered without touching
    /// `.names`.
    pub fn knows_names<S: AsRef<str>>(&self, urls: &[S]) -> bool {
        let t = now() as u64;
        let Ok(names) = self.names.read() else { return false };
        urls.iter().all(|u| {
            let u = u.as_ref();
            self.config.server_url.as_deref() == Some(u) || names.iter().any(|n| n.url == u && fresh(n, t))
        })
    }

    /// Learns the URLs a request reached the server by (see the module
    /// documentation): each becomes a local name, or has its time of last
    /// use refreshed. Writes `.names` only when something changes (a new
    /// name, or a refresh due every few minutes), keeps at most
    /// [`Config::max_names`](crate::Config::max_names) learned names
    /// (pushing out the least recently seen) and drops learned names
    /// unseen for [`NAME_TTL_SECS`]. URLs that are no usable name are
    /// ignored.
    ///
    /// ```
    /// use kn_journal::Store;
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// store.learn_names(&["http://127.0.0.1/kn"]).unwrap();
    /// store.learn_names(&["http://127.0.0.1:8080/kn"]).unwrap();
    /// // Both are names: a port-less Host never hides the real one.
    /// assert!(store.server_names().contains(&"http://127.0.0.1:8080/kn".to_string()));
    /// assert!(store.server_names().contains(&"http://127.0.0.1/kn".to_string()));
    /// ```
    pub fn learn_names<S: AsRef<str>>(&self, urls: &[S]) -> Result<()> {
        if self.knows_names(urls) {
            return Ok(());
        }
        let max = self.config.max_names;
        let t = now() as u64;
        let wanted: Vec<&str> = urls.iter().map(AsRef::as_ref).filter(|u| check_server_name(u).is_ok()).collect();
        if wanted.is_empty() {
            return Ok(());
        }
        self.change_names(|names| {
            let mut changed = expire(names, t);
            for url in &wanted {
                if self.config.server_url.as_deref() == Some(*url) {
                    continue;
                }
                let admit = max > 0 && self.may_learn(names, url);
                match names.iter_mut().find(|n| n.url == *url) {
                    Some(n) if fresh(n, t) => {}
                    Some(n) => {
                        n.seen = t;
                        changed = true;
                    }
                    None if !admit => {}
                    None => {
                        // A name from elsewhere is taken once, and kept:
                        // pushed out, it would let the next `Host` in.
                        let here = Url::parse(url).is_some_and(|u| is_this_machine(u.host));
                        let (kind, seen) = if here { (NameKind::Learned, t) } else { (NameKind::Pinned, 0) };
                        names.push(ServerName { url: url.to_string(), kind, seen });
                        changed = true;
                    }
                }
            }
            // At most `max` learned names: the least recently seen go
            // (among equal times the earlier line, added earlier).
            let mut learned: Vec<usize> = (0..names.len()).filter(|&i| names[i].kind == NameKind::Learned).collect();
            if learned.len() > max {
                learned.sort_by(|&a, &b| names[b].seen.cmp(&names[a].seen).then(b.cmp(&a)));
                let mut dropped = vec![false; names.len()];
                learned[max..].iter().for_each(|&i| dropped[i] = true);
                let mut i = 0;
                names.retain(|_| {
                    i += 1;
                    !dropped[i - 1]
                });
                changed = true;
            }
            changed
        })?;
        Ok(())
    }

    /// Whether `url`, a URL a request reached the server by that is no
    /// name yet, may become one: its host is this machine (a loopback
    /// address, an address of its interfaces, `localhost`, its host name:
    /// a `Host` naming a peer elsewhere cannot make the peer's URLs local),
    /// or the store has no name naming it from elsewhere yet (no
    /// `KN_SERVER_URL`, no pinned name, no `serve` or learned name of
    /// another host), so that a fresh install reached by its public name
    /// takes that name, once.
    fn may_learn(&self, names: &[ServerName], url: &str) -> bool {
        let here = |u: &str| Url::parse(u).is_some_and(|u| is_this_machine(u.host));
        here(url) || (self.config.server_url.is_none() && names.iter().all(|n| n.kind != NameKind::Pinned && here(&n.url)))
    }

    /// Records the URLs a `serve` process on host `host` is reachable at
    /// (its listen address, `--public-url`), replacing those its host
    /// recorded before, so that the tools on its store (`kn-post`,
    /// `kn-mail`, `kn`) take the routes clients made through it for local
    /// ones. `serve` calls it at its start and then every few minutes.
    pub fn record_server_names<S: AsRef<str>>(&self, host: &str, urls: &[S]) -> Result<()> {
        let t = now() as u64;
        let host: String = host.chars().filter(|c| !c.is_whitespace() && !c.is_control()).collect();
        let urls: Vec<&str> = urls.iter().map(AsRef::as_ref).filter(|u| check_server_name(u).is_ok()).collect();
        self.change_names(|names| {
            expire(names, t);
            names.retain(|n| !matches!(&n.kind, NameKind::Server(h) if *h == host));
            for url in &urls {
                match names.iter_mut().find(|n| n.url == *url) {
                    Some(n) if n.kind == NameKind::Pinned => {}
                    Some(n) => {
                        n.kind = NameKind::Server(host.clone());
                        n.seen = t;
                    }
                    None => names.push(ServerName { url: url.to_string(), kind: NameKind::Server(host.clone()), seen: t }),
                }
            }
            true
        })?;
        Ok(())
    }

    /// Applies `change` to `.names` under the store's lock, rewriting the
    /// file (a temporary renamed over it) when `change` says it changed
    /// something; then refreshes this store's names. Returns what
    /// `change` returned.
    pub(super) fn change_names(&self, change: impl FnOnce(&mut Vec<ServerName>) -> bool) -> Result<bool> {
        let lock_path = self.config.root.join(log::LOCK_FILE);
        let lock = log::open_shared(&lock_path, false).map_err(|e| Error::io("cannot open lock file", &lock_path, e))?;
        crate::shared::lock(&lock, crate::shared::LockKind::Exclusive, &self.config).map_err(|e| Error::io("cannot lock", &lock_path, e))?;
        let mut names = read_names(&self.config.root)?;
        let changed = change(&mut names);
        if changed {
            write_names(&self.config.root, &names)?;
        }
        if let Ok(mut n) = self.names.write() {
            *n = names;
        }
        // Kept routes were resolved with the old names.
        if let Ok(mut kept) = self.kept.lock() {
            kept.topics.values_mut().flatten().for_each(|k| k.routes = None);
        }
        Ok(changed)
    }

    /// The local topic path named by absolute URL `text` through one of
    /// this server's names, or through an alias of one (the same port and
    /// script path on a host name or address of this machine): the rest
    /// of the URL after the script, from its `/` on.
    pub(super) fn local_path<'a>(&self, text: &'a str) -> Option<&'a str> {
        let names = self.names.read().ok()?;
        // Without a configured name, the default one (`Store::server_url`
        // of a store with no name): the URLs a tool wrote before the store
        // had a name start with it.
        let default = self.config.server_url.is_none().then_some("http://localhost/kn");
        let configured = self.config.server_url.iter().map(String::as_str).chain(default).map(|u| (u, false));
        let all = configured.chain(ordered(&names).map(|n| (n.url.as_str(), n.kind == NameKind::Learned)));
        let mut aliasable = Vec::new();
        for (own, learned) in all {
            if let Some(rest) = strip_prefix_ignore_case(text, own) {
                if rest.starts_with('/') {
                    return Some(rest);
                }
            }
            aliasable.push((own, learned));
        }
        let target = Url::parse(text)?;
        if !is_this_machine(target.host) {
            return None;
        }
        for (own, learned) in aliasable {
            let Some(name) = Url::parse(own) else { continue };
            // A name learned from a `Host` without a port (an HTTP/1.0
            // client's) says nothing of the port the request came in on:
            // under CGI the web server then reports its default port
            // (Apache, `UseCanonicalName Off`), as it reports the port of
            // any `Host` that has one, so believing any port of this
            // machine here believes no more than a `Host` already may.
            let same_port = name.port == target.port || (learned && !name.explicit_port);
            if name.scheme.eq_ignore_ascii_case(target.scheme) && same_port && is_this_machine(name.host) {
                if let Some(rest) = target.path.strip_prefix(name.path) {
                    if rest.starts_with('/') {
                        // `rest` lies inside `text`: from it on, query and all.
                        let start = rest.as_ptr() as usize - text.as_ptr() as usize;
                        return Some(&text[start..]);
                    }
                }
            }
        }
        None
    }
}

/// The names in the order [`Store::server_names`] gives them.
fn ordered(names: &[ServerName]) -> impl Iterator<Item = &ServerName> {
    let mut sorted: Vec<&ServerName> = names.iter().collect();
    // Stable: pinned names keep their file order.
    sorted.sort_by_key(|n| order_key(n));
    sorted.into_iter()
}

/// Where a name stands in [`ordered`]: pinned names first (in file order:
/// their `seen` is 0), then `serve`'s, then learned ones, the most
/// recently seen first within each kind.
fn order_key(name: &ServerName) -> (u8, std::cmp::Reverse<u64>) {
    let rank = match name.kind {
        NameKind::Pinned => 0,
        NameKind::Server(_) => 1,
        NameKind::Learned => 2,
    };
    (rank, std::cmp::Reverse(name.seen))
}

/// A name that a request by it need not write again.
fn fresh(name: &ServerName, t: u64) -> bool {
    match name.kind {
        NameKind::Learned => t.saturating_sub(name.seen) < REFRESH_SECS,
        _ => true,
    }
}

/// Drops learned and server names unseen for [`NAME_TTL_SECS`]; true when
/// one was dropped.
fn expire(names: &mut Vec<ServerName>, t: u64) -> bool {
    let before = names.len();
    names.retain(|n| n.kind == NameKind::Pinned || t.saturating_sub(n.seen) < NAME_TTL_SECS);
    names.len() != before
}

fn strip_prefix_ignore_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    // The scheme and host are case-insensitive; the path is compared as is.
    let head = text.get(..prefix.len())?;
    let authority_end = prefix.find("://").map(|i| i + 3).and_then(|s| prefix[s..].find('/').map(|p| s + p)).unwrap_or(prefix.len());
    (head[..authority_end].eq_ignore_ascii_case(&prefix[..authority_end]) && head[authority_end..] == prefix[authority_end..])
        .then(|| &text[prefix.len()..])
}

/// The parts of an absolute `http(s)` URL that say which server it names.
struct Url<'a> {
    scheme: &'a str,
    host: &'a str,
    port: u16,
    /// The port was written in the URL.
    explicit_port: bool,
    path: &'a str,
}

impl<'a> Url<'a> {
    fn parse(text: &'a str) -> Option<Url<'a>> {
        let (scheme, rest) = text.split_once("://")?;
        let default = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let path = path.split(['?', '#']).next().unwrap_or("");
        let authority = authority.rsplit('@').next()?;
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        let explicit_port = port.is_some_and(|p| !p.is_empty());
        let port = match port {
            Some("") | None => default,
            Some(p) => p.parse().ok()?,
        };
        Some(Url { scheme, host, port, explicit_port, path })
    }
}

/// True when `host` (a URL's host: a name or an address) is this machine:
/// `localhost`, a loopback or unspecified address, an address of one of
/// its interfaces, or its host name. No name is looked up in DNS.
fn is_this_machine(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback() || ip.is_unspecified() || local_addresses().contains(&ip);
    }
    let own = own_host_name();
    !own.is_empty() && (host.eq_ignore_ascii_case(own) || own.split('.').next().is_some_and(|short| host.eq_ignore_ascii_case(short)))
}

/// The addresses of this machine's interfaces (read once per process).
fn local_addresses() -> &'static [IpAddr] {
    static ADDRESSES: OnceLock<Vec<IpAddr>> = OnceLock::new();
    ADDRESSES.get_or_init(|| {
        let mut out = Vec::new();
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `list` with a linked list that we only
        // read, then free with freeifaddrs.
        unsafe {
            if libc::getifaddrs(&mut list) != 0 {
                return out;
            }
            let mut at = list;
            while !at.is_null() {
                let addr = (*at).ifa_addr;
                if !addr.is_null() {
                    match i32::from((*addr).sa_family) {
                        libc::AF_INET => {
                            let sin = &*(addr as *const libc::sockaddr_in);
                            out.push(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()));
                        }
                        libc::AF_INET6 => {
                            let sin6 = &*(addr as *const libc::sockaddr_in6);
                            out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                        }
                        _ => {}
                    }
                }
                at = (*at).ifa_next;
            }
            libc::freeifaddrs(list);
        }
        out
    })
}

/// This machine's host name (`gethostname`), read once per process.
pub fn own_host_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most `buf.len()` bytes into buf.
        let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
        if !ok {
            return String::new();
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    })
}

/// A server name must be an absolute `http(s)://` URL of one line with
/// no spaces: `.names` holds one per line.
pub(super) fn check_server_name(url: &str) -> Result<()> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    let absolute = lower.starts_with("http://") || lower.starts_with("https://");
    if !absolute || url.len() <= "https://".len() || url.len() > 1024 || url.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err(Error::new(
            ErrorKind::BadRequest,
            format!("bad server name '{}': expected an absolute http:// or https:// URL without spaces", url.escape_debug()),
        ));
    }
    Ok(())
}

/// Replaces `.names` by `names`, one per line (a temporary renamed over
/// it, so a reader sees the old list or the new, never half of one).
fn write_names(root: &Path, names: &[ServerName]) -> Result<()> {
    let path = root.join(NAMES_FILE);
    let temp = root.join(format!("{NAMES_FILE}.tmp.{}", std::process::id()));
    let text: String = names.iter().map(ServerName::line).collect();
    log::write_replacing(&temp, &path, text.as_bytes()).map_err(|e| Error::io("cannot write", &path, e))
}

pub(super) fn read_names(root: &Path) -> Result<Vec<ServerName>> {
    let path = root.join(NAMES_FILE);
    match fs::read_to_string(&path) {
        Ok(text) => Ok(text.lines().filter_map(ServerName::parse).collect()),
        Err(e) if e.kind() == IoKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io("cannot read", &path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_old_lines_are_pinned() {
        for name in [
            ServerName { url: "http://a/kn".into(), kind: NameKind::Pinned, seen: 0 },
            ServerName { url: "http://b:81/kn".into(), kind: NameKind::Learned, seen: 42 },
            ServerName { url: "http://c/kn".into(), kind: NameKind::Server("host1".into()), seen: 7 },
        ] {
            assert_eq!(ServerName::parse(name.line().trim_end()), Some(name));
        }
    }

    #[test]
    fn urls_are_split_into_what_names_a_server() {
        let u = Url::parse("http://[::1]:8080/kn/what?x#y").unwrap();
        assert_eq!((u.host, u.port, u.path), ("::1", 8080, "/kn/what"));
        let u = Url::parse("https://Example.org/kn").unwrap();
        assert_eq!((u.host, u.port, u.path), ("Example.org", 443, "/kn"));
        assert!(Url::parse("ftp://x/kn").is_none());
        assert!(Url::parse("http://x:99999/kn").is_none());
    }

    #[test]
    fn this_machine_is_known_by_loopback_and_localhost_only_without_dns() {
        assert!(is_this_machine("localhost"));
        assert!(is_this_machine("127.0.0.1"));
        assert!(is_this_machine("::1"));
        assert!(!is_this_machine("192.0.2.1"));
        assert!(!is_this_machine("example.org"));
    }
}
