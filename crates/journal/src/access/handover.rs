//! A principal handed from the server to a program it starts (the replay
//! of `do_method=replay`, `kn-replay`): the whole principal, the user and
//! what narrows it (a token's groups, claim and expiry; a cookie's
//! channel), so that what the program does for the request is judged as
//! the request itself would be (docs/ACCESS.md, "What is checked").
//!
//! The server writes it into the program's environment
//! ([`HANDOVER_VARIABLE`]) from a principal it verified; the program reads
//! it back with [`Principal::from_handover`]. It is MessagePack (the
//! store's own encoding, `rmp-serde`) in hex: every string of it (a
//! user's name, a claim's pattern) is a length-prefixed field, so no
//! content can be read back as another field. Whoever can set a program's
//! environment by hand can run it without one and act with the file
//! system's rights (local tools are not checked, docs/ACCESS.md section
//! 1): a handover only ever narrows what the program may do.
//!
//! ```
//! use kn_journal::access::{Operation, Principal, TokenClaims};
//! use kn_journal::Topic;
//!
//! let claims: TokenClaims = serde_json::from_str(r#"{"sub":"anna","exp":4102444800,"kn":{"post":["/who/anna/**"]}}"#).unwrap();
//! let anna = Principal::from_token(&claims).unwrap();
//! let again = Principal::from_handover(&anna.to_handover()).unwrap();
//! assert_eq!(again, anna);
//! assert!(again.check_claim(Operation::Post, &Topic::parse("/who/anna/notes").unwrap()).is_ok());
//! assert!(again.check_claim(Operation::Post, &Topic::parse("/what/announce").unwrap()).is_err());
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

use super::{Principal, TokenClaims};

/// The environment variable through which `pubsub-cgi` hands a request's
/// principal to `kn-replay` (written by the server for every replay it
/// starts; absent when an operator runs `kn-replay`).
pub const HANDOVER_VARIABLE: &str = "KN_REPLAY_PRINCIPAL";

#[derive(Serialize, Deserialize)]
struct Handover {
    user: Option<String>,
    session: Option<String>,
    reading_only: bool,
    token: Option<TokenPart>,
}

#[derive(Serialize, Deserialize)]
struct TokenPart {
    groups: Vec<String>,
    kn: Option<BTreeMap<String, Vec<String>>>,
    exp: Option<u64>,
}

impl Principal {
    /// This principal as text for [`Principal::from_handover`].
    pub fn to_handover(&self) -> String {
        let token = self.token.as_ref().map(|grant| TokenPart {
            groups: grant.groups.clone(),
            kn: grant.claim(),
            exp: grant.expires,
        });
        let handover = Handover { user: self.user.clone(), session: self.session.clone(), reading_only: self.reading_only, token };
        let bytes = rmp_serde::to_vec(&handover).unwrap_or_default();
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The principal [`Principal::to_handover`] wrote. Errors
    /// ([`ErrorKind::BadRequest`]) say what is wrong; a program given a
    /// handover it cannot read must refuse to act rather than act with
    /// its own rights.
    pub fn from_handover(text: &str) -> Result<Principal> {
        let bad = |why: &str| Error::new(ErrorKind::BadRequest, format!("{HANDOVER_VARIABLE}: {why}"));
        // Its size follows the token's (`KN_TOKEN_MAX_BYTES`, written
        // in about twice that as hex); an environment variable is bounded
        // by the kernel (128 KiB a string on Linux).
        let text = text.trim();
        if text.len() % 2 != 0 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not hexadecimal"));
        }
        let bytes: Vec<u8> = (0..text.len()).step_by(2).filter_map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect();
        let handover: Handover = rmp_serde::from_slice(&bytes).map_err(|e| bad(&format!("cannot be read: {e}")))?;
        let mut who = match handover.token {
            Some(token) => {
                let claims = TokenClaims { sub: handover.user, groups: token.groups, kn: token.kn, exp: token.exp };
                Principal::from_token(&claims).map_err(|e| bad(e.message()))?
            }
            None => match (handover.user, handover.session) {
                (Some(name), _) => Principal::user(&name),
                (None, Some(id)) => Principal::anonymous_session(&id),
                (None, None) => Principal::anonymous(),
            },
        };
        who.reading_only = handover.reading_only;
        Ok(who)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Operation, Rules};
    use crate::topic::Topic;

    fn claims(json: &str) -> TokenClaims {
        serde_json::from_str(json).unwrap()
    }

    fn topic(name: &str) -> Topic {
        Topic::parse(name).unwrap()
    }

    /// Every operation on every topic, as `who` is judged by `rules`.
    fn verdicts(rules: &Rules, who: &Principal) -> Vec<bool> {
        let topics = ["/what/chat", "/what/staff/x", "/who/anna/notes", "/who/bob/notes", "/who/anonymous/s/s1/j", "/what/drop"];
        topics.iter().flat_map(|t| Operation::ALL.map(|op| rules.check(who, op, &topic(t)).is_ok())).collect()
    }

    #[test]
    fn a_handed_over_principal_is_judged_exactly_as_the_original() {
        let rules = Rules::parse("group staff: carl\nallow all /who/{user}/** users\nallow post,read /what/staff/** @staff\nallow all /who/anonymous/s/{session}/** anonymous\nallow read /** *\n", "r".as_ref()).unwrap();
        let later = crate::access::token::now() + 600;
        let principals = [
            Principal::anonymous(),
            Principal::user("anna"),
            Principal::user("a user with spaces and \"quotes\" kn read:/**"),
            Principal::anonymous_session("s1"),
            Principal::user("anna").through_cookie(crate::access::Site::Elsewhere),
            Principal::from_token(&claims(&format!(r#"{{"sub":"anna","exp":{later},"kn":{{"post":["/who/anna/**"],"replay":["/who/**"]}}}}"#))).unwrap(),
            Principal::from_token(&claims(&format!(r#"{{"sub":"bob","exp":{later},"groups":["staff"]}}"#))).unwrap(),
            Principal::from_token(&claims(&format!(r#"{{"exp":{later},"kn":{{"post,read":["/what/drop"]}}}}"#))).unwrap(),
            Principal::from_token(&claims(r#"{"sub":"anna","exp":1}"#)).unwrap(),
            Principal::nobody(),
        ];
        for who in principals {
            let again = Principal::from_handover(&who.to_handover()).unwrap();
            assert_eq!(again, who);
            assert_eq!((again.has_token(), again.is_capability(), again.is_reading_only()), (who.has_token(), who.is_capability(), who.is_reading_only()));
            assert_eq!(again.token_expires(), who.token_expires());
            assert_eq!(verdicts(&rules, &again), verdicts(&rules, &who), "{who:?}");
        }
    }

    #[test]
    fn a_handover_that_cannot_be_read_is_an_error() {
        for text in ["x", "0", "zz", "00", "c0", "\u{e9}\u{e9}"] {
            assert_eq!(Principal::from_handover(text).unwrap_err().kind(), ErrorKind::BadRequest, "{text}");
        }
        // A claim the server could never have verified is refused as a token's would be.
        let forged = Handover {
            user: Some("anna".into()),
            session: None,
            reading_only: false,
            token: Some(TokenPart { groups: vec![], kn: Some(BTreeMap::from([("write".to_string(), vec!["/x".to_string()])])), exp: None }),
        };
        let text: String = rmp_serde::to_vec(&forged).unwrap().iter().map(|b| format!("{b:02x}")).collect();
        assert!(Principal::from_handover(&text).is_err());
    }
}
