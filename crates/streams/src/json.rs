//! JSON mode (Durable Streams section 9.1): a POST body is one message, or
//! an array whose elements are the messages (one level flattened). A
//! record stores its messages as their exact text joined by `,`, so a read
//! is `[` + the records joined by `,` + `]` and no message is re-encoded.

use serde_json::value::RawValue;

use super::{StreamError, StreamErrorKind};

/// True for content types in JSON mode (`application/json`, any case,
/// parameters ignored).
pub fn is_json(content_type: &str) -> bool {
    essence(content_type) == "application/json"
}

/// The media type without parameters, lower case: what content types are
/// compared by.
pub fn essence(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// The messages of a JSON body, each as its exact text. `allow_empty`:
/// an empty array is an empty list (PUT) rather than a `400` (POST).
pub(crate) fn messages(body: &[u8], allow_empty: bool) -> Result<Vec<&str>, StreamError> {
    let bad = |e: serde_json::Error| StreamError::new(StreamErrorKind::BadRequest, format!("the body is not valid JSON: {e}"));
    let raw: &RawValue = serde_json::from_slice(body).map_err(bad)?;
    if raw.get().starts_with('[') {
        let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(bad)?;
        if items.is_empty() && !allow_empty {
            return Err(StreamError::new(StreamErrorKind::BadRequest, "an empty JSON array appends nothing"));
        }
        return Ok(items.into_iter().map(RawValue::get).collect());
    }
    Ok(vec![raw.get()])
}

/// Splits a stored record payload back into its messages.
pub(crate) fn split(payload: &[u8]) -> Vec<String> {
    let mut framed = Vec::with_capacity(payload.len() + 2);
    framed.push(b'[');
    framed.extend_from_slice(payload);
    framed.push(b']');
    serde_json::from_slice::<Vec<&RawValue>>(&framed)
        .map(|v| v.into_iter().map(|m| m.get().to_owned()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nesting comes from requests: a body nested 100,000 deep is checked
    /// as raw text (no frame per level) on a 128 KiB stack, wherever a body
    /// or a stored payload is split into messages; the bridge's values stop
    /// at serde_json's 128 levels, and the text is kept whole as the
    /// payload.
    #[test]
    fn deep_nesting_is_parsed_without_deep_recursion() {
        let depth = 100_000;
        let body = [vec![b'['; depth], vec![b']'; depth]].concat();
        let done = std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || {
                // One message: the array inside the outer one, as its text.
                assert_eq!(messages(&body, false).map(|m| m.len()).ok(), Some(1));
                assert_eq!(split(&body[1..body.len() - 1]).len(), 1);
            })
            .unwrap()
            .join();
        assert!(done.is_ok());
        // A value stops at 128 levels: bounded, whatever the input (a
        // debug build's frames need more than 128 KiB for 128 levels).
        let body = [vec![b'['; depth], vec![b']'; depth]].concat();
        let done = std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                let text = String::from_utf8(body).unwrap();
                let e = crate::bridge::json_to_event("s", crate::Offset::new(1, 0), 0, &text);
                assert!(e.payload() == text.as_bytes(), "kept whole as the payload");
            })
            .unwrap()
            .join();
        assert!(done.is_ok());
    }

    #[test]
    fn one_level_is_flattened() {
        assert_eq!(messages(br#"{"a": 1}"#, false).unwrap(), vec![r#"{"a": 1}"#]);
        assert_eq!(messages(b"[[1,2], [3,4]]", false).unwrap(), vec!["[1,2]", "[3,4]"]);
        assert_eq!(messages(b"[[[1,2,3]]]", false).unwrap(), vec!["[[1,2,3]]"]);
        assert!(messages(b"[]", true).unwrap().is_empty());
        assert_eq!(messages(b"[]", false).unwrap_err().kind(), StreamErrorKind::BadRequest);
        assert_eq!(messages(b"{nope", false).unwrap_err().kind(), StreamErrorKind::BadRequest);
        assert_eq!(split(br#"1,{"b":[2]},"x""#), vec!["1", r#"{"b":[2]}"#, r#""x""#]);
    }
}
