//! The `js` format: an HTML page whose events are script blocks calling
//! `parent.kn_sendCallback`, inside HTML comments.

use kn_journal::Event;

use crate::Page;

/// What closes a `js` page: the open comment, `</body>` and `</html>`.
pub const TRAILER: &[u8] = b"-->\n</body>\n</html>\n";

const DOCTYPE: &str = "<!DOCTYPE html\n\tPUBLIC \"-//W3C//DTD XHTML 1.0 Transitional//EN\"\n\t \
                       \"http://www.w3.org/TR/xhtml1/DTD/xhtml1-transitional.dtd\">\n\
                       <html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en-US\" xml:lang=\"en-US\">\n";

const TUNNEL_BODY: &str = "<body onload=\"if(parent.kn_tunnelLoadCallback) parent.kn_tunnelLoadCallback(window)\">\n";

/// The start of an HTML page as the original's CGI.pm wrote it, up to
/// and including the `<body>` line: `title` (entity-escaped here, line
/// breaks kept), then
/// `head` (raw HTML) in the `<head>`, then `body_tag`.
///
/// Unlike CGI.pm, the `<meta>` says `charset=utf-8`, agreeing with the
/// HTTP header (every page we write is ASCII anyway).
pub fn start_html(title: &[u8], head: &str, body_tag: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(600);
    out.extend_from_slice(DOCTYPE.as_bytes());
    out.extend_from_slice(b"<head>\n<title>");
    // CGI.pm left line breaks in a title as they are (the blank page's
    // title ends with one).
    for (i, line) in title.split(|&b| b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        html_escape(line, &mut out);
    }
    out.extend_from_slice(b"</title>\n");
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(b"<meta http-equiv=\"Content-Type\" content=\"text/html; charset=utf-8\" />\n</head>\n");
    out.extend_from_slice(body_tag.as_bytes());
    out
}

/// The `<script>` element that loads `do_method=whoami` from the server.
pub fn whoami_script(server_url: &str) -> String {
    let mut src = Vec::new();
    html_escape(format!("{server_url}?do_method=whoami").as_bytes(), &mut src);
    format!("<script type=\"text/javascript\" src=\"{}\"></script>\n", String::from_utf8_lossy(&src))
}

/// The page up to the first event: title and `<h1>` = `status`, the
/// `payload` in a `<pre>`, for a 4xx status a paragraph linking to
/// `?do_method=help`, and the `<!--` that the first event block closes.
pub fn prologue(page: &Page, status: &[u8], payload: &[u8]) -> Vec<u8> {
    let body_tag = if page.is_tunnel() { TUNNEL_BODY } else { "<body>\n" };
    let mut out = start_html(status, &whoami_script(page.server_url()), body_tag);
    out.extend_from_slice(b"<h1>");
    html_escape(status, &mut out);
    out.extend_from_slice(b"</h1><pre>");
    html_escape(payload, &mut out);
    out.extend_from_slice(b"</pre>");
    if status.first() == Some(&b'4') {
        out.extend_from_slice(b"<p>Some aspect of your request was not understood. Please see the <a href=\"");
        html_escape(format!("{}?do_method=help", page.server_url()).as_bytes(), &mut out);
        out.extend_from_slice(b"\">mod_pubsub documentation</a> for more information.</p>");
    }
    out.extend_from_slice(b"<!--");
    out
}

/// The script block of `event`, elements in name order.
pub fn block(event: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    write_block(&mut out, event.elements());
    out
}

/// Appends the script block of an event given as `elements`, written
/// in the order given:
///
/// ```text
/// --><script type="text/javascript"><!--
/// if (parent.kn_sendCallback) parent.kn_sendCallback({elements:[
/// {name:"K1",value:"V1"}
/// ,{name:"K2",value:"V2"}
/// ]}, window);
/// // -->
/// </script><!--
/// ```
pub fn write_block<'a>(out: &mut Vec<u8>, elements: impl IntoIterator<Item = (&'a [u8], &'a [u8])>) {
    out.extend_from_slice(b"--><script type=\"text/javascript\"><!--\nif (parent.kn_sendCallback) parent.kn_sendCallback({elements:[\n");
    for (i, (name, value)) in elements.into_iter().enumerate() {
        out.extend_from_slice(if i == 0 { b"{" } else { b",{" });
        write_member(out, b"name", name);
        out.push(b',');
        write_member(out, b"value", value);
        out.extend_from_slice(b"}\n");
    }
    out.extend_from_slice(b"]}, window);\n// -->\n</script><!--\n");
}

/// `key:"..."`, with `key` + `U` when the string holds a byte >= 0x80
/// (the client then decodes the bytes as UTF-8).
fn write_member(out: &mut Vec<u8>, key: &[u8], string: &[u8]) {
    out.extend_from_slice(key);
    if string.iter().any(|&b| b >= 0x80) {
        out.push(b'U');
    }
    out.extend_from_slice(b":\"");
    escape_string(string, out);
    out.push(b'"');
}

/// Appends the body of a JavaScript string literal: `\` and `"`
/// backslashed, FF LF CR TAB as `\f \n \r \t`, and `<` and every other
/// byte outside 0x20-0x7E as `\xNN` (lowercase hex).
///
/// ```
/// let mut out = Vec::new();
/// kn_wire::js::escape_string("<b>\"κ\"\n".as_bytes(), &mut out);
/// assert_eq!(out, br#"\x3cb>\"\xce\xba\"\n"#);
/// ```
pub fn escape_string(string: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for &b in string {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'"' => out.extend_from_slice(b"\\\""),
            0x0c => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'<' | 0x00..=0x1f | 0x7f..=0xff => {
                out.extend_from_slice(&[b'\\', b'x', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]])
            }
            _ => out.push(b),
        }
    }
}

/// Appends `text` escaped for HTML text or a quoted attribute, in
/// ASCII: `&`, `<`, `>`, `"` as named entities; LF and the other
/// control bytes (not TAB) and DEL as decimal references (`&#10;`); each
/// UTF-8 character >= U+0080 as its decimal reference (`κ` → `&#954;`);
/// a byte that is not part of valid UTF-8 as the reference of its
/// Latin-1 character. `'` stays as it is.
///
/// ```
/// let mut out = Vec::new();
/// kn_wire::js::html_escape("a&\"b\"\nκ'\u{ff}".as_bytes(), &mut out);
/// assert_eq!(out, b"a&amp;&quot;b&quot;&#10;&#954;'&#255;");
/// ```
pub fn html_escape(text: &[u8], out: &mut Vec<u8>) {
    for chunk in text.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '&' => out.extend_from_slice(b"&amp;"),
                '<' => out.extend_from_slice(b"&lt;"),
                '>' => out.extend_from_slice(b"&gt;"),
                '"' => out.extend_from_slice(b"&quot;"),
                '\t' => out.push(b'\t'),
                c if c.is_ascii_control() || !c.is_ascii() => out.extend_from_slice(format!("&#{};", u32::from(c)).as_bytes()),
                c => out.push(c as u8),
            }
        }
        for &b in chunk.invalid() {
            out.extend_from_slice(format!("&#{b};").as_bytes());
        }
    }
}
