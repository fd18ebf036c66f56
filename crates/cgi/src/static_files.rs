//! The pages `serve` hands out outside `/kn`: the built-in pages of
//! `www/` (crate::pages), or a directory given with `--static`, with
//! paths checked so that no request leaves it.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::StatusCode;

use crate::body::{plain, Body};

/// Answers a request for a static file: `405` unless `GET` or `HEAD`.
pub(crate) async fn answer(static_dir: Option<&Path>, request: hyper::Request<Incoming>) -> hyper::Response<Body> {
    let head_request = request.method() == hyper::Method::HEAD;
    if request.method() != hyper::Method::GET && !head_request {
        let mut reply = plain(StatusCode::METHOD_NOT_ALLOWED, "405 Method Not Allowed\n");
        reply.headers_mut().insert(hyper::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return reply;
    }
    let relative = match static_path(request.uri().path()) {
        Ok(r) => r,
        Err(code) => return plain(code, if code == StatusCode::BAD_REQUEST { "400 Bad Request\n" } else { "404 Not Found\n" }),
    };
    let Some(content_type) = content_type(&relative) else {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    let body = match static_dir {
        Some(root) => read_inside(root, &relative).await.map(Bytes::from),
        None => crate::pages::get(&relative).map(Bytes::from_static),
    };
    let Some(body) = body else {
        return plain(StatusCode::NOT_FOUND, "404 Not Found\n");
    };
    let length = body.len();
    let body = if head_request { Body::empty() } else { Body::Full(Some(body)) };
    let mut reply = hyper::Response::new(body);
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    reply.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(length));
    reply
}

/// The contents of `root/relative` if it is a file that really lies inside
/// `root`, read on the blocking pool so that it holds up no other request.
async fn read_inside(root: &Path, relative: &Path) -> Option<Vec<u8>> {
    let (root, relative) = (root.to_path_buf(), relative.to_path_buf());
    let read = move || std::fs::read(find_inside(&root, &relative)?).ok();
    tokio::task::spawn_blocking(read).await.ok().flatten()
}

/// The file a static path names, relative to the static directory:
/// percent-decoded, `index.html` for a directory; `..` segments (plain or
/// percent-encoded), backslashes and NULs are refused (400).
fn static_path(path: &str) -> Result<PathBuf, StatusCode> {
    let decoded = kn_wire::form::decode_path(path.as_bytes()).map_err(|_| StatusCode::BAD_REQUEST)?;
    let decoded = String::from_utf8(decoded).map_err(|_| StatusCode::NOT_FOUND)?;
    if decoded.split('/').any(|segment| segment == "..") || decoded.contains(['\\', '\0']) {
        return Err(StatusCode::BAD_REQUEST);
    }
    let mut relative: PathBuf = decoded.split('/').filter(|s| !s.is_empty() && *s != ".").collect();
    if decoded.ends_with('/') || relative.as_os_str().is_empty() {
        relative.push("index.html");
    }
    Ok(relative)
}

fn content_type(path: &Path) -> Option<&'static str> {
    Some(match path.extension()?.to_str()? {
        "html" | "htm" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "png" => "image/png",
        "svg" => "image/svg+xml",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        _ => return None,
    })
}

/// The path of `root/relative` if it is a file that really lies inside
/// `root` (a symbolic link out of it is not served).
fn find_inside(root: &Path, relative: &Path) -> Option<PathBuf> {
    let path = root.join(relative).canonicalize().ok()?;
    let meta = std::fs::metadata(&path).ok()?;
    if !path.starts_with(root) || !meta.is_file() {
        return None;
    }
    Some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_paths_refuse_traversal() {
        assert_eq!(static_path("/../etc/passwd"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(static_path("/a/%2e%2E/b"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(static_path("/a/..%2Fb"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(static_path("/a%5c..%5cb"), Err(StatusCode::BAD_REQUEST));
        assert_eq!(static_path("/%zz"), Err(StatusCode::BAD_REQUEST));
    }

    #[test]
    fn static_paths_name_files_and_index() {
        assert_eq!(static_path("/"), Ok(PathBuf::from("index.html")));
        assert_eq!(static_path("/docs/"), Ok(PathBuf::from("docs/index.html")));
        assert_eq!(static_path("//a/./b%20c.js"), Ok(PathBuf::from("a/b c.js")));
    }

    #[test]
    fn content_types_by_extension_only() {
        assert_eq!(content_type(Path::new("a.html")), Some("text/html; charset=utf-8"));
        assert_eq!(content_type(Path::new("a.svg")), Some("image/svg+xml"));
        assert_eq!(content_type(Path::new("a.exe")), None);
        assert_eq!(content_type(Path::new("Makefile")), None);
    }
}
