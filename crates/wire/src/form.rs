//! `application/x-www-form-urlencoded`: the encoding of every PubSub
//! parameter, in query strings, POST bodies and `kn_batch` values.
//!
//! Decoding is byte-exact: `%00` yields a NUL, `%ff` a lone 0xFF byte; no
//! UTF-8 validation happens here, because event elements are arbitrary byte
//! strings (PROTOCOL.md section 1).

use kn_journal::Event;

use crate::{Error, ErrorKind};

/// The parameters that steer a request and never become event elements
/// (PROTOCOL.md section 3).
/// `kn_token` (a bearer token, docs/ACCESS.md) is one too: a token is
/// never stored in an event.
pub const CONTROL_PARAMETERS: [&str; 8] =
    ["do_method", "kn_from", "kn_to", "kn_debug", "kn_status_from", "kn_status_to", "kn_response_format", "kn_token"];

/// True when `name` is one of the [`CONTROL_PARAMETERS`].
pub fn is_control_parameter(name: &[u8]) -> bool {
    CONTROL_PARAMETERS.iter().any(|c| c.as_bytes() == name)
}

/// Form parameters: `(name, value)` byte pairs in the order they were sent,
/// repeated names included.
///
/// The PubSub rule for a repeated name is that the first value wins
/// ([`Params::get`]); [`Params::get_all`] still sees every value.
///
/// ```
/// use kn_wire::form::Params;
///
/// let p = Params::parse(b"dup=1;dup=2&kn_payload=a+b").unwrap();
/// assert_eq!(p.get("dup"), Some(&b"1"[..]));
/// assert_eq!(p.get_all("dup").collect::<Vec<_>>(), [&b"1"[..], &b"2"[..]]);
/// assert_eq!(p.get("kn_payload"), Some(&b"a b"[..]));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Params {
    /// No parameters.
    pub fn new() -> Params {
        Params::default()
    }

    /// Parses urlencoded form data (see [`parse`]).
    pub fn parse(input: &[u8]) -> Result<Params, Error> {
        Ok(Params { pairs: parse(input)? })
    }

    /// Parses urlencoded form data (see [`parse`]) holding at most `max`
    /// pairs: one more is an error of kind [`ErrorKind::TooManyElements`]
    /// (413), found before any pair past the limit is decoded.
    ///
    /// ```
    /// use kn_wire::{form::Params, ErrorKind};
    /// assert_eq!(Params::parse_at_most(b"a=1&b=2&&c", 3).unwrap().len(), 3);
    /// assert_eq!(Params::parse_at_most(b"a=1&b=2&c", 2).unwrap_err().kind(), ErrorKind::TooManyElements);
    /// ```
    pub fn parse_at_most(input: &[u8], max: usize) -> Result<Params, Error> {
        let mut out = Vec::new();
        for pair in raw_pairs(input) {
            if out.len() == max {
                return Err(Error::new(
                    ErrorKind::TooManyElements,
                    format!("more than {max} form elements (KN_MAX_FORM_ELEMENTS)"),
                ));
            }
            out.push(parse_pair(pair)?);
        }
        Ok(Params { pairs: out })
    }

    /// Appends one pair.
    pub fn push(&mut self, name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.pairs.push((name.into(), value.into()));
    }

    /// Appends every pair of `other`, after the existing ones.
    pub fn extend(&mut self, other: Params) {
        self.pairs.extend(other.pairs);
    }

    /// The first value of `name`, if the name was sent at all.
    pub fn get(&self, name: impl AsRef<[u8]>) -> Option<&[u8]> {
        let name = name.as_ref();
        self.pairs.iter().find(|(n, _)| n.as_slice() == name).map(|(_, v)| v.as_slice())
    }

    /// The first value of `name` as text (invalid UTF-8 replaced by U+FFFD).
    pub fn get_str(&self, name: impl AsRef<[u8]>) -> Option<String> {
        self.get(name).map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// Every value of `name`, in the order sent.
    pub fn get_all<'a>(&'a self, name: impl AsRef<[u8]> + 'a) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.pairs.iter().filter(move |(n, _)| n.as_slice() == name.as_ref()).map(|(_, v)| v.as_slice())
    }

    /// True if `name` was sent (even with an empty value).
    pub fn contains(&self, name: impl AsRef<[u8]>) -> bool {
        self.get(name).is_some()
    }

    /// Every pair, in the order sent.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.pairs.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))
    }

    /// Each distinct name once, with its first value, in order of first
    /// appearance: what becomes the elements of an event.
    pub fn first_values(&self) -> Vec<(&[u8], &[u8])> {
        let mut seen = std::collections::HashSet::new();
        self.iter().filter(|(name, _)| seen.insert(*name)).collect()
    }

    /// The event elements the parameters carry: the first value of every
    /// name that is not one of [`CONTROL_PARAMETERS`].
    ///
    /// ```
    /// use kn_wire::form::Params;
    ///
    /// let event = Params::parse(b"kn_to=/a;kn_payload=x;dup=1;dup=2").unwrap().elements();
    /// assert_eq!(event.get("dup"), Some(&b"1"[..]));
    /// assert_eq!(event.payload(), b"x");
    /// assert!(!event.contains("kn_to"));
    /// ```
    pub fn elements(&self) -> Event {
        Event::from_pairs(self.first_values().into_iter().filter(|(name, _)| !is_control_parameter(name)))
    }

    /// The number of pairs (repeated names counted each time).
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// True when no parameter at all was sent.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The pairs themselves.
    pub fn into_pairs(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.pairs
    }
}

impl<N: Into<Vec<u8>>, V: Into<Vec<u8>>> FromIterator<(N, V)> for Params {
    fn from_iter<I: IntoIterator<Item = (N, V)>>(iter: I) -> Params {
        Params { pairs: iter.into_iter().map(|(n, v)| (n.into(), v.into())).collect() }
    }
}

/// Parses urlencoded form data into ordered `(name, value)` pairs.
///
/// Both `&` and `;` separate pairs; empty pairs are skipped; a pair without
/// `=` is a name with an empty value; `+` is a space; `%XX` (either case)
/// is the byte XX. A `%` not followed by two hex digits is an error of kind
/// [`ErrorKind::BadForm`] naming the offending pair.
///
/// ```
/// use kn_wire::form::parse;
///
/// let pairs = parse(b"a=%00%FF;b&c=x+y").unwrap();
/// assert_eq!(pairs[0], (b"a".to_vec(), vec![0x00, 0xff]));
/// assert_eq!(pairs[1], (b"b".to_vec(), b"".to_vec()));
/// assert_eq!(pairs[2], (b"c".to_vec(), b"x y".to_vec()));
/// assert!(parse(b"kn_payload=%zz").is_err());
/// ```
pub fn parse(input: &[u8]) -> Result<Vec<Pair>, Error> {
    raw_pairs(input).map(parse_pair).collect()
}

/// A decoded form parameter: its name and its value, as bytes.
pub type Pair = (Vec<u8>, Vec<u8>);

/// The undecoded `name=value` pairs of `input`: split at `&` and `;`, empty
/// ones dropped.
fn raw_pairs(input: &[u8]) -> impl Iterator<Item = &[u8]> {
    input.split(|&b| b == b'&' || b == b';').filter(|pair| !pair.is_empty())
}

fn parse_pair(pair: &[u8]) -> Result<Pair, Error> {
    let (name, value) = match pair.iter().position(|&b| b == b'=') {
        Some(i) => (&pair[..i], &pair[i + 1..]),
        None => (pair, &b""[..]),
    };
    let bad = |at: usize| {
        let escape = &pair[at..pair.len().min(at + 3)];
        Error::new(
            ErrorKind::BadForm,
            format!(
                "bad form parameter '{}': malformed percent escape '{}'",
                crate::show_bytes(pair, 80),
                crate::show_bytes(escape, 3)
            ),
        )
    };
    let name = decode(name).map_err(bad)?;
    let value = decode(value).map_err(|at| bad(name_len(pair) + at))?;
    Ok((name, value))
}

fn name_len(pair: &[u8]) -> usize {
    pair.iter().position(|&b| b == b'=').map_or(pair.len(), |i| i + 1)
}

/// Decodes one urlencoded component; on a malformed escape, returns the
/// offset of its `%`.
fn decode(component: &[u8]) -> Result<Vec<u8>, usize> {
    let mut out = Vec::with_capacity(component.len());
    let mut i = 0;
    while i < component.len() {
        match component[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = component.get(i + 1).and_then(|&b| hex_value(b));
                let lo = component.get(i + 2).and_then(|&b| hex_value(b));
                match (hi, lo) {
                    (Some(hi), Some(lo)) => out.push(hi << 4 | lo),
                    _ => return Err(i),
                }
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    Ok(out)
}

/// Percent-decodes a URL path (no `+` → space rule): what a web server does
/// to produce `PATH_INFO`.
pub fn decode_path(path: &[u8]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if path[i] != b'%' {
            out.push(path[i]);
            i += 1;
            continue;
        }
        let hi = path.get(i + 1).and_then(|&b| hex_value(b));
        let lo = path.get(i + 2).and_then(|&b| hex_value(b));
        let (Some(hi), Some(lo)) = (hi, lo) else {
            return Err(Error::new(
                ErrorKind::BadForm,
                format!("bad path '{}': malformed percent escape at byte {i}", crate::show_bytes(path, 80)),
            ));
        };
        out.push(hi << 4 | lo);
        i += 3;
    }
    Ok(out)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Urlencodes `(name, value)` pairs joined by `&`, for outbound requests
/// (remote notifies, content transforms).
///
/// ```
/// use kn_wire::form::{encode, parse};
///
/// let pairs = [(&b"kn_payload"[..], &b"a b&c\0\xff"[..])];
/// let body = encode(pairs);
/// assert_eq!(body, "kn_payload=a+b%26c%00%FF");
/// assert_eq!(parse(body.as_bytes()).unwrap(), [(b"kn_payload".to_vec(), b"a b&c\0\xff".to_vec())]);
/// ```
pub fn encode<N, V, I>(pairs: I) -> String
where
    N: AsRef<[u8]>,
    V: AsRef<[u8]>,
    I: IntoIterator<Item = (N, V)>,
{
    let mut out = String::new();
    for (name, value) in pairs {
        if !out.is_empty() {
            out.push('&');
        }
        encode_component_into(name.as_ref(), &mut out);
        out.push('=');
        encode_component_into(value.as_ref(), &mut out);
    }
    out
}

/// Urlencodes one name or value: ASCII letters, digits and `-_.~` stay,
/// space becomes `+`, every other byte `%XX` (uppercase hex).
pub fn encode_component(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    encode_component_into(bytes, &mut out);
    out
}

fn encode_component_into(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_at_the_very_end_is_reported_with_the_pair() {
        let err = parse(b"a=1&kn_payload=abc%4").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BadForm);
        assert!(err.to_string().contains("kn_payload=abc%4"), "{err}");
        assert!(err.to_string().contains("'%4'"), "{err}");
    }

    #[test]
    fn malformed_escape_in_a_name_is_an_error() {
        assert!(parse(b"%g1=x").is_err());
    }

    #[test]
    fn path_decoding_keeps_plus() {
        assert_eq!(decode_path(b"/a+b/%CE%BA").unwrap(), b"/a+b/\xce\xba");
        assert!(decode_path(b"/a%2").is_err());
    }
}
