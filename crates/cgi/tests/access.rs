//! Access control through the real `pubsub-cgi` (docs/ACCESS.md): every
//! operation allowed and refused, as a CGI process (the user in
//! `REMOTE_USER`) and under `serve` (the user in a trusted proxy's header,
//! or Basic credentials checked against an htpasswd file); and the
//! attacks: a forged proxy header, a route to read a forbidden topic, a
//! batch mixing allowed and refused parts, `kn_status_to` into someone
//! else's journal.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kn_journal::{Selection, Store, Topic};
use kn_test_support::http::Stream;
use kn_test_support::{run_with_stdin, Dir, Serve};

const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");

const RULES: &str = "\
# Staff post and read the staff topics; everyone reads, users post, the
# public ones; each user owns /who/<user>/.
group staff: anna bob
allow all            /who/{user}/**    users
allow read,route     /who/anonymous/** anonymous
allow post,read      /what/staff/**    @staff
allow read           /what/public/**   *
allow post           /what/public/**   users
";

/// One answer: the HTTP status code, the headers and the body.
#[derive(Debug)]
struct Answer {
    code: u16,
    head: String,
    body: String,
}

impl Answer {
    /// The codes of the status events in a `simple` body, in order.
    fn statuses(&self) -> Vec<u16> {
        self.body.lines().filter_map(|l| l.strip_prefix("status: ")).filter_map(|s| s.get(..3)?.parse().ok()).collect()
    }
}

/// A server over a store with the rules above: a CGI process per request,
/// or one `serve`.
trait Server {
    fn ask(&self, user: Option<&str>, query: &str) -> Answer;
    fn root(&self) -> &Path;
}

struct Site {
    dir: Dir,
}

impl Site {
    fn new(name: &str) -> Site {
        let dir = Dir::new(name);
        dir.create("access.rules", RULES);
        Site { dir }
    }

    fn rules(&self) -> PathBuf {
        self.dir.join("access.rules")
    }

    fn root(&self) -> PathBuf {
        self.dir.join("kn_events")
    }
}

struct Cgi(Site, &'static str);

impl Cgi {
    /// A CGI whose `do_method=replay` starts `/bin/true`.
    fn new(name: &str) -> Cgi {
        Cgi(Site::new(name), "/bin/true")
    }
}

impl Server for Cgi {
    fn ask(&self, user: Option<&str>, query: &str) -> Answer {
        let mut command = Command::new(BIN);
        command
            .env_clear()
            .env("GATEWAY_INTERFACE", "CGI/1.1")
            .env("REQUEST_METHOD", "GET")
            .env("QUERY_STRING", query)
            .env("SCRIPT_NAME", "/kn")
            .env("SERVER_NAME", "127.0.0.1")
            .env("SERVER_PORT", "8080")
            .env("KN_EVENTS", self.0.root())
            .env("KN_ACCESS_RULES", self.0.rules())
            .env("KN_REPLAY", self.1)
            .stdout(Stdio::piped());
        if let Some(user) = user {
            command.env("REMOTE_USER", user);
        }
        let output = run_with_stdin(&mut command, b"", Duration::from_secs(20));
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head.lines().find_map(|l| l.strip_prefix("Status: ")).and_then(|s| s.get(..3)?.parse().ok()).unwrap_or(200);
        Answer { code, head: head.to_string(), body: body.to_string() }
    }

    fn root(&self) -> &Path {
        self.0.dir.path()
    }
}

/// `serve` trusting `proxy` to name the user in `X-Remote-User`.
struct Served {
    site: Site,
    serve: Serve,
}

impl Served {
    fn start(name: &str, extra: &[&str]) -> Served {
        let site = Site::new(name);
        let mut command = Serve::command_of(Path::new(BIN), &site.root(), None);
        command.args(extra).env("KN_ACCESS_RULES", site.rules()).env("KN_REPLAY", "/bin/true");
        let serve = Serve::spawn(command);
        Served { site, serve }
    }

    fn request(&self, query: &str, headers: &str) -> Answer {
        let request = format!("GET /kn?{query} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{headers}\r\n", self.serve.addr());
        let mut stream = Stream::send(&format!("http://{}/kn", self.serve.addr()), request.as_bytes());
        stream.read_to_end(Duration::from_secs(5));
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Answer { code: stream.status().unwrap_or(0), head: text(stream.head()), body: text(stream.body()) }
    }
}

impl Server for Served {
    fn ask(&self, user: Option<&str>, query: &str) -> Answer {
        let header = user.map(|u| format!("X-Remote-User: {u}\r\n")).unwrap_or_default();
        self.request(query, &header)
    }

    fn root(&self) -> &Path {
        self.site.dir.path()
    }
}

fn events(server: &dyn Server, topic: &str) -> Vec<String> {
    let store = Store::open(server.root().join("kn_events")).unwrap();
    let topic = Topic::parse(topic).unwrap();
    store.events(&topic, &Selection::all()).map(|s| s.events).unwrap_or_default().iter().map(|e| String::from_utf8_lossy(e.payload()).into_owned()).collect()
}

const SIMPLE: &str = "kn_response_format=simple";

/// Each operation, allowed and refused, on one server.
fn matrix(s: &dyn Server) {
    let ask = |user: Option<&str>, query: &str| {
        let answer = s.ask(user, &format!("{query}&{SIMPLE}"));
        (answer.code, answer)
    };
    // post
    let (code, a) = ask(Some("anna"), "do_method=notify&kn_to=/what/staff/x&kn_payload=plan&kn_id=e1");
    assert_eq!(code, 200, "{a:?}");
    let (code, a) = ask(Some("carl"), "do_method=notify&kn_to=/what/staff/x&kn_payload=no&kn_id=e2");
    assert_eq!(code, 403, "{a:?}");
    assert!(a.body.contains("user 'carl' may not post to '/what/staff/x': no rule allows it"), "{a:?}");
    let (code, a) = ask(None, "do_method=notify&kn_to=/what/staff/x&kn_payload=no&kn_id=e3");
    assert_eq!(code, 401, "{a:?}");
    assert!(a.head.contains("WWW-Authenticate: Basic realm=\"knpubsub\"") || a.head.contains("www-authenticate: Basic realm=\"knpubsub\""), "{a:?}");
    assert_eq!(events(s, "/what/staff/x"), ["plan"]);

    // read (a tunnel that ends at once)
    let (code, a) = ask(Some("bob"), "kn_from=/what/staff/x&kn_expires=%2B0");
    assert_eq!(code, 200, "{a:?}");
    assert!(a.body.contains("Watching topic"), "{a:?}");
    let (code, a) = ask(Some("carl"), "kn_from=/what/staff/x&kn_expires=%2B0");
    assert_eq!(code, 403, "{a:?}");
    assert!(!a.body.contains("plan"), "{a:?}");

    // route from (read) and route to
    let (code, a) = ask(Some("anna"), "do_method=route&kn_from=/what/staff/x&kn_to=/who/anna/inbox&kn_id=r1&do_max_n=5");
    assert_eq!(code, 200, "{a:?}");
    // The population follows the reply (issue 12): wait for it.
    kn_test_support::wait_for(Duration::from_secs(20), || !events(s, "/who/anna/inbox").is_empty());
    assert_eq!(events(s, "/who/anna/inbox"), ["plan"]);
    let (code, a) = ask(Some("carl"), "do_method=route&kn_from=/what/staff/x&kn_to=/who/carl/inbox&kn_id=r2&do_max_n=5");
    assert_eq!(code, 403, "{a:?}");
    let (code, a) = ask(Some("anna"), "do_method=route&kn_from=/what/public/x&kn_to=/who/carl/inbox&kn_id=r3");
    assert_eq!(code, 403, "{a:?}");
    assert!(a.body.contains("may not route to '/who/carl/inbox'"), "{a:?}");
    assert!(events(s, "/who/carl/inbox").is_empty());

    // delete a route
    let (code, a) = ask(Some("carl"), "do_method=route&kn_from=/what/staff/x&kn_to=&kn_id=r1");
    assert_eq!(code, 403, "{a:?}");
    let (code, a) = ask(Some("anna"), "do_method=route&kn_from=/what/staff/x&kn_to=&kn_id=r1");
    assert_eq!(code, 200, "{a:?}");

    // replay
    let (code, a) = ask(Some("anna"), "do_method=replay&kn_from=/who/anna/kn_journal");
    assert_eq!(code, 200, "{a:?}");
    let (code, a) = ask(Some("carl"), "do_method=replay&kn_from=/who/anna/kn_journal");
    assert_eq!(code, 403, "{a:?}");
}

/// A route cannot read what its creator cannot; a batch runs its allowed
/// parts only; `kn_status_to` cannot write into someone else's journal.
fn attacks(s: &dyn Server) {
    let ask = |user: Option<&str>, query: &str| s.ask(user, &format!("{query}&{SIMPLE}"));
    assert_eq!(ask(Some("anna"), "do_method=notify&kn_to=/what/staff/x&kn_payload=secret&kn_id=e1").code, 200);

    // A route out of a topic its creator may not read carries nothing.
    let a = ask(Some("carl"), "do_method=route&kn_from=/what/staff/x&kn_to=/what/public/leak&kn_id=r1&do_max_n=10");
    assert_eq!(a.code, 403, "{a:?}");
    assert!(events(s, "/what/public/leak").is_empty());

    // A batch: the allowed notify runs, the refused one does not.
    let batch = "do_method=batch&kn_batch=do_method%3Dnotify%3Bkn_to%3D%2Fwhat%2Fpublic%2Fy%3Bkn_payload%3Dok%3Bkn_id%3Db1\
                 &kn_batch=do_method%3Dnotify%3Bkn_to%3D%2Fwhat%2Fstaff%2Fx%3Bkn_payload%3Dforged%3Bkn_id%3Db2\
                 &kn_batch=do_method%3Droute%3Bkn_from%3D%2Fwhat%2Fstaff%2Fx%3Bkn_to%3D%2Fwho%2Fcarl%2Finbox%3Bkn_id%3Db3%3Bdo_max_n%3D9";
    let a = ask(Some("carl"), batch);
    assert_eq!(a.statuses(), [200, 200, 403, 403], "{a:?}");
    assert_eq!(events(s, "/what/public/y"), ["ok"]);
    assert_eq!(events(s, "/what/staff/x"), ["secret"]);
    assert!(events(s, "/who/carl/inbox").is_empty());

    // As the JavaScript client does: a batch whose statuses go to the
    // user's own journal.
    let own = "do_method=batch&kn_status_to=/who/carl/s/1/kn_journal\
               &kn_batch=do_method%3Droute%3Bkn_from%3D%2Fwhat%2Fpublic%2Fy%3Bkn_to%3D%2Fwho%2Fcarl%2Fs%2F1%2Fkn_journal%3Bkn_id%3Dj1";
    let a = s.ask(Some("carl"), own);
    assert_eq!(a.code, 204, "{a:?}");
    // Statuses into Anna's journal: refused, and nothing is done.
    let a = ask(Some("carl"), "do_method=notify&kn_to=/what/public/z&kn_payload=z&kn_id=s1&kn_status_to=/who/anna/kn_journal");
    assert_eq!(a.code, 403, "{a:?}");
    assert!(a.body.contains("may not post to '/who/anna/kn_journal'"), "{a:?}");
    assert!(events(s, "/what/public/z").is_empty());
    assert!(events(s, "/who/anna/kn_journal").is_empty());
}

/// `do_method=receipts` and `do_method=ack` (docs/PRESENCE.md): read on
/// the topic (the journal), a subscriber shown only to who may see its
/// route.
fn receipts(s: &dyn Server) {
    let ask = |user: Option<&str>, query: &str| s.ask(user, &format!("{query}&{SIMPLE}"));
    let store = Store::open(s.root().join("kn_events")).unwrap();
    drop(store.tunnel(&Topic::parse("/who/anna/kn_journal").unwrap(), &Selection::none()).unwrap());
    let routed = ask(Some("anna"), "do_method=route&kn_from=/what/public/news&kn_to=/who/anna/kn_journal&kn_id=ra");
    assert_eq!(routed.code, 200, "{}", routed.body);
    assert_eq!(ask(Some("bob"), "kn_to=/what/public/news&kn_id=e1&do_method=notify").code, 200);
    let query = "do_method=receipts&kn_from=/what/public/news&kn_id=e1";
    let own = ask(Some("anna"), query);
    assert_eq!(own.code, 200, "{}", own.body);
    assert!(own.body.contains("receipt_journal: /who/anna/kn_journal") && own.body.contains("receipt_holds: true"), "{}", own.body);
    for who in [Some("bob"), None] {
        let other = ask(who, query);
        assert_eq!(other.code, 200, "{who:?}: {}", other.body);
        assert!(other.body.contains("receipt_holds: true"), "{who:?}: {}", other.body);
        assert!(!other.body.contains("anna") && !other.body.contains("receipt_route"), "{who:?} sees the subscriber: {}", other.body);
    }
    let staff = ask(Some("carol"), "do_method=receipts&kn_from=/what/staff/x&kn_id=e1");
    assert_eq!(staff.code, 403, "{}", staff.body);
    let ack = "do_method=ack&kn_from=/who/anna/kn_journal&kn_route_checkpoint=1";
    assert_eq!(ask(Some("bob"), ack).code, 403);
    assert_eq!(ask(None, ack).code, 401);
    assert_eq!(ask(Some("anna"), ack).code, 200);
    assert!(ask(Some("bob"), query).body.contains("receipt_confirmed: true"));
}

#[test]
fn cgi_checks_receipts_and_acknowledgements() {
    receipts(&Cgi::new("access_cgi_receipts"));
}

#[test]
fn serve_checks_receipts_and_acknowledgements() {
    receipts(&Served::start("access_serve_receipts", &["--trusted-proxy", "127.0.0.1"]));
}

#[test]
fn cgi_checks_every_operation_for_the_remote_user() {
    matrix(&Cgi::new("access_cgi_matrix"));
}

#[test]
fn serve_checks_every_operation_for_the_proxys_user() {
    matrix(&Served::start("access_serve_matrix", &["--trusted-proxy", "127.0.0.1"]));
}

#[test]
fn cgi_resists_routes_batches_and_status_topics_used_to_get_around_the_rules() {
    attacks(&Cgi::new("access_cgi_attacks"));
}

#[test]
fn serve_resists_routes_batches_and_status_topics_used_to_get_around_the_rules() {
    attacks(&Served::start("access_serve_attacks", &["--trusted-proxy", "127.0.0.1"]));
}

#[test]
fn serve_ignores_the_user_header_from_an_address_that_is_not_the_proxy() {
    // The trusted proxy is elsewhere: this connection's header is forged.
    let s = Served::start("access_forged_header", &["--trusted-proxy", "192.0.2.1"]);
    let a = s.ask(Some("anna"), &format!("do_method=notify&kn_to=/what/staff/x&kn_payload=forged&kn_id=f1&{SIMPLE}"));
    assert_eq!(a.code, 401, "{a:?}");
    assert!(events(&s, "/what/staff/x").is_empty());
    let who = s.ask(Some("anna"), "do_method=whoami");
    assert!(who.body.contains("window.kn_userid = 'anonymous'"), "{who:?}");
    // Without --trusted-proxy the header means nothing either.
    let s = Served::start("access_no_proxy", &[]);
    let a = s.ask(Some("anna"), &format!("do_method=notify&kn_to=/what/staff/x&kn_payload=forged&kn_id=f1&{SIMPLE}"));
    assert_eq!(a.code, 401, "{a:?}");
}

#[test]
fn whoami_names_the_authenticated_user_under_serve() {
    let s = Served::start("access_whoami", &["--trusted-proxy", "127.0.0.1", "--user-header", "X-Forwarded-User"]);
    let who = s.request("do_method=whoami", "X-Forwarded-User: anna\r\n");
    assert!(who.body.contains("window.kn_userid = 'anna'"), "{who:?}");
    // The JavaScript client names its journal after the user.
    let lib = s.request("do_method=lib", "X-Forwarded-User: anna\r\n");
    assert!(lib.body.contains("window.kn_userid = 'anna'") && lib.body.contains("setJournal(\"/who/\" + owner + \"/s/\""), "{lib:?}");
}

fn htpasswd(dir: &Path, flag: &str) -> Option<PathBuf> {
    if !kn_test_support::available("/usr/bin/htpasswd") {
        return None;
    }
    let file = dir.join(format!("users{flag}"));
    for (user, password) in [("anna", "anna-secret"), ("carl", "carl-secret")] {
        let mut command = Command::new("/usr/bin/htpasswd");
        command.arg("-b").arg(flag);
        if !file.exists() {
            command.arg("-c");
        }
        let status = command.arg(&file).arg(user).arg(password).stderr(Stdio::null()).status().unwrap();
        assert!(status.success(), "htpasswd {flag} failed");
    }
    Some(file)
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

#[test]
fn serve_checks_basic_credentials_against_an_htpasswd_file() {
    let dir = Dir::new("access_htpasswd");
    let Some(users) = htpasswd(dir.path(), "-B") else { return };
    let s = Served::start("access_htpasswd_serve", &["--htpasswd", users.to_str().unwrap()]);
    let post = format!("do_method=notify&kn_to=/what/staff/x&kn_payload=p&kn_id=h1&{SIMPLE}");
    let a = s.request(&post, &basic("anna", "anna-secret"));
    assert_eq!(a.code, 200, "{a:?}");
    let a = s.request(&post, &basic("carl", "carl-secret"));
    assert_eq!(a.code, 403, "{a:?}");
    let a = s.request(&post, &basic("anna", "wrong"));
    assert_eq!(a.code, 401, "{a:?}");
    assert!(a.head.to_ascii_lowercase().contains("www-authenticate: basic realm=\"knpubsub\""), "{a:?}");
    let a = s.request(&post, "");
    assert_eq!(a.code, 401, "{a:?}");
    let who = s.request("do_method=whoami", &basic("anna", "anna-secret"));
    assert!(who.body.contains("window.kn_userid = 'anna'"), "{who:?}");
    // SHA-512-crypt (htpasswd -5) is checked too.
    if let Some(sha) = htpasswd(dir.path(), "-5") {
        let s = Served::start("access_htpasswd_sha", &["--htpasswd", sha.to_str().unwrap()]);
        assert_eq!(s.request(&post.replace("h1", "h2"), &basic("anna", "anna-secret")).code, 200);
        assert_eq!(s.request(&post.replace("h1", "h3"), &basic("anna", "carl-secret")).code, 401);
    }
}

/// What Apache itself says of `user`'s `password` in `file`
/// (`htpasswd -v`, the same `apr_password_validate` as mod_authn_file).
fn apache_accepts(file: &Path, user: &str, password: &str) -> bool {
    let status = Command::new("/usr/bin/htpasswd").arg("-vb").arg(file).arg(user).arg(password).stderr(Stdio::null()).status().unwrap();
    status.success()
}

#[test]
fn serve_accepts_every_hash_apaches_htpasswd_writes_as_apache_does() {
    let dir = Dir::new("access_htpasswd_kinds");
    // Apache's MD5 (the default), bcrypt, SHA-1, SHA-512, SHA-256 (DES
    // crypt, -d, is refused: the test below).
    for flag in ["-m", "-B", "-s", "-5", "-2"] {
        let Some(users) = htpasswd(dir.path(), flag) else { return };
        let s = Served::start(&format!("access_htpasswd_kind{flag}"), &["--htpasswd", users.to_str().unwrap()]);
        for (password, right) in [("anna-secret", true), ("wrong-pw", false)] {
            assert_eq!(apache_accepts(&users, "anna", password), right, "htpasswd -v {flag} {password}");
            let who = s.request("do_method=whoami", &basic("anna", password));
            if right {
                assert!(who.code == 200 && who.body.contains("window.kn_userid = 'anna'"), "{flag}: {who:?}");
            } else {
                assert_eq!(who.code, 401, "{flag}: {who:?}");
            }
        }
        let who = s.request("do_method=whoami", &basic("carl", "carl-secret"));
        assert!(who.body.contains("window.kn_userid = 'carl'"), "{flag}: {who:?}");
    }
}

#[test]
fn serve_refuses_to_start_with_plain_text_passwords_as_apache_refuses_them() {
    let dir = Dir::new("access_htpasswd_plain");
    let Some(users) = htpasswd(dir.path(), "-p") else { return };
    // Apache on Linux hands a plain password to crypt(3): never accepted.
    assert!(!apache_accepts(&users, "anna", "anna-secret"));
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(dir.join("kn_events"))
        .arg("--htpasswd")
        .arg(&users)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(":1: user 'anna' has no hash serve (or Apache on Linux) can check: plain text ('htpasswd -p')"), "{stderr}");
    assert!(stderr.contains("htpasswd -B"), "{stderr}");
}

#[test]
fn serve_refuses_to_start_with_des_crypt_passwords_naming_the_user_and_htpasswd_b() {
    let dir = Dir::new("access_htpasswd_des");
    let Some(users) = htpasswd(dir.path(), "-d") else { return };
    // Apache accepts it, reading only 8 characters: "anna-sec" is enough.
    assert!(apache_accepts(&users, "anna", "anna-secXXX"));
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(dir.join("kn_events"))
        .arg("--htpasswd")
        .arg(&users)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(":1: user 'anna' has a DES crypt hash ('htpasswd -d'), which reads only the first 8 characters"), "{stderr}");
    assert!(stderr.contains("htpasswd -B"), "{stderr}");
}

#[test]
fn a_replay_posts_only_where_its_requester_may() {
    let replay: &'static str = Box::leak(kn_test_support::cargo_bin("kn-replay").to_string_lossy().into_owned().into_boxed_str());
    let s = Cgi(Site::new("access_replay"), replay);
    // Each journal holds an event claiming to come from the staff topic
    // (anyone may post such an event to their own journal).
    let store = Store::open(s.0.root()).unwrap();
    for user in ["carl", "anna"] {
        let journal = Topic::parse(&format!("/who/{user}/kn_journal")).unwrap();
        store.tunnel(&journal, &Selection::none()).unwrap();
        let forged = kn_journal::Event::from_pairs([
            ("kn_id", format!("{user}-1")),
            ("kn_payload", format!("replayed by {user}")),
            ("kn_route_location", "/what/staff/x/kn_routes/r1".to_string()),
        ]);
        store.notify(&journal, forged).unwrap();
    }
    for user in ["carl", "anna"] {
        let a = s.ask(Some(user), &format!("do_method=replay&kn_from=/who/{user}/kn_journal&warp=inf&{SIMPLE}"));
        assert_eq!(a.code, 200, "{a:?}");
    }
    // Anna is staff: her replay posts there. Carl's, started first, not.
    let posted = kn_test_support::wait_for(Duration::from_secs(20), || !events(&s, "/what/staff/x").is_empty());
    assert!(posted, "anna's replay never posted");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(events(&s, "/what/staff/x"), ["replayed by anna"]);
}
