//! The `do_method`s this server answers, in one table: the dispatcher
//! ([`Handler::handle`](super::Handler::handle)) looks each request's
//! method up in [`METHODS`], and `do_method=help` lists [`METHODS`], so a
//! method cannot be answered without being listed, nor listed without
//! being answered. An unknown name is answered `403 Unknown do_method`,
//! as the original did.
//!
//! The texts mark code with backticks: the help page shows it as code,
//! the plain-text help as it is.

/// What the dispatcher does with a method (one arm each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `notify`: post an event.
    Notify,
    /// `route`: a static route, its deletion, or a tunnel.
    Route,
    /// `batch`: several notifies, routes and replays.
    Batch,
    /// `replay`: replay a journal through the replay sensor.
    Replay,
    /// `whoami`: who the server takes the client for, as JavaScript.
    Whoami,
    /// `session`: an anonymous visitor's session.
    Session,
    /// `lib`, `libform`, `lib2form`: the JavaScript client.
    Lib,
    /// `blank`: an empty page.
    Blank,
    /// `help`: this list.
    Help,
    /// `test`: the installation's self-checks.
    Test,
    /// `receipts`: who holds and confirmed an event.
    Receipts,
    /// `ack`: a client confirms events.
    Ack,
    /// `vapid`: the server's Web Push (VAPID) public key.
    Vapid,
}

/// One `do_method`: its name, what it does, and an example request
/// (`{SERVER}` stands for the server's URL).
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// The value of `do_method`.
    pub name: &'static str,
    /// What the dispatcher does.
    pub method: Method,
    /// What it is for, in a sentence or a few.
    pub summary: &'static str,
    /// A command that uses it, if one says more than the summary.
    pub example: Option<&'static str>,
}

/// Every `do_method` the server answers.
pub const METHODS: &[Entry] = &[
    Entry {
        name: "notify",
        method: Method::Notify,
        summary: "The default for POST. Post an event to topic `kn_to` (or the path). Every other parameter is an element of \
                  the event: `kn_payload`, `kn_id`, `kn_expires` (`+N`, an epoch time or `infinity`), ...",
        example: Some("curl -d kn_to=/what/chat -d kn_payload=hello -d kn_response_format=simple {SERVER}"),
    },
    Entry {
        name: "route",
        method: Method::Route,
        summary: "The default for GET with parameters. With `kn_to`: a static route from `kn_from` (or the path) to a topic or \
                  URL, with `kn_id`, `kn_uri`, `kn_content_filter`, `kn_content_transform`, `do_max_age`, `do_max_n`; an \
                  empty `kn_to` deletes route `kn_id`. Without `kn_to`: a tunnel that streams the topic's events as they \
                  arrive (`do_max_n`, `do_max_age`, `do_since_checkpoint`).",
        example: Some("curl -N '{SERVER}/who/me/kn_journal?do_method=route&kn_response_format=simple'"),
    },
    Entry {
        name: "batch",
        method: Method::Batch,
        summary: "Each `kn_batch` parameter is one urlencoded notify, route or replay.",
        example: None,
    },
    Entry { name: "replay", method: Method::Replay, summary: "Replay a journal (needs the replay sensor).", example: None },
    Entry {
        name: "receipts",
        method: Method::Receipts,
        summary: "For the event `kn_id` of topic `kn_from` (or the path): a `200 Receipts` status, then one event per journal \
                  routed from the topic saying whether it holds the event, sent it to a live client, and whether its client \
                  confirmed it. A route made with `kn_unread_after` (seconds) and `kn_unread_to` (a topic) posts each event \
                  left unconfirmed that long to that topic, once.",
        example: Some("curl '{SERVER}?do_method=receipts&kn_from=/what/news&kn_id=ev1&kn_response_format=simple'"),
    },
    Entry {
        name: "ack",
        method: Method::Ack,
        summary: "The client of journal `kn_from` (or the path) has every event up to `kn_route_checkpoint`: confirms them (an \
                  `sse` tunnel resuming at a checkpoint does the same).",
        example: None,
    },
    Entry {
        name: "session",
        method: Method::Session,
        summary: "An anonymous visitor's session: its id, and the `HttpOnly` cookie `kn_session` that proves it; its journals \
                  lie under `/who/anonymous/s/<visitor>/` (docs/ACCESS.md).",
        example: None,
    },
    Entry {
        name: "whoami",
        method: Method::Whoami,
        summary: "Who the server takes the client for, as the JavaScript client reads it.",
        example: None,
    },
    Entry {
        name: "vapid",
        method: Method::Vapid,
        summary: "The server's Web Push (VAPID) public key in base64url, as plain text: a page's `applicationServerKey` \
                  for a route to its push subscription (`kn_to=webpush:...`, docs/PROTOCOL.md \"Web Push (extension)\"). \
                  `404` when the server sends no Web Push (`KN_PUSH_CONTACT` unset).",
        example: Some("curl '{SERVER}?do_method=vapid'"),
    },
    Entry { name: "lib", method: Method::Lib, summary: "The JavaScript client (`kn_client.js`).", example: None },
    Entry { name: "libform", method: Method::Lib, summary: "The JavaScript client with its `kn:` form handler.", example: None },
    Entry { name: "lib2form", method: Method::Lib, summary: "The same as `libform`.", example: None },
    Entry { name: "blank", method: Method::Blank, summary: "An empty page.", example: None },
    Entry {
        name: "help",
        method: Method::Help,
        summary: "This list: an HTML page for a browser, plain text for any other client (one whose `Accept` names neither \
                  `text/html` nor `application/xhtml+xml`, like curl's).",
        example: None,
    },
    Entry {
        name: "test",
        method: Method::Test,
        summary: "The installation's self-checks: a probe post to the store, free space above the reserve, the server names, \
                  the modes a sensor of the store's group needs.",
        example: None,
    },
];

/// The method named `name`, if the server has it.
pub fn find(name: &str) -> Option<&'static Entry> {
    METHODS.iter().find(|entry| entry.name == name)
}

/// What else the help says, after the methods: `(title, text, example)`.
pub const MORE: &[(&str, &str, Option<&str>)] = &[
    (
        "Topics the server writes",
        "Beside any topic `T`: `T/kn_subtopics` (an event per subtopic), `T/kn_routes` (an event per static route of `T`) \
         and `T/kn_presence` (an event per journal routed from `T`, saying whether a client is connected to it now and \
         since when). Read them like any topic (a tunnel, a route, `do_max_n`); a notify to them is refused.",
        Some("curl -N '{SERVER}/what/chat/kn_presence?do_method=route&kn_response_format=simple'"),
    ),
    (
        "Response formats (kn_response_format)",
        "`js` (default, an HTML page of script blocks), `simple` (length-prefixed `name: value` frames, where `=XX` is a \
         byte written in hexadecimal: `=0A` a line end, `=3D` an equals sign), `flash` (simple with a NUL after each \
         event), `sse` (Server-Sent Events, with `retry:`). A tunnel writes 4096 spaces after each burst of events for \
         browsers, whose old versions held back the start of a response; a `simple` tunnel to a client whose \
         `User-Agent` is no browser's (curl) gets its frames alone. `kn_status_to` sends the status events to a topic \
         instead and answers `204`.",
        None,
    ),
];

/// The help as plain text, for the server at `server`.
pub fn help_text(server: &str) -> String {
    let intro = format!(
        "This is a knpubsub server at {server}, speaking the mod_pubsub protocol. Requests are GET or POST with form \
         parameters (both & and ; separate them); the path after the server URL names a default topic."
    );
    let mut out = format!("PubSub server: usage\n\n{}\n\nMethods (do_method)\n\n", plain(&intro));
    for entry in METHODS {
        out.push_str(&format!("{}\n{}\n", entry.name, indent(&plain(entry.summary))));
        if let Some(example) = entry.example {
            out.push_str(&format!("\n    {}\n", example.replace("{SERVER}", server)));
        }
        out.push('\n');
    }
    for (title, text, example) in MORE {
        out.push_str(&format!("{title}\n\n{}\n", indent(&plain(text))));
        if let Some(example) = example {
            out.push_str(&format!("\n    {}\n", example.replace("{SERVER}", server)));
        }
        out.push('\n');
    }
    out
}

/// The methods and the rest of the help as HTML, for the page
/// `crate::assets::HELP_HTML` frames; its examples name the server
/// `{SERVER}`, which the page replaces in one pass.
pub fn help_html() -> String {
    let mut out = String::from("<h2>Methods (<code>do_method</code>)</h2>\n<dl>\n");
    for entry in METHODS {
        out.push_str(&format!("<dt><code>{}</code></dt>\n<dd>{}", entry.name, html(entry.summary)));
        if let Some(example) = entry.example {
            out.push_str(&format!("\n<pre>{}</pre>", escape(example)));
        }
        out.push_str("</dd>\n");
    }
    out.push_str("</dl>\n");
    for (title, text, example) in MORE {
        out.push_str(&format!("<h2>{}</h2>\n<p>{}</p>\n", escape(title), html(text)));
        if let Some(example) = example {
            out.push_str(&format!("<pre>{}</pre>\n", escape(example)));
        }
    }
    out
}

/// `text` without its backticks, wrapped at 76 columns.
fn plain(text: &str) -> String {
    let mut lines = vec![String::new()];
    for word in text.replace('`', "").split_whitespace() {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.len() + 1 + word.len() > 72 {
            lines.push(word.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines.join("\n")
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

/// `text` escaped, its backticked parts as `<code>`.
fn html(text: &str) -> String {
    text.split('`').enumerate().map(|(i, part)| if i % 2 == 1 { format!("<code>{}</code>", escape(part)) } else { escape(part) }).collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_listed_once() {
        for entry in METHODS {
            assert_eq!(METHODS.iter().filter(|e| e.name == entry.name).count(), 1, "{}", entry.name);
            assert_eq!(find(entry.name).map(|e| e.method), Some(entry.method));
        }
        assert!(find("session").is_some(), "do_method=session is listed");
        assert!(find("nosuch").is_none());
    }

    #[test]
    fn the_text_help_lists_every_method_with_its_examples() {
        let text = help_text("http://example.org/kn");
        for entry in METHODS {
            assert!(text.lines().any(|l| l == entry.name), "{} not listed:\n{text}", entry.name);
        }
        assert!(text.contains("    curl -d kn_to=/what/chat -d kn_payload=hello -d kn_response_format=simple http://example.org/kn\n"), "{text}");
        assert!(!text.contains('`') && !text.contains("<code>"), "{text}");
        assert!(text.lines().all(|l| l.len() <= 120 || l.trim_start().starts_with("curl")), "{text}");
    }

    #[test]
    fn the_html_help_marks_code_and_escapes() {
        let html = help_html();
        assert!(html.contains("<dt><code>session</code></dt>"), "{html}");
        assert!(html.contains("<code>kn_to</code>"), "{html}");
        assert!(html.contains("/who/anonymous/s/&lt;visitor&gt;/"), "{html}");
        assert!(html.contains("?do_method=receipts&amp;kn_from=/what/news"), "{html}");
    }
}
