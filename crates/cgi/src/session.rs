//! Anonymous visitors' sessions (docs/ACCESS.md, "Anonymous visitors"):
//! who a request is, once its `kn_session` cookie is verified, and
//! `do_method=session`, which hands a visitor a session.

use kn_journal::access::{Principal, SESSION_COOKIE};
use kn_journal::Store;
use kn_wire::{status_event, Format, Page};

use crate::request::Request;
use crate::response::Response;

/// Who makes `request`: the principal of its bearer token
/// (crate::bearer; a token refused makes [`Principal::nobody`], but such a
/// request is answered `401` before anything: [`token_principal`]); else
/// the authenticated user; else anonymous, with the session its
/// `kn_session` cookie proves (none when the cookie is absent or does not
/// verify under the store's session key).
pub(crate) fn principal(store: &Store, request: &Request) -> Principal {
    if let Some(token) = request.bearer_token(&store.config().token_cookie) {
        return crate::bearer::principal(store, &token).unwrap_or_else(|_| Principal::nobody());
    }
    match request.remote_user() {
        Some(_) => request.principal(),
        None => store.anonymous_with(request.session_cookie()),
    }
}

/// Who makes `request` ([`principal`]), or the refusal (answered `401`)
/// of a bearer token presented but unusable.
pub(crate) fn checked_principal(store: &Store, request: &Request) -> Result<Principal, crate::bearer::Refused> {
    match request.bearer_token(&store.config().token_cookie) {
        Some(token) => crate::bearer::principal(store, &token),
        None => Ok(principal(store, request)),
    }
}

/// [`checked_principal`] for a server's event loop: `None` (do the
/// request where blocking is fine) for a token whose check needs a
/// public-key signature (ES256, RS256: a few hundred µs, BENCHMARKS.md)
/// and for a refused one (answered by the full path).
pub(crate) fn principal_nowait(store: &Store, request: &Request) -> Option<Principal> {
    if let Some(token) = request.bearer_token(&store.config().token_cookie) {
        if !crate::bearer::is_cheap(store, &token) {
            return None;
        }
    }
    checked_principal(store, request).ok()
}

/// `do_method=session`: a `200 Session` status event whose payload is the
/// visitor's session id (empty for an authenticated user, who needs
/// none). A visitor without a valid session gets a new one, its token in
/// a `Set-Cookie` (`HttpOnly`, `SameSite=Lax`, `Secure` over HTTPS, for
/// the script's path, until the browser closes); one with a valid
/// cookie keeps it.
pub(crate) fn reply(store: &Store, request: &Request, format: Format, page: &Page) -> Response {
    let status_from = request.params().get("kn_status_from");
    let failed = |code, reason, message: String| Response::events(format, page, &[status_event(code, reason, message, status_from)]);
    match session(store, request, format, page) {
        Ok(response) => response,
        Err((code, reason, message)) => failed(code, reason, message)
            .unwrap_or_else(|_| Response::new(crate::response::Head::new(Some(crate::response::Status::new(500, "Internal Server Error")), "text/plain"), Vec::new())),
    }
}

fn session(store: &Store, request: &Request, format: Format, page: &Page) -> Result<Response, (u16, &'static str, String)> {
    let status_from = request.params().get("kn_status_from");
    if request.remote_user().is_some() {
        return respond(format, page, status_event(200, "Session", "", status_from), None);
    }
    let key = store.session_key().map_err(|e| (500, "Internal Server Error", e.message().to_string()))?;
    if let Some(id) = request.session_cookie().and_then(|token| key.verify(token)) {
        return respond(format, page, status_event(200, "Session", id, status_from), None);
    }
    let (id, token) = key.new_session();
    let path = if request.script_name().is_empty() { "/" } else { request.script_name() };
    let secure = if request.server_url().starts_with("https:") { "; Secure" } else { "" };
    let cookie = format!("{SESSION_COOKIE}={token}; Path={path}; HttpOnly; SameSite=Lax{secure}");
    respond(format, page, status_event(200, "Session", id, status_from), Some(cookie))
}

fn respond(format: Format, page: &Page, status: kn_journal::Event, cookie: Option<String>) -> Result<Response, (u16, &'static str, String)> {
    let mut response = Response::events(format, page, &[status]).map_err(|e| (500, "Internal Server Error", e.to_string()))?;
    // Never cached: each answer may set a cookie of its own.
    response.head.headers.push(("Cache-Control".to_string(), "no-store".to_string()));
    if let Some(cookie) = cookie {
        response.head.headers.push(("Set-Cookie".to_string(), cookie));
    }
    Ok(response)
}
