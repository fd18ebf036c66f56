//! The property of issue 37 widened to every destination and door
//! (brief A3): crates/cgi/tests/claims_property.rs drives every
//! state-changing method with local destinations only, and so could not
//! see the two holes an outsider found next (a cookie from another site
//! making a route to a remote URL; a stream's `Kn-Topic` binding reading
//! and posting a topic outside a token's claim; both kept as attacks in
//! crates/cgi/tests/attack_outsider.rs). Here the generated requests also
//! name
//!
//! * remote destinations: a URL of another server under `KN_OUTBOUND`
//!   allowing it (a loopback prefix, port 9, where nothing listens) or
//!   denying every URL, one outside the allowed prefix, and a Web Push
//!   subscription (`webpush:`, docs/PROTOCOL.md "Web Push (extension)")
//!   whose endpoint is on loopback under the push policy's test setting:
//!   nothing is ever sent beyond loopback;
//! * those destinations as routes' `kn_to`, `kn_unread_to` and any
//!   request's `kn_status_to`;
//! * Durable Streams bound to a topic (`Kn-Topic`: binding one, reading
//!   one, appending to one through the bridge) and forks
//!   (`Stream-Forked-From`) of bob's stream, which anna's claims leave out.
//!
//! The oracle is the one of claims_property.rs (an independent model of
//! docs/ACCESS.md's tables, sections 1b, 1c and "Durable Streams"),
//! extended to routes to remote and push destinations, stream bindings,
//! the outbox, and the answers of stream requests (a read through the
//! bridge changes nothing a snapshot could compare, so a `2xx` answer is
//! judged as well).
//!
//! WebSocket requests are made by the same handler as a form request
//! (crates/cgi/src/websocket/mod.rs) with a principal that takes no
//! cookie; the socket entry is crate-private, so they are driven over a
//! real socket in crates/cgi/tests/claims_websocket.rs.

#[path = "claims_wide/site.rs"]
mod site;

use proptest::prelude::*;
use site::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn nothing_gets_past_a_claim_or_a_channel_to_any_destination_or_door(
        rules in any::<bool>(),
        outbound in any::<bool>(),
        channel in channel(),
        claim in claim(),
        call in call(),
    ) {
        let site = Site::new(rules, outbound);
        let (headers, judged) = credentials(&site, &channel, &claim, &call);
        let before = site.snapshot();
        let answer = make(&site, &call, headers);
        site.replays_done();
        let after = site.snapshot();
        let verdict = changes_allowed(&site, &judged, &before, &after).and_then(|()| answer_allowed(&site, &judged, &before, &call, &answer));
        if let Err(why) = verdict {
            return Err(TestCaseError::fail(format!(
                "{channel:?} with claim {} ({}rules, outbound {}): {call:?} answered {answer:?}: {why}",
                show(&claim),
                if rules { "" } else { "no " },
                if outbound { "allowed" } else { "denied" },
            )));
        }
        // A page of another site never makes a visitor's session (a
        // request that does not say where it is from may).
        if matches!(channel, Channel::TokenCookie(e) if !matches!(e, Elsewhere::Silent)) {
            prop_assert!(answer.cookie.is_none(), "{call:?} set a cookie: {:?}", answer.cookie);
        }
    }
}

/// The property can fail: with a claim that allows everything each new
/// kind of change goes through and the oracle sees it (were the handler to
/// ignore the claim, the same comparison would report it).
#[test]
fn the_oracle_sees_every_new_kind_of_change() {
    let site = Site::new(false, true);
    let everything: Claim = vec![(5, PATTERNS.len() - 1)];
    let (headers, judged) = credentials(&site, &Channel::Narrowed, &everything, &Call::Replay);
    assert_eq!(judged.change, everything);
    let calls = [
        Call::Route { from: 2, to: REMOTE_ALLOWED, id: 2, unread_to: None, status_to: None },
        Call::Route { from: 3, to: PUSH, id: 2, unread_to: None, status_to: None },
        Call::Route { from: 2, to: 4, id: 1, unread_to: Some(1), status_to: Some(5) },
        Call::Notify { to: 1, status_to: Some(4) },
        Call::Stream { method: "PUT", path: 1, kn_topic: Some(4), forked_from: None },
        Call::Stream { method: "POST", path: 3, kn_topic: None, forked_from: None },
        Call::Stream { method: "PUT", path: 4, kn_topic: None, forked_from: Some(0) },
    ];
    for call in calls {
        let before = site.snapshot();
        let answer = make(&site, &call, headers.clone());
        site.replays_done();
        let after = site.snapshot();
        assert!(changes_allowed(&site, &judged, &before, &after).is_ok(), "{call:?}: {answer:?}");
        assert!(answer_allowed(&site, &judged, &before, &call, &answer).is_ok(), "{call:?}: {answer:?}");
        let nothing = Judged { change: Claim::new(), read: Claim::new() };
        let changed = changes_allowed(&site, &nothing, &before, &after).is_err();
        let answered = answer_allowed(&site, &nothing, &before, &call, &answer).is_err();
        assert!(changed || answered, "{call:?} ({answer:?}) did nothing the oracle could see");
    }
    // A read through the bridge changes nothing compared, but its answer is judged.
    let call = Call::Stream { method: "GET", path: 3, kn_topic: None, forked_from: None };
    let before = site.snapshot();
    let answer = make(&site, &call, headers);
    assert_eq!(answer.status, 200, "{answer:?}");
    let streams_only = Judged { change: Claim::new(), read: vec![(1, 7)] };
    assert!(answer_allowed(&site, &streams_only, &before, &call, &answer).is_err());
}
