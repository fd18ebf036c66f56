//! The bodies of knpubsub's fuzz targets, one function per target.
//!
//! Each takes arbitrary bytes and panics only when a parser breaks its
//! promise: it never panics itself on hostile input, and what it accepts
//! survives an encode → decode round trip unchanged. The same functions
//! run under libFuzzer (`cargo fuzz run <target>`, `fuzz_targets/`) and,
//! over the committed corpus `fuzz/corpus/<target>/`, in the regular test
//! suite (`tests/fuzz_replay.rs` includes this file as a module), so a
//! crash found once stays fixed without a fuzzer installed.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kn_cgi::{Handler, HttpRequest, Limits, Options, Reply, Request};
use kn_journal::{Event, Remote, RemoteReply, Store, Topic, KN_PAYLOAD};
use kn_journal::internal::{decode_record, encode_record, Decoded, Record};
use kn_wire::form::{self, Params};
use kn_wire::simple;

/// The names of the targets, as in `fuzz/Cargo.toml` and `fuzz/corpus/`.
pub const TARGETS: [&str; 7] =
    ["form_parse", "simple_codec", "record_decode", "legacy_event", "topic_parse", "request_handle", "response_head"];

/// Runs the target called `name` on `data`; false for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    match name {
        "form_parse" => form_parse(data),
        "simple_codec" => simple_codec(data),
        "record_decode" => record_decode(data),
        "legacy_event" => legacy_event(data),
        "topic_parse" => topic_parse(data),
        "request_handle" => request_handle(data),
        "response_head" => response_head(data),
        _ => return false,
    }
    true
}

/// An arbitrary event made from `data`: chunks separated by 0xFF bytes
/// are element name, value, name, value, ...; an odd last chunk is the
/// payload.
pub fn arbitrary_event(data: &[u8]) -> Event {
    let mut event = Event::new();
    let mut chunks = data.split(|&b| b == 0xFF);
    while let Some(name) = chunks.next() {
        match chunks.next() {
            Some(value) => {
                event.set(name, value);
            }
            None => {
                event.set(KN_PAYLOAD, name);
                break;
            }
        }
    }
    event
}

/// `kn_wire::form`: the urlencoded form parser and the `PATH_INFO` decoder.
pub fn form_parse(data: &[u8]) {
    if let Ok(params) = Params::parse(data) {
        let pairs = params.into_pairs();
        // Re-encoding what was parsed gives back the same pairs.
        let body = form::encode(pairs.iter().map(|(n, v)| (n, v)));
        let again = form::parse(body.as_bytes()).expect("an encoded form parses");
        assert_eq!(pairs, again, "form round trip");
    }
    if let Ok(path) = form::decode_path(data) {
        assert!(path.len() <= data.len(), "decoding never grows a path");
    }
}

/// `kn_wire::simple`: the frame decoder on arbitrary bytes, and the
/// encode → decode round trip of an arbitrary event.
pub fn simple_codec(data: &[u8]) {
    let _ = simple::decode_frames(data);
    if let Ok(event) = simple::decode_event(data) {
        assert_round_trip(&event);
    }
    assert_round_trip(&arbitrary_event(data));
}

fn assert_round_trip(event: &Event) {
    let frame = simple::frame(event);
    let decoded = simple::decode_frames(&frame).expect("a frame we wrote decodes");
    assert_eq!(decoded.len(), 1, "one frame, one event");
    let mut expected = event.clone();
    if !expected.contains(KN_PAYLOAD) {
        expected.set(KN_PAYLOAD, b"".to_vec());
    }
    assert_eq!(decoded[0], expected, "simple-format round trip");
}

/// `kn_journal::internal::decode_record`: arbitrary bytes, then encode → decode.
pub fn record_decode(data: &[u8]) {
    match decode_record(data) {
        Decoded::Record(record, len) => {
            assert!(len <= data.len(), "a record never claims more bytes than it was given");
            let frame = encode_record(&record);
            assert_eq!(decode_record(&frame), Decoded::Record(record, frame.len()), "re-encoded record");
        }
        Decoded::Incomplete | Decoded::Corrupt(_) => {}
    }
    let mut head = [0u8; 16];
    let n = data.len().min(16);
    head[..n].copy_from_slice(&data[..n]);
    let record = Record {
        seq: u64::from_le_bytes(head[..8].try_into().unwrap_or_default()),
        stored_secs: u64::from_le_bytes(head[8..].try_into().unwrap_or_default()),
        event: arbitrary_event(&data[n..]),
        blob: None,
    };
    let frame = encode_record(&record);
    assert_eq!(decode_record(&frame), Decoded::Record(record, frame.len()), "record round trip");
}

/// `kn_sensors::legacy::parse_event`: a mod_pubsub event file; what it
/// reads, written back in the same format, reads the same.
pub fn legacy_event(data: &[u8]) {
    let Some(event) = kn_sensors::legacy::parse_event(data) else { return };
    let file = simple::encode_from(event.elements(), event.payload());
    let again = kn_sensors::legacy::parse_event(&file).expect("a file we wrote has its blank line");
    assert_eq!(again, event, "legacy event round trip");
}

/// `kn_journal::Topic::parse_bytes`: the canonical form is idempotent and
/// can never name a directory outside the store.
pub fn topic_parse(data: &[u8]) {
    let Ok(topic) = Topic::parse_bytes(data) else { return };
    let name = topic.as_str();
    assert!(name.starts_with('/'), "{name:?} starts with /");
    assert!(topic.is_root() || !name.ends_with('/'), "{name:?} has no trailing /");
    assert!(!name.contains("//"), "{name:?} has no empty segment");
    assert!(!name.bytes().any(|b| b == 0 || b == b'\\'), "{name:?} has no NUL or backslash");
    assert_eq!(Topic::parse(name).ok().as_ref(), Some(&topic), "canonical form is idempotent");
    for segment in topic.segments() {
        assert!(!segment.starts_with('.') && !segment.ends_with('.'), "segment {segment:?} of {name:?}");
        let mut parts = Path::new(segment).components();
        assert!(
            matches!((parts.next(), parts.next()), (Some(Component::Normal(_)), None)),
            "segment {segment:?} of {name:?} is one plain path component"
        );
    }
    let root = Path::new("/store");
    let dir = topic.segments().fold(root.to_path_buf(), |dir, s| dir.join(s));
    assert!(dir.starts_with(root), "{name:?} stays under the store");
    if let Some(parent) = topic.parent() {
        assert!(topic.is_within(&parent), "{name:?} lies within its parent");
    }
}

/// `kn_cgi::Handler`: an arbitrary HTTP request, written as on the wire
/// (`METHOD target`, then `Name: value` header lines, a blank line and
/// the body; `\r` optional), handled on a fresh temporary store, through
/// both the `serve` path (`Request::from_http`) and the CGI path
/// (`Request::from_cgi_env`, with `Content-Length` taken as sent). No
/// request may panic; a tunnel is driven for one read of new events and
/// then closed as if its `kn_expires` had passed, never followed.
pub fn request_handle(data: &[u8]) {
    let http = arbitrary_request(data);
    let store = TempStore::new();
    let handler = Handler::new(store.store.clone(), Options { keep_alive: Duration::from_millis(1) });
    let limits = Limits::new().with_max_body(1 << 16);
    if let Ok(request) = Request::from_cgi_env(cgi_env(&http), http.body.as_slice(), &limits) {
        drive(&handler, &request);
    }
    if let Ok(request) = Request::from_http(http, &limits) {
        drive(&handler, &request);
    }
}

fn drive(handler: &Handler, request: &Request) {
    match handler.handle(request) {
        Reply::Done(response) => {
            let code = response.code();
            assert!((100..600).contains(&code), "status {code} of {:?}", response.head);
            let _ = response.to_cgi_bytes();
        }
        Reply::Tunnel(mut tunnel) => {
            let _ = tunnel.head.to_cgi_bytes(None);
            assert!(!tunnel.take_first().is_empty(), "a tunnel starts with its status event");
            let _ = tunnel.take_initial();
            let _ = tunnel.next_chunk(handler.store());
            let _ = tunnel.deadline();
            let _ = tunnel.finish(handler.store());
        }
    }
}

/// The request `data` spells (see [`request_handle`]).
pub fn arbitrary_request(data: &[u8]) -> HttpRequest {
    let mut lines = data.split(|&b| b == b'\n');
    let first = lines.next().unwrap_or_default();
    let first = first.strip_suffix(b"\r").unwrap_or(first);
    let (method, target) = match first.iter().position(|&b| b == b' ') {
        Some(i) => (&first[..i], &first[i + 1..]),
        None => (first, &b""[..]),
    };
    let (path, query) = match target.iter().position(|&b| b == b'?') {
        Some(i) => (&target[..i], &target[i + 1..]),
        None => (target, &b""[..]),
    };
    let mut consumed = first.len() + 1;
    let mut headers = Vec::new();
    for line in lines.by_ref() {
        consumed += line.len() + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => (line, &b""[..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        headers.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
    }
    HttpRequest {
        method: String::from_utf8_lossy(method).into_owned(),
        path_info: path.to_vec(),
        query: query.to_vec(),
        headers,
        body: data.get(consumed..).unwrap_or_default().to_vec(),
        script_name: "/kn".to_owned(),
        server_name: "127.0.0.1".to_owned(),
        server_port: 8080,
        https: false,
        remote_user: None,
    }
}

/// The CGI environment a web server makes of `http`: headers become
/// `HTTP_*` (and `Content-Length` becomes `CONTENT_LENGTH`, as sent).
fn cgi_env(http: &HttpRequest) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut vars = vec![
        (b"REQUEST_METHOD".to_vec(), http.method.as_bytes().to_vec()),
        (b"QUERY_STRING".to_vec(), http.query.clone()),
        (b"SCRIPT_NAME".to_vec(), b"/kn".to_vec()),
        (b"PATH_INFO".to_vec(), http.path_info.clone()),
        (b"SERVER_NAME".to_vec(), b"localhost".to_vec()),
        (b"SERVER_PORT".to_vec(), b"80".to_vec()),
    ];
    for (name, value) in &http.headers {
        let upper = name.to_ascii_uppercase().replace('-', "_");
        let var = match upper.as_str() {
            "CONTENT_LENGTH" | "CONTENT_TYPE" => upper,
            _ => format!("HTTP_{upper}"),
        };
        vars.push((var.into_bytes(), value.clone()));
    }
    vars
}

/// A store in a fresh temporary directory, removed on drop.
struct TempStore {
    dir: PathBuf,
    store: Arc<Store>,
}

impl TempStore {
    fn new() -> TempStore {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static NO_REPLAY: std::sync::Once = std::sync::Once::new();
        // do_method=replay starts a program: name one that does not exist,
        // so that the handler answers 501 instead of spawning processes.
        NO_REPLAY.call_once(|| std::env::set_var("KN_REPLAY", "/nonexistent/kn-replay"));
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("kn-fuzz-handler-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(dir.join("events")).expect("open a temporary store").with_remote(Arc::new(Offline));
        TempStore { dir, store: Arc::new(store) }
    }
}

/// Remote routes and content transforms fail at once: a fuzzer must not
/// reach the network.
struct Offline;

impl Remote for Offline {
    fn post_form(&self, url: &str, _pairs: &[(&[u8], &[u8])]) -> kn_journal::Result<RemoteReply> {
        Err(kn_journal::Error::new(kn_journal::ErrorKind::Remote, format!("'{url}': no network while fuzzing")))
    }
}

impl Drop for TempStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The header block every response is written with
/// (`kn_cgi::response`: `write_field`, `hyper_field`; a one-shot
/// `Response`, a tunnel's `Head`, a stream's `StreamResponse`, a refused
/// token's challenge): chunks separated by 0xFF are a reason phrase, then
/// header name, value, name, value, ... Whatever they hold, each CGI head
/// is one header per field whose name is a token, ends at its first blank
/// line and holds no control character; `serve` gets the same values.
pub fn response_head(data: &[u8]) {
    use kn_cgi::response::{field_value, hyper_field, is_field_name, Head, Response, Status};
    use kn_cgi::streams::StreamResponse;
    let mut chunks = data.split(|&b| b == 0xFF).map(|c| String::from_utf8_lossy(c).into_owned());
    let reason = chunks.next().unwrap_or_default();
    let code = 100 + u16::from(data.first().copied().unwrap_or(0)) % 500;
    let mut fields = Vec::new();
    while let (Some(name), Some(value)) = (chunks.next(), chunks.next()) {
        fields.push((name, value));
    }
    let mut head = Head::new(Some(Status::new(code, reason.clone())), "text/plain");
    head.headers.extend(fields.iter().cloned());
    let named = fields.iter().filter(|(n, _)| is_field_name(n)).count();
    // Status, Content-Type, the named fields, Content-Length.
    let lines = cgi_head_lines(&head.to_cgi_bytes(Some(data.len())));
    assert_eq!(lines.len(), named + 3, "one line per field: {lines:?}");
    assert_eq!(lines[0], ("Status".to_owned(), field_value(&format!("{code} {reason}")).into_owned()));
    let written = lines[2..2 + named].iter();
    for ((name, value), (line_name, line_value)) in fields.iter().filter(|(n, _)| is_field_name(n)).zip(written) {
        assert_eq!((name, field_value(value).as_ref()), (line_name, line_value.as_str()));
    }
    let one_shot = Response::new(head.clone(), data.to_vec()).to_cgi_bytes();
    let end = find_blank_line(&one_shot).expect("a blank line ends the head");
    assert_eq!(cgi_head_lines(&one_shot[..end]), lines);
    assert_eq!(&one_shot[end..], data, "the body follows the head unchanged");
    // serve: the same value, or no header at all.
    for (name, value) in &fields {
        match hyper_field(name, value.clone()) {
            Some((_, v)) => assert_eq!(v.as_bytes(), field_value(value).as_bytes()),
            None => assert!(!is_field_name(name), "{name:?} dropped"),
        }
    }
    // A stream's answer: names are this program's, values anything.
    const NAMES: [&str; 4] = ["Kn-Topic", "Stream-Next-Offset", "Bad Name", "Set-Cookie:"];
    let mut stream = StreamResponse::text(code, &reason);
    for (i, (_, value)) in fields.iter().enumerate() {
        stream.headers.push((NAMES[i % NAMES.len()], value.clone().into()));
    }
    let bytes = stream.to_cgi_bytes(true);
    let lines = cgi_head_lines(&bytes);
    assert!(lines.iter().all(|(n, _)| n != "Set-Cookie" && n != "Bad Name"), "{lines:?}");
    // A refused token's challenge is one header value of printable ASCII.
    let refused = kn_cgi::bearer::Refused { reason: kn_cgi::bearer::Reason::Malformed, message: reason };
    let challenge = refused.challenge();
    assert!(challenge.bytes().all(|b| (0x20..0x7f).contains(&b)), "{challenge:?}");
}

/// The end of a CGI head: just past its first blank line.
fn find_blank_line(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The fields of a CGI head that must end at its first blank line, each
/// line `name: value` with a token for a name and no control character.
fn cgi_head_lines(head: &[u8]) -> Vec<(String, String)> {
    let end = find_blank_line(head).expect("a blank line ends the head");
    assert_eq!(end, head.len(), "the head goes on past its blank line: {:?}", String::from_utf8_lossy(head));
    let text = std::str::from_utf8(&head[..end - 4]).expect("a head of UTF-8");
    text.split("\r\n")
        .map(|line| {
            assert!(!line.bytes().any(|b| b.is_ascii_control()), "a control character in {line:?}");
            let (name, value) = line.split_once(": ").unwrap_or_else(|| panic!("not a header line: {line:?}"));
            assert!(kn_cgi::response::is_field_name(name), "{line:?}");
            (name.to_owned(), value.to_owned())
        })
        .collect()
}
