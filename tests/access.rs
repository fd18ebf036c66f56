//! Access control in real deployments (docs/ACCESS.md): the web server
//! authenticates, knpubsub authorises.
//!
//! * Apache with `mod_auth_basic` and an htpasswd file, anonymous requests
//!   let through (the `<If "-z req('Authorization')">` idiom), running
//!   `pubsub.cgi`: the CGI sees `REMOTE_USER`.
//! * lighttpd with `mod_auth` (every request logged in).
//! * `pubsub-cgi serve --trusted-proxy` behind Apache's `mod_proxy`, which
//!   authenticates and passes the user in `X-Remote-User`.
//!
//! Users in two groups (an Apache group file the rules file reads): anna
//! and bob are staff, dora is ops; carl is in none. Each test skips (with
//! a message) when its server or `htpasswd` is not installed, except
//! under `CI`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::http::Stream;
use support::{Apache, Dir, Lighttpd, Serve};

const HTPASSWD: &str = "/usr/bin/htpasswd";

const RULES: &str = "\
groupfile groups
allow all          /who/{user}/**     users
allow read,route   /who/anonymous/**  anonymous
allow post,read    /what/staff/**     @staff
allow read         /what/ops/**       @ops @staff
allow post         /what/ops/**       @ops
allow read         /what/public/**    *
";

const USERS: [(&str, &str); 4] = [("anna", "anna-pw"), ("bob", "bob-pw"), ("carl", "carl-pw"), ("dora", "dora-pw")];

/// The rules, the group file and an htpasswd file (bcrypt, which Apache,
/// lighttpd and `serve` all check), readable by the web server's user.
struct Files {
    dir: Dir,
    store: PathBuf,
}

impl Files {
    fn new(name: &str) -> Option<Files> {
        if !support::available(HTPASSWD) {
            return None;
        }
        let dir = Dir::new(name);
        dir.create("access.rules", RULES);
        dir.create("groups", "staff: anna bob\nops: dora\n");
        let users = dir.join("users");
        for (i, (user, password)) in USERS.iter().enumerate() {
            let mut command = Command::new(HTPASSWD);
            command.arg(if i == 0 { "-cbB" } else { "-bB" }).arg(&users).arg(user).arg(password);
            assert!(command.stderr(Stdio::null()).status().unwrap().success(), "htpasswd failed");
        }
        std::fs::set_permissions(&users, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        let store = dir.store("kn_events");
        Some(Files { dir, store })
    }

    fn rules(&self) -> PathBuf {
        self.dir.join("access.rules")
    }

    fn users(&self) -> PathBuf {
        self.dir.join("users")
    }

    /// Apache's Basic authentication over `/kn`, asking only requests
    /// that bring credentials for them: the others go on anonymous.
    fn apache_auth(&self, inside: &str) -> String {
        let m = support::APACHE_MODULES;
        format!(
            "LoadModule auth_basic_module {m}/mod_auth_basic.so\n\
             LoadModule authn_core_module {m}/mod_authn_core.so\n\
             LoadModule authn_file_module {m}/mod_authn_file.so\n\
             LoadModule authz_user_module {m}/mod_authz_user.so\n\
             <Location /kn>\n\
             AuthType Basic\n\
             AuthName knpubsub\n\
             AuthBasicProvider file\n\
             AuthUserFile {users}\n\
             <If \"-z req('Authorization')\">\n\
             Require all granted\n\
             </If>\n\
             <Else>\n\
             Require valid-user\n\
             </Else>\n\
             {inside}\n\
             </Location>\n",
            users = self.users().display(),
        )
    }
}

/// One answer: status code, head, body.
#[derive(Debug)]
struct Answer {
    code: u16,
    head: String,
    body: String,
}

/// A GET of `url?query` with `user`'s Basic credentials (or none) and
/// `extra` header lines.
fn get(url: &str, query: &str, user: Option<(&str, &str)>, extra: &str) -> Answer {
    use base64::Engine as _;
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let auth = user
        .map(|(u, p)| format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))))
        .unwrap_or_default();
    let request = format!("GET /{path}?{query} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{auth}{extra}\r\n");
    let mut stream = Stream::send(url, request.as_bytes());
    stream.read_to_end(Duration::from_secs(10));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Answer { code: stream.status().unwrap_or(0), head: text(stream.head()), body: text(stream.body()) }
}

fn pw(user: &str) -> Option<(&'static str, &'static str)> {
    USERS.iter().find(|(u, _)| *u == user).copied()
}

fn notify(url: &str, user: Option<&str>, topic: &str, id: &str) -> Answer {
    get(url, &format!("do_method=notify&kn_to={topic}&kn_payload=x&kn_id={id}&kn_response_format=simple"), user.and_then(pw), "")
}

fn tunnel(url: &str, user: Option<&str>, topic: &str) -> Answer {
    get(url, &format!("kn_from={topic}&kn_expires=%2B0&kn_response_format=simple"), user.and_then(pw), "")
}

/// What logged-in users may and may not do, whoever authenticates them.
fn users_get_their_groups_rights(url: &str) {
    let a = notify(url, Some("anna"), "/what/staff/x", "s1");
    assert_eq!(a.code, 200, "{a:?}");
    let a = notify(url, Some("dora"), "/what/staff/x", "s2");
    assert_eq!(a.code, 403, "{a:?}");
    assert!(a.body.contains("user 'dora' may not post to '/what/staff/x'"), "{a:?}");
    let a = notify(url, Some("dora"), "/what/ops/x", "o1");
    assert_eq!(a.code, 200, "{a:?}");
    let a = notify(url, Some("anna"), "/what/ops/x", "o2");
    assert_eq!(a.code, 403, "{a:?}");
    let a = tunnel(url, Some("bob"), "/what/ops/x");
    assert_eq!(a.code, 200, "{a:?}");
    let a = tunnel(url, Some("carl"), "/what/ops/x");
    assert_eq!(a.code, 403, "{a:?}");
    let a = notify(url, Some("carl"), "/who/carl/notes", "c1");
    assert_eq!(a.code, 200, "{a:?}");
    let a = notify(url, Some("carl"), "/who/anna/notes", "c2");
    assert_eq!(a.code, 403, "{a:?}");
    let who = get(url, "do_method=whoami", pw("anna"), "");
    assert!(who.body.contains("window.kn_userid = 'anna'"), "{who:?}");
    // A wrong password never reaches knpubsub: the web server says 401.
    let a = get(url, "do_method=notify&kn_to=/what/staff/x&kn_payload=x", Some(("anna", "wrong")), "");
    assert_eq!(a.code, 401, "{a:?}");
}

/// Anonymous requests: read what everyone may read, and for the rest a
/// 401 with a challenge that reaches the browser.
fn anonymous_gets_a_challenge(url: &str) {
    let a = tunnel(url, None, "/what/public/news");
    assert_eq!(a.code, 200, "{a:?}");
    let a = notify(url, None, "/what/staff/x", "a1");
    assert_eq!(a.code, 401, "{a:?}");
    assert!(a.head.to_ascii_lowercase().contains("www-authenticate: basic realm=\"knpubsub\""), "{a:?}");
    assert!(a.body.contains("anonymous may not post to '/what/staff/x'"), "{a:?}");
    let who = get(url, "do_method=whoami", None, "");
    assert!(who.body.contains("window.kn_userid = 'anonymous'"), "{who:?}");
}

#[test]
fn apache_basic_auth_sets_remote_user_and_the_cgi_applies_the_rules() {
    if !support::available(support::APACHE) {
        return;
    }
    let Some(f) = Files::new("access_apache") else { return };
    let conf = format!("SetEnv KN_ACCESS_RULES {}\n{}", f.rules().display(), f.apache_auth(""));
    let apache = Apache::start(&support::pubsub_cgi(), &f.store, &conf);
    users_get_their_groups_rights(&apache.url());
    anonymous_gets_a_challenge(&apache.url());
}

/// A tunnel through Apache and pubsub.cgi, open while bob leaves the
/// staff (in the group file the rules read): it ends with `403` at its
/// next delivery instead of delivering it.
#[test]
fn apache_cgi_tunnel_ends_with_403_once_its_reader_left_the_group() {
    if !support::available(support::APACHE) {
        return;
    }
    let Some(f) = Files::new("access_apache_tunnel") else { return };
    let conf = format!("SetEnv KN_ACCESS_RULES {}\n{}", f.rules().display(), f.apache_auth(""));
    let apache = Apache::start(&support::pubsub_cgi(), &f.store, &conf);
    let url = apache.url();
    use base64::Engine as _;
    let (addr, path) = url.strip_prefix("http://").unwrap().split_once('/').unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode("bob:bob-pw");
    let request = format!("GET /{path}/what/staff/plans?kn_response_format=simple HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Basic {auth}\r\n\r\n");
    let mut tunnel = Stream::send(&url, request.as_bytes());
    assert!(tunnel.read_until(b"Watching topic", Duration::from_secs(10)), "{}", tunnel.text());
    let post = |id: &str, payload: &str| {
        let query = format!("do_method=notify&kn_to=/what/staff/plans&kn_payload={payload}&kn_id={id}&kn_response_format=simple");
        let a = get(&url, &query, pw("anna"), "");
        assert_eq!(a.code, 200, "{a:?}");
    };
    post("e1", "before-the-change");
    assert!(tunnel.read_until(b"before-the-change", Duration::from_secs(10)), "{}", tunnel.text());
    std::fs::write(f.dir.join("groups"), "staff: anna\nops: dora\n").unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    post("e2", "after-the-change");
    assert!(tunnel.read_until(b"403 Forbidden", Duration::from_secs(10)), "{}", tunnel.text());
    assert!(tunnel.read_to_end(Duration::from_secs(10)), "the tunnel ends: {}", tunnel.text());
    let text = tunnel.text();
    assert!(!text.contains("after-the-change") && text.contains("user 'bob' may not read '/what/staff/plans'"), "{text}");
}

#[test]
fn lighttpd_mod_auth_sets_remote_user_and_the_cgi_applies_the_rules() {
    if !support::available(support::LIGHTTPD) {
        return;
    }
    let Some(f) = Files::new("access_lighttpd") else { return };
    let conf = format!(
        "server.modules += (\"mod_auth\", \"mod_authn_file\")\n\
         auth.backend = \"htpasswd\"\n\
         auth.backend.htpasswd.userfile = \"{users}\"\n\
         auth.require = ( \"/kn\" => ( \"method\" => \"basic\", \"realm\" => \"knpubsub\", \"require\" => \"valid-user\" ) )\n\
         setenv.add-environment += ( \"KN_ACCESS_RULES\" => \"{rules}\" )\n",
        users = f.users().display(),
        rules = f.rules().display(),
    );
    let lighttpd = Lighttpd::start(&support::pubsub_cgi(), &f.store, &conf);
    users_get_their_groups_rights(&lighttpd.url());
    // Everyone must log in here: lighttpd itself challenges.
    let a = notify(&lighttpd.url(), None, "/what/public/x", "l1");
    assert_eq!(a.code, 401, "{a:?}");
}

#[test]
fn serve_behind_apache_mod_proxy_takes_the_user_apache_authenticated() {
    if !support::available(support::APACHE) {
        return;
    }
    let Some(f) = Files::new("access_proxy") else { return };
    let mut command = Serve::command(&f.store, None);
    command.args(["--trusted-proxy", "127.0.0.1", "--user-header", "X-Remote-User"]).env("KN_ACCESS_RULES", f.rules());
    let serve = Serve::spawn(command);
    // Whatever the client sent in X-Remote-User is dropped; Apache names
    // the user it authenticated, if any.
    let inside = "RequestHeader unset X-Remote-User\n\
                  RequestHeader set X-Remote-User \"expr=%{REMOTE_USER}\" \"expr=-n %{REMOTE_USER}\"";
    let apache = Apache::start_proxy(&serve.url(), &f.apache_auth(inside));
    users_get_their_groups_rights(&apache.url());
    anonymous_gets_a_challenge(&apache.url());
    // A client naming itself in the header gets nothing for it.
    let a = get(&apache.url(), "do_method=notify&kn_to=/what/staff/x&kn_payload=x&kn_response_format=simple", None, "X-Remote-User: anna\r\n");
    assert_eq!(a.code, 401, "{a:?}");
}
