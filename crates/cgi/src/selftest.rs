//! `do_method=test`: checks that this server can do its job here.

use std::fs;

use kn_journal::{decode_record, encode_record, Decoded, Event, Record, Store, Topic};

use crate::request::Request;

/// Runs every self-check: its name and `Err(why)` when it failed.
pub fn run(store: &Store, request: &Request) -> Vec<(&'static str, Result<(), String>)> {
    vec![
        ("Event store is writable", store_writable(store)),
        ("Free space above the reserve", free_space(store)),
        ("Topic names", topic_names()),
        ("Record framing", record_framing()),
        ("Server URL", server_url(request)),
    ]
}

fn store_writable(store: &Store) -> Result<(), String> {
    let probe = store.root().join(format!(".tmp-selftest-{}", std::process::id()));
    fs::write(&probe, b"x").map_err(|e| format!("cannot write in '{}': {e}", store.root().display()))?;
    fs::remove_file(&probe).map_err(|e| format!("cannot delete '{}': {e}", probe.display()))
}

fn free_space(store: &Store) -> Result<(), String> {
    let free = fs4::available_space(store.root()).map_err(|e| format!("cannot query free space: {e}"))?;
    let reserve = store.config().reserve_bytes;
    if free < reserve {
        return Err(format!("{free} bytes free, below the reserve of {reserve} bytes: posts will fail with 507"));
    }
    Ok(())
}

fn topic_names() -> Result<(), String> {
    let t = Topic::parse("what//chat/").map_err(|e| e.to_string())?;
    if t.as_str() != "/what/chat" {
        return Err(format!("'what//chat/' became '{t}'"));
    }
    if Topic::parse("/what/../etc").is_ok() {
        return Err("'/what/../etc' was accepted".to_string());
    }
    Ok(())
}

fn record_framing() -> Result<(), String> {
    let record = Record { seq: 7, stored_secs: 1, event: Event::from_pairs([(&b"kn_payload"[..], &b"\0\xff"[..])]), blob: None };
    let frame = encode_record(&record);
    match decode_record(&frame) {
        Decoded::Record(r, n) if r == record && n == frame.len() => Ok(()),
        other => Err(format!("round trip gave {other:?}")),
    }
}

fn server_url(request: &Request) -> Result<(), String> {
    let url = request.server_url();
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(format!("server URL '{url}' is not absolute"))
    }
}
