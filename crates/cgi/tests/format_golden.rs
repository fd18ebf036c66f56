//! The encoders of `kn_wire` against the bytes of the original
//! server (`tests/golden/`): every recorded simple frame and js script
//! block, decoded and re-encoded in the recorded element order, must come
//! out byte for byte the same. (The binary writes elements in name order;
//! the original wrote Perl hash order, which no client depends on.)

use std::path::Path;

use kn_wire::{js, simple, Format, Page};

fn response_body(name: &str) -> Vec<u8> {
    let raw = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.response"))).unwrap();
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("CRLF header block");
    raw[at + 4..].to_vec()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The raw simple frames of a body (padding and keep-alives skipped).
fn frames(body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < body.len() && (body[i].is_ascii_whitespace() || body[i] == 0) {
            i += 1;
        }
        if i >= body.len() {
            return out;
        }
        let nl = i + body[i..].iter().position(|&b| b == b'\n').unwrap();
        let n: usize = std::str::from_utf8(&body[i..nl]).unwrap().parse().unwrap();
        let end = nl + 1 + n + 1;
        out.push(&body[i..end]);
        i = end;
    }
}

/// A frame's elements in their recorded order (decoded) and its payload.
fn frame_parts(frame: &[u8]) -> (Vec<kn_wire::form::Pair>, Vec<u8>) {
    let nl = frame.iter().position(|&b| b == b'\n').unwrap();
    let encoded = &frame[nl + 1..frame.len() - 1];
    let blank = find(encoded, b"\n\n").map(|i| i + 1).unwrap_or(0);
    let mut elements = Vec::new();
    for line in encoded[..blank].split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let colon = line.iter().position(|&b| b == b':').unwrap();
        let value = line[colon + 1..].strip_prefix(b" ").unwrap();
        elements.push((simple::unescape(&line[..colon]), simple::unescape(value)));
    }
    (elements, encoded[blank + 1..].to_vec())
}

#[test]
fn simple_frames_of_every_golden_response_re_encode_byte_for_byte() {
    let mut checked = 0;
    for case in [
        "02-notify-simple",
        "03b-bad-topic-simple",
        "06b-route-simple",
        "06c-route-simple-repeat",
        "05b-status-to-with-tunnel",
        "07-tunnel-simple",
        "09a-tunnel-max-n-1",
        "09b-tunnel-since-checkpoint",
        "09c-tunnel-since-unknown-checkpoint",
        "10-batch-tunnel",
        "12b-notify-after-delete",
    ] {
        for frame in frames(&response_body(case)) {
            let (elements, payload) = frame_parts(frame);
            let mut out = Vec::new();
            simple::write_frame_from(&mut out, elements.iter().map(|(n, v)| (n.as_slice(), v.as_slice())), &payload);
            assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(frame), "{case}");
            assert_eq!(out, frame, "{case}");
            // And the decoder reads back the same event.
            let event = simple::decode_frames(frame).unwrap().remove(0);
            assert_eq!(event.payload(), payload.as_slice());
            checked += 1;
        }
    }
    assert!(checked >= 25, "{checked} frames");
}

/// Decodes a JavaScript string literal body as the js format writes it.
fn js_unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        match s[i + 1] {
            b'x' => {
                out.push(u8::from_str_radix(std::str::from_utf8(&s[i + 2..i + 4]).unwrap(), 16).unwrap());
                i += 4;
                continue;
            }
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'f' => out.push(0x0c),
            other => out.push(other),
        }
        i += 2;
    }
    out
}

/// One element line `{name:"..",value:".."}` (either key may end in `U`).
fn js_element(line: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let line = line.strip_prefix(b",").unwrap_or(line);
    let mut strings = Vec::new();
    let mut i = 0;
    while let Some(q) = line[i..].iter().position(|&b| b == b'"') {
        let start = i + q + 1;
        let mut j = start;
        while line[j] != b'"' {
            j += if line[j] == b'\\' { 2 } else { 1 };
        }
        strings.push(js_unescape(&line[start..j]));
        i = j + 1;
    }
    assert_eq!(strings.len(), 2, "{}", String::from_utf8_lossy(line));
    (strings[0].clone(), strings[1].clone())
}

/// The raw script blocks of a js body.
fn blocks(body: &[u8]) -> Vec<&[u8]> {
    const END: &[u8] = b"</script><!--\n";
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(s) = find(rest, b"--><script") {
        let e = s + find(&rest[s..], END).unwrap() + END.len();
        out.push(&rest[s..e]);
        rest = &rest[e..];
    }
    out
}

#[test]
fn js_blocks_of_every_golden_response_re_encode_byte_for_byte() {
    let mut checked = 0;
    for case in ["01-notify-js", "01b-notify-js-duplicate-seed1", "03a-bad-topic-js", "04-unknown-method-js", "06a-route-js", "08-tunnel-js", "08b-tunnel-js-expires", "12-route-delete"] {
        for block in blocks(&response_body(case)) {
            let lines: Vec<&[u8]> = block.split(|&b| b == b'\n').filter(|l| l.starts_with(b"{") || l.starts_with(b",{")).collect();
            let elements: Vec<(Vec<u8>, Vec<u8>)> = lines.iter().map(|l| js_element(l)).collect();
            let mut out = Vec::new();
            js::write_block(&mut out, elements.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(block), "{case}");
            checked += 1;
        }
    }
    assert!(checked >= 12, "{checked} blocks");
}

#[test]
fn js_page_prologues_match_golden_but_for_the_meta_charset() {
    let meta = |s: String| s.replace("charset=iso-8859-1\" />", "charset=utf-8\" />");
    for (case, tunnel) in [("01-notify-js", false), ("03a-bad-topic-js", false), ("04-unknown-method-js", false), ("08-tunnel-js", true)] {
        let body = response_body(case);
        let first = find(&body, b"--><script").unwrap();
        let block = blocks(&body)[0];
        let elements: Vec<(Vec<u8>, Vec<u8>)> = block
            .split(|&b| b == b'\n')
            .filter(|l| l.starts_with(b"{") || l.starts_with(b",{"))
            .map(js_element)
            .collect();
        let get = |name: &[u8]| elements.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap();
        let mut page = Page::new("http://127.0.0.1:8080/kn");
        if tunnel {
            page = page.for_tunnel();
        }
        let ours = js::prologue(&page, &get(b"status"), &get(b"kn_payload"));
        assert_eq!(String::from_utf8_lossy(&ours), meta(String::from_utf8_lossy(&body[..first]).into_owned()), "{case}");
    }
}

#[test]
fn js_trailer_and_padding_are_the_golden_bytes() {
    let body = response_body("01-notify-js");
    assert!(body.ends_with(js::TRAILER));
    assert_eq!(js::TRAILER, b"-->\n</body>\n</html>\n");
    let tunnel = response_body("08-tunnel-js");
    let padding = Format::Js.padding();
    assert!(find(&tunnel, &[b"</script><!--\n".as_slice(), padding].concat()).is_some(), "js padding is 4096 spaces + LF, inside the comment");
    // Simple padding drops the golden LF on purpose (PROTOCOL.md 3.8: one C
    // client aborts on a newline between frames).
    assert_eq!(Format::Simple.padding(), &padding[..4096]);
    assert!(Format::Simple.padding().iter().all(|&b| b == b' '));
}
