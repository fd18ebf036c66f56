//! Topic names: validation and canonical form (PROTOCOL.md section 2).

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, ErrorKind};

/// The last segment that makes a topic a journal.
pub const JOURNAL_SEGMENT: &str = "kn_journal";
/// The reserved child topic that holds a topic's routes.
pub const ROUTES_SEGMENT: &str = "kn_routes";
/// The reserved child topic that announces a topic's new children.
pub const SUBTOPICS_SEGMENT: &str = "kn_subtopics";
/// The reserved child topic that tells who is connected to a topic now
/// (docs/PRESENCE.md).
pub const PRESENCE_SEGMENT: &str = "kn_presence";

/// Most segments a topic name may have. Creating a topic announces it in
/// the `kn_subtopics` of each ancestor, so a post's cost grows with the
/// square of its depth: a name 2,000 segments deep once took minutes.
pub const MAX_TOPIC_DEPTH: usize = 64;
/// Longest canonical topic name, in bytes: its directory path must fit in
/// the file system's `PATH_MAX` (4096) below the store root with room
/// for `kn_routes/<id>` and file names.
pub const MAX_TOPIC_BYTES: usize = 1024;
/// Longest segment, in bytes: the file system's `NAME_MAX`.
pub const MAX_SEGMENT_BYTES: usize = 255;

/// A valid topic name in canonical form: a leading `/`, segments separated
/// by single `/`, no trailing `/` (except the root topic `/`).
///
/// A `Topic` can only be made by [`Topic::parse`], so holding one proves the
/// name was checked: it never contains `..`, a segment starting or ending
/// with `.`, a NUL, a backslash or any other byte that could escape the
/// store when the topic becomes a path.
///
/// ```
/// use kn_journal::Topic;
///
/// let t = Topic::parse("what//chat/").unwrap();
/// assert_eq!(t.as_str(), "/what/chat");
/// assert!(!t.is_journal());
/// assert!(Topic::parse("/who/anna/kn_journal").unwrap().is_journal());
/// assert!(Topic::parse("/what/../etc").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Topic(String);

impl Topic {
    /// Checks and canonicalises a topic name given as bytes.
    ///
    /// Errors (kind [`ErrorKind::BadTopic`]) say which rule the name broke.
    pub fn parse_bytes(name: &[u8]) -> Result<Topic, Error> {
        let bad = |why: String| {
            // A name too long to be valid is shown by its start.
            let shown = String::from_utf8_lossy(&name[..name.len().min(MAX_TOPIC_BYTES)]);
            let more = if name.len() > MAX_TOPIC_BYTES { "..." } else { "" };
            Error::new(ErrorKind::BadTopic, format!("bad topic name '{shown}{more}': {why}"))
        };
        let mut canonical = String::with_capacity(name.len().min(MAX_TOPIC_BYTES) + 1);
        for (depth, segment) in name.split(|&b| b == b'/').filter(|s| !s.is_empty()).enumerate() {
            if depth == MAX_TOPIC_DEPTH {
                return Err(bad(format!("more than {MAX_TOPIC_DEPTH} segments")));
            }
            if segment.len() > MAX_SEGMENT_BYTES {
                return Err(bad(format!("a segment of {} bytes, more than {MAX_SEGMENT_BYTES}", segment.len())));
            }
            if canonical.len() + 1 + segment.len() > MAX_TOPIC_BYTES {
                return Err(bad(format!("longer than {MAX_TOPIC_BYTES} bytes")));
            }
            if let Some(&b) = segment.iter().find(|&&b| !allowed_byte(b)) {
                return Err(bad(format!("byte 0x{b:02X} is not allowed in a topic")));
            }
            if segment.first() == Some(&b'.') || segment.last() == Some(&b'.') {
                return Err(bad(format!(
                    "segment '{}' starts or ends with '.'",
                    String::from_utf8_lossy(segment)
                )));
            }
            let segment = std::str::from_utf8(segment)
                .map_err(|_| bad("not valid UTF-8".to_string()))?;
            canonical.push('/');
            canonical.push_str(segment);
        }
        if canonical.is_empty() {
            canonical.push('/');
        }
        Ok(Topic(canonical))
    }

    /// Checks and canonicalises a topic name.
    pub fn parse(name: &str) -> Result<Topic, Error> {
        Topic::parse_bytes(name.as_bytes())
    }

    /// The root topic `/`.
    pub fn root() -> Topic {
        Topic("/".to_string())
    }

    /// The canonical name, always starting with `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path segments, root first (empty for `/`).
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// The last segment, or `None` for the root topic.
    pub fn last_segment(&self) -> Option<&str> {
        self.segments().last()
    }

    /// The parent topic, or `None` for the root topic.
    pub fn parent(&self) -> Option<Topic> {
        if self.is_root() {
            return None;
        }
        let cut = self.0.rfind('/').unwrap_or(0);
        Some(if cut == 0 { Topic::root() } else { Topic(self.0[..cut].to_string()) })
    }

    /// The child topic `self/segment`. The segment must be a valid single
    /// segment.
    pub fn child(&self, segment: &str) -> Result<Topic, Error> {
        if segment.contains('/') {
            return Err(Error::new(ErrorKind::BadTopic, format!("bad topic segment '{segment}': contains '/'")));
        }
        Topic::parse(&format!("{}/{}", self.0, segment))
    }

    /// True for `/`.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// True when the last segment is `kn_journal`.
    pub fn is_journal(&self) -> bool {
        self.last_segment() == Some(JOURNAL_SEGMENT)
    }

    /// True for a `kn_routes`, `kn_subtopics` or `kn_presence` topic,
    /// which clients may not notify.
    pub fn is_reserved(&self) -> bool {
        matches!(self.last_segment(), Some(ROUTES_SEGMENT) | Some(SUBTOPICS_SEGMENT) | Some(PRESENCE_SEGMENT))
    }

    /// True for a `kn_presence` topic (docs/PRESENCE.md).
    pub fn is_presence(&self) -> bool {
        self.last_segment() == Some(PRESENCE_SEGMENT)
    }

    /// `self/kn_presence`.
    pub fn presence(&self) -> Topic {
        self.reserved_child(PRESENCE_SEGMENT)
    }

    /// `self/kn_routes`.
    pub fn routes(&self) -> Topic {
        self.reserved_child(ROUTES_SEGMENT)
    }

    /// `self/kn_subtopics`.
    pub fn subtopics(&self) -> Topic {
        self.reserved_child(SUBTOPICS_SEGMENT)
    }

    fn reserved_child(&self, segment: &str) -> Topic {
        if self.is_root() {
            Topic(format!("/{segment}"))
        } else {
            Topic(format!("{}/{segment}", self.0))
        }
    }

    /// The directory of this topic under a store root. Safe by construction:
    /// every segment was validated.
    pub fn dir(&self, root: &std::path::Path) -> PathBuf {
        let mut dir = root.to_path_buf();
        for segment in self.segments() {
            dir.push(segment);
        }
        dir
    }

    /// Checks that the topic has at most `max_depth` segments and at most
    /// `max_bytes` bytes in its canonical name, not counting a final
    /// `kn_routes` or `kn_subtopics` (which the server adds below any topic
    /// it accepted). Errors (kind [`ErrorKind::BadTopic`]) name the limit
    /// and its `KN_*` variable.
    ///
    /// ```
    /// use kn_journal::Topic;
    /// let t = Topic::parse("/a/b/c").unwrap();
    /// assert!(t.check_size(3, 6).is_ok());
    /// assert!(t.routes().check_size(3, 6).is_ok());
    /// assert!(t.check_size(2, 6).is_err());
    /// assert!(t.check_size(3, 5).is_err());
    /// ```
    pub fn check_size(&self, max_depth: usize, max_bytes: usize) -> Result<(), Error> {
        let name = match self.is_reserved() {
            true => self.parent().map_or_else(|| "/".to_string(), |p| p.0),
            false => self.0.clone(),
        };
        let shown = || match name.char_indices().nth(80) {
            Some((cut, _)) => format!("{}…", &name[..cut]),
            None => name.clone(),
        };
        if name.len() > max_bytes {
            return Err(Error::new(
                ErrorKind::BadTopic,
                format!("topic name '{}' of {} bytes is longer than the maximum of {max_bytes} (KN_MAX_TOPIC_BYTES)", shown(), name.len()),
            ));
        }
        let depth = name.split('/').filter(|s| !s.is_empty()).count();
        if depth > max_depth {
            return Err(Error::new(
                ErrorKind::BadTopic,
                format!("topic '{}' has {depth} segments, more than the maximum of {max_depth} (KN_MAX_TOPIC_DEPTH)", shown()),
            ));
        }
        Ok(())
    }

    /// True when `self` is `other` or lies below it.
    pub fn is_within(&self, other: &Topic) -> bool {
        other.is_root() || self.0 == other.0 || self.0.starts_with(&format!("{}/", other.0))
    }
}

/// Bytes allowed in a topic name besides `/`.
fn allowed_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') || b >= 0x80
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Topic({:?})", self.0)
    }
}

impl std::str::FromStr for Topic {
    type Err = Error;
    fn from_str(s: &str) -> Result<Topic, Error> {
        Topic::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms_agree() {
        for name in ["/foo/", "/foo", "foo", "//foo//", "foo///"] {
            assert_eq!(Topic::parse(name).unwrap().as_str(), "/foo");
        }
        assert_eq!(Topic::parse("").unwrap().as_str(), "/");
        assert_eq!(Topic::parse("///").unwrap().as_str(), "/");
        assert_eq!(Topic::parse("/a//b/c/").unwrap().as_str(), "/a/b/c");
    }

    #[test]
    fn dots_at_segment_edges_are_rejected() {
        for name in [".", "..", "...", "/.foo", "/foo.", "/a/../b", "/a/./b", "/x/.kn_lock"] {
            let err = Topic::parse(name).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadTopic, "{name}");
        }
        assert!(Topic::parse("/a.b/c.d.e").is_ok());
    }

    #[test]
    fn forbidden_bytes_are_rejected() {
        for name in ["/a b", "/a:b", "/a\\b", "/a\0b", "/a\nb", "/a%2e", "/a\x7fb", "/a?b"] {
            assert!(Topic::parse(name).is_err(), "{name:?}");
        }
        assert!(Topic::parse_bytes(b"/a/\xff\xfe").is_err(), "invalid UTF-8");
        assert_eq!(Topic::parse("/what/κόσμε").unwrap().as_str(), "/what/κόσμε");
    }

    #[test]
    fn journals_and_reserved_children() {
        let t = Topic::parse("/who/anna/s/42/kn_journal").unwrap();
        assert!(t.is_journal());
        assert_eq!(t.routes().as_str(), "/who/anna/s/42/kn_journal/kn_routes");
        assert!(t.routes().is_reserved());
        assert_eq!(Topic::root().subtopics().as_str(), "/kn_subtopics");
        assert_eq!(Topic::parse("/a/b").unwrap().parent().unwrap().as_str(), "/a");
        assert_eq!(Topic::parse("/a").unwrap().parent().unwrap().as_str(), "/");
        assert!(Topic::root().parent().is_none());
    }

    #[test]
    fn error_names_the_input() {
        let err = Topic::parse("/what/../x").unwrap_err();
        assert!(err.to_string().contains("/what/../x"), "{err}");
    }
}
