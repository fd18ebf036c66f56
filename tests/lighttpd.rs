//! `pubsub.cgi` end to end under lighttpd (`mod_cgi`, `cgi.assign`), the
//! same smoke tests as under Apache: proof that the CGI depends on nothing
//! Apache-specific (lighttpd sets `PATH_INFO` differently, passes no argv,
//! and buffers unless told to stream).

mod e2e;
mod support;

use std::time::Duration;

use support::{Dir, Lighttpd};

/// lighttpd serving `pubsub.cgi` at `/kn` over a fresh store; it stops
/// before the directory goes.
struct Site {
    lighttpd: Lighttpd,
    _dir: Dir,
}

impl std::ops::Deref for Site {
    type Target = Lighttpd;
    fn deref(&self) -> &Lighttpd {
        &self.lighttpd
    }
}

fn site(name: &str, extra: &str) -> Option<Site> {
    if !support::available(support::LIGHTTPD) {
        return None;
    }
    let dir = Dir::new(name);
    let store = dir.store("kn_events");
    let lighttpd = Lighttpd::start(&support::pubsub_cgi(), &store, extra);
    Some(Site { lighttpd, _dir: dir })
}

#[test]
fn lighttpd_notify_answers_200_notified_in_simple_and_js() {
    let Some(s) = site("lighttpd_notify", "") else { return };
    e2e::notify_answers_200_notified(&*s);
}

#[test]
fn lighttpd_route_answers_200_routed() {
    let Some(s) = site("lighttpd_route", "") else { return };
    e2e::route_answers_200_routed(&*s);
}

/// As under Apache: with the fallback poll at 10 s, only change
/// notification can deliver within the limit.
#[test]
fn lighttpd_tunnel_receives_the_status_at_once_and_events_within_100ms() {
    let Some(s) = site("lighttpd_tunnel", "setenv.add-environment += ( \"KN_POLL_MS\" => \"10000\" )\n") else {
        return;
    };
    let latencies = e2e::tunnel_receives_routed_events_at_once(&*s);
    let median = latencies[1];
    eprintln!("lighttpd tunnel latencies (notify sent -> event on the tunnel): {latencies:?}, median {median:?}");
    assert!(median < Duration::from_millis(100), "tunnel latency {latencies:?}: the median is over 100 ms");
}

#[test]
fn lighttpd_batch_frames_arrive_on_the_tunnel_in_order() {
    let Some(s) = site("lighttpd_batch", "") else { return };
    e2e::batch_frames_arrive_in_order(&*s);
}

#[test]
fn lighttpd_status_to_answers_204() {
    let Some(s) = site("lighttpd_status_to", "") else { return };
    e2e::status_to_answers_204(&*s);
}

#[test]
fn lighttpd_path_info_names_the_topic() {
    let Some(s) = site("lighttpd_path_info", "") else { return };
    e2e::path_info_names_the_topic(&*s);
}

#[test]
fn lighttpd_tunnel_cgi_exits_when_the_client_disconnects() {
    let Some(s) = site("lighttpd_disconnect", "") else { return };
    e2e::tunnel_cgi_exits_when_the_client_disconnects(&*s);
}

/// A body over the request limit is refused with `413` before it is read;
/// under lighttpd (pipes, not mod_cgid's socket) the answer arrives.
#[test]
fn lighttpd_oversized_body_answers_413() {
    let Some(s) = site("lighttpd_413_body", "setenv.add-environment += ( \"KN_MAX_EVENT_BYTES\" => \"1000\" )\n") else {
        return;
    };
    let body = format!("kn_to=/what/chat&kn_payload={}", "y".repeat(3 << 20));
    let resp = support::post_alone(&s.url(), "application/x-www-form-urlencoded", body.as_bytes());
    assert_eq!(resp.status, 413, "{}\n{}", resp.text(), s.error_log());
    e2e::notify(&*s, "/what/chat", "ok", "small");
}
