//! An outsider's attacks on `serve`'s WebSocket transport (brief A2 of
//! the WebSocket review, issue 41), each against the real `pubsub-cgi
//! serve` on a temporary store, each a hole found and kept here so that
//! it stays closed:
//!
//! * a request frame of many tiny pairs (`a&a&a&...`, or a JSON array of
//!   a million one-letter strings) was decoded whole before
//!   `KN_MAX_FORM_ELEMENTS` was looked at: one 4 MiB frame from an
//!   anonymous client made the server's peak memory grow by about 180 MB
//!   (45 times the frame), on each of the request pool's threads at once;
//!   a form POST stops at the limit before decoding more;
//! * a JSON request frame refused for its method was answered without
//!   its `kn_in_reply_to` (the `kn_id` was looked for in the frame as if
//!   it were a form body, decoding it whole a second time);
//! * a message a client sends in fragments and never finishes was held
//!   outside the body budget (`KN_BODY_BUDGET_BYTES`) every form POST
//!   shares: each socket could make the server hold `KN_WS_MAX_MESSAGE`
//!   (4 MiB) for as long as it answered pings, and every tunnel could be
//!   a socket (28,672 of them under the package's open-file limit);
//! * a socket opened with a Basic login (`serve --htpasswd`) kept posting
//!   as its user after the user was removed from the htpasswd file (or
//!   its password changed), where the next form POST was refused `401`:
//!   the login is now checked again with each request (a cache hit while
//!   the file is unchanged), and a login no longer valid ends the socket
//!   `4401` after a `401` status event.
//!
//! And one that holds, kept so that it stays so: the `Origin` check of a
//! socket opened through Apache's proxy (the packaged snippet's
//! `ProxyPreserveHost On` keeps the browser's `Host`, and the `Origin`
//! passes unchanged), which refuses another site's page and lets the
//! site's own through.
//!
//! The client is the `tungstenite` library in its client role, over a
//! plain socket: these tests send frames no browser would.

use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use kn_test_support::{available, Apache, Dir, Serve, APACHE};
use serde_json::Value;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

const BIN: &str = env!("CARGO_BIN_EXE_pubsub-cgi");

type Socket = tungstenite::WebSocket<TcpStream>;

fn serve(root: &Path, env: &[(&str, &str)]) -> Serve {
    let mut command = Serve::command_of(Path::new(BIN), root, None);
    command.envs(env.iter().copied());
    Serve::spawn(command)
}

/// An anonymous socket on `journal` (`/what/open/...`, which the store
/// without rules lets anyone read).
fn open(serve: &Serve, journal: &str) -> Socket {
    let url = format!("ws://{}/kn{journal}?do_method=route&kn_response_format=websocket", serve.addr());
    let stream = TcpStream::connect(serve.addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let config = WebSocketConfig::default().max_message_size(None).max_frame_size(None);
    let (mut socket, _) = tungstenite::client::client_with_config(url.as_str(), stream, Some(config)).unwrap();
    let first = next_object(&mut socket).expect("the first status event");
    assert!(first["status"].as_str().is_some_and(|s| s.starts_with("200")), "{first}");
    socket
}

/// The server's next JSON object, or `None` at the close.
fn next_object(socket: &mut Socket) -> Option<Value> {
    loop {
        match socket.read() {
            Ok(Message::Text(text)) => return Some(serde_json::from_str(text.as_str()).unwrap()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
}

/// The answer to the request just sent (the first object carrying
/// `kn_in_reply_to` or a status).
fn answer(socket: &mut Socket, text: String) -> Value {
    socket.send(Message::text(text)).unwrap();
    loop {
        let object = next_object(socket).expect("an answer before the close");
        if object.get("status").is_some() {
            return object;
        }
    }
}

/// The server's peak resident memory so far, in KiB (`VmHWM`).
fn peak_kib(serve: &Serve) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", serve.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_frame_of_many_tiny_pairs_is_refused_without_decoding_them_all() {
    let dir = Dir::new("attack_ws_pairs");
    let serve = serve(&dir.join("kn_events"), &[]);
    let mut socket = open(&serve, "/what/open/pairs");
    // Warm: the first request's allocations are not the attack's.
    let warm = answer(&mut socket, "kn_to=%2Fwhat%2Fopen%2Fpairs&kn_payload=x".into());
    assert!(warm["status"].as_str().unwrap().starts_with("200"), "{warm}");
    let before = peak_kib(&serve);
    // 4 MiB (KN_WS_MAX_MESSAGE's default) of two-byte pairs, then the
    // same as a JSON array of one-letter strings.
    let form = "a&".repeat((4 << 20) / 2 - 8);
    let json = format!("{{\"kn_batch\":[{}\"a\"]}}", "\"a\",".repeat((4 << 20) / 4 - 8));
    for frame in [form, json] {
        let refused = answer(&mut socket, frame);
        assert!(refused["status"].as_str().unwrap().starts_with("413"), "{refused}");
    }
    let grew = peak_kib(&serve).saturating_sub(before);
    eprintln!("peak memory grew {grew} KiB for two 4 MiB frames");
    // The frames themselves (and the library's copy) are a few times
    // 4 MiB; decoding a million pairs was about 180 MB.
    assert!(grew < 48 << 10, "peak memory grew {grew} KiB");
}

#[test]
fn a_refused_json_frame_is_answered_with_its_kn_id() {
    let dir = Dir::new("attack_ws_reply_to");
    let serve = serve(&dir.join("kn_events"), &[]);
    let mut socket = open(&serve, "/what/open/reply");
    let refused = answer(&mut socket, r#"{"kn_id":"r1","do_method":"replay","kn_from":"/what/open/reply"}"#.into());
    assert!(refused["status"].as_str().unwrap().starts_with("400"), "{refused}");
    assert_eq!(refused["kn_in_reply_to"], "r1", "{refused}");
    let form = answer(&mut socket, "kn_id=r2&do_method=lib".into());
    assert_eq!(form["kn_in_reply_to"], "r2", "{form}");
}

#[test]
fn a_frame_of_exactly_the_form_element_limit_is_answered_and_one_more_is_413() {
    let dir = Dir::new("attack_ws_elements");
    // A request on a socket carries one pair more than its frame (its
    // kn_response_format), as a form POST carries its query's.
    let serve = serve(&dir.join("kn_events"), &[("KN_MAX_FORM_ELEMENTS", "6")]);
    let mut socket = open(&serve, "/what/open/elements");
    let five = "kn_id=e5&kn_to=%2Fwhat%2Fopen%2Felements&kn_payload=x&a=1&b=2";
    let at = answer(&mut socket, five.into());
    assert!(at["status"].as_str().unwrap().starts_with("200"), "{at}");
    let past = answer(&mut socket, format!("{five}&c=3").replace("e5", "e6"));
    assert!(past["status"].as_str().unwrap().starts_with("413"), "{past}");
    assert_eq!(past["kn_in_reply_to"], "e6", "{past}");
    let json = answer(&mut socket, r#"{"kn_id":"j6","kn_to":"/what/open/elements","kn_payload":"x","a":"1","b":["2","3"]}"#.into());
    assert!(json["status"].as_str().unwrap().starts_with("413"), "{json}");
    assert_eq!(json["kn_in_reply_to"], "j6", "{json}");
}

/// Sends `bytes` as non-final fragments of a text message (`first`: the
/// message's first fragment), then a ping: `None` once its pong came (the
/// server read the fragments and holds the socket), else the code of the
/// server's close.
fn send_fragments(socket: &mut Socket, bytes: usize, first: bool) -> Option<u16> {
    let piece = 16 << 10;
    let mut sent = Ok(());
    for i in 0..bytes.div_ceil(piece) {
        let opcode = if first && i == 0 { OpCode::Data(Data::Text) } else { OpCode::Data(Data::Continue) };
        sent = socket.send(Message::Frame(Frame::message("a".repeat(piece.min(bytes - i * piece)), opcode, false)));
        if sent.is_err() {
            break;
        }
    }
    if sent.is_ok() {
        sent = socket.send(Message::Ping(b"read?".to_vec().into()));
    }
    loop {
        match socket.read() {
            Ok(Message::Pong(_)) => return None,
            Ok(Message::Close(frame)) => return Some(frame.map_or(1005, |f| u16::from(f.code))),
            Ok(_) => continue,
            Err(e) => panic!("neither a pong nor a close: {e} (sending: {sent:?})"),
        }
    }
}

#[test]
fn messages_in_progress_on_sockets_share_the_body_budget() {
    let dir = Dir::new("attack_ws_budget");
    let serve = serve(&dir.join("kn_events"), &[("KN_BODY_BUDGET_BYTES", "1048576")]);
    let mut holding: Vec<Socket> = (0..2).map(|i| open(&serve, &format!("/what/open/budget{i}"))).collect();
    for socket in &mut holding {
        assert_eq!(send_fragments(socket, 400 << 10, true), None, "400 KiB of a message fit the budget");
    }
    // 800 KiB held: 400 more do not fit a budget of 1 MiB.
    let mut third = open(&serve, "/what/open/budget2");
    third.get_mut().set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(send_fragments(&mut third, 400 << 10, true), Some(1013), "closed: Try Again Later");
    // The two holding sockets finish their messages: answered (a notify
    // without a topic), and the budget is given back.
    for socket in &mut holding {
        socket.send(Message::Frame(Frame::message("", OpCode::Data(Data::Continue), true))).unwrap();
        let refused = next_object(socket).expect("an answer");
        assert!(refused["status"].as_str().unwrap().starts_with("400"), "{refused}");
    }
    drop(third);
    // What the third held may be given back a moment later: 600 KiB fit
    // in any case, and only once the holding sockets gave theirs back.
    let mut fourth = open(&serve, "/what/open/budget3");
    assert_eq!(send_fragments(&mut fourth, 600 << 10, true), None, "the budget was given back");
}

/// The status a handshake to `url` with `origin` is answered with.
fn handshake_status(url: &str, origin: &str) -> u16 {
    let mut request = url.into_client_request().unwrap();
    request.headers_mut().insert("Origin", origin.parse().unwrap());
    let host = url.trim_start_matches("ws://").split('/').next().unwrap();
    let stream = TcpStream::connect(host).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    match tungstenite::client::client(request, stream) {
        Ok((_, response)) => response.status().as_u16(),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response))) => response.status().as_u16(),
        Err(e) => panic!("the handshake failed: {e}"),
    }
}

#[test]
fn the_origin_check_holds_through_apaches_proxy() {
    if !available(APACHE) {
        return;
    }
    let dir = Dir::new("attack_ws_apache_origin");
    let serve = serve(&dir.join("kn_events"), &[]);
    let port = serve.addr().rsplit(':').next().unwrap().to_owned();
    let snippet = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/deb/knpubsub-proxy.conf")).unwrap();
    let lines: String = snippet
        .lines()
        .filter(|l| l.starts_with("ProxyPass") || l.starts_with("ProxyPreserveHost"))
        .map(|l| l.replace("127.0.0.1:8080", &format!("127.0.0.1:{port}")) + "\n")
        .collect();
    let apache = Apache::start_with(|_| lines.clone());
    let front = format!("127.0.0.1:{}", apache.port());
    let url = format!("ws://{front}/kn/what/open/origin?do_method=route&kn_response_format=websocket");
    assert_eq!(handshake_status(&url, "http://evil.example"), 403, "{}", apache.error_log());
    assert_eq!(handshake_status(&url, &format!("http://127.0.0.1:{port}")), 403, "serve's own address is not the page's origin");
    assert_eq!(handshake_status(&url, &format!("http://{front}")), 101, "{}", apache.error_log());
}

/// `bob:secret`, as `openssl passwd -apr1` writes it.
const BOB: &str = "bob:$apr1$j5EmwajY$D/tlXx.yNsEMPSu4m57an/\n";

#[test]
fn a_socket_opened_with_a_basic_login_ends_when_the_login_is_removed() {
    let dir = Dir::new("attack_ws_basic");
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, BOB).unwrap();
    let mut command = Serve::command_of(Path::new(BIN), &dir.join("kn_events"), None);
    command.arg("--htpasswd").arg(&htpasswd);
    let serve = Serve::spawn(command);
    let url = format!("ws://{}/kn/who/bob/kn_journal?do_method=route&kn_response_format=websocket", serve.addr());
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert("Authorization", "Basic Ym9iOnNlY3JldA==".parse().unwrap());
    let stream = TcpStream::connect(serve.addr()).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let (mut socket, _) = tungstenite::client::client(request, stream).unwrap();
    assert!(next_object(&mut socket).unwrap()["status"].as_str().unwrap().starts_with("200"));
    let notify = |n: usize| format!("kn_id=b{n}&kn_to=%2Fwho%2Fbob%2Fnotes&kn_payload=x");
    let first = answer(&mut socket, notify(0));
    assert_eq!(first["status"], "200 Notified", "{first}");
    std::fs::write(&htpasswd, "").unwrap();
    // The file is looked at again within a second or so: ask until the
    // change is seen (no time asserted).
    let mut statuses = Vec::new();
    for n in 1..40 {
        std::thread::sleep(Duration::from_millis(250));
        let answered = answer(&mut socket, notify(n));
        let status = answered["status"].as_str().unwrap().to_owned();
        statuses.push(status.clone());
        if !status.starts_with("200") {
            break;
        }
    }
    assert_eq!(statuses.last().map(String::as_str), Some("401 Unauthorized"), "{statuses:?}");
    let closed = loop {
        match socket.read() {
            Ok(Message::Close(frame)) => break frame.map(|f| u16::from(f.code)),
            Ok(_) => continue,
            Err(e) => panic!("no close: {e}"),
        }
    };
    assert_eq!(closed, Some(4401));
}
