//! Anonymous visitors' sessions (docs/ACCESS.md, "Anonymous visitors"):
//! who a request is, once its `kn_session` cookie is verified, and
//! `do_method=session`, which hands a visitor a session.

use kn_journal::access::{Principal, Site, SESSION_COOKIE};
use kn_journal::Store;
use kn_wire::{status_event, Format, Page};

use crate::request::Request;
use crate::response::Response;

/// Who makes `request`: the principal of its bearer token
/// (crate::bearer; a token refused makes [`Principal::nobody`], but such a
/// request is answered `401` before anything: [`checked_principal`]); else
/// the authenticated user; else anonymous, with the session its
/// `kn_session` cookie proves (none when the cookie is absent or does not
/// verify under the store's session key).
///
/// A credential taken from a cookie (the token's or the session's) only
/// reads unless the request shows it comes from this server's own pages
/// ([`Principal::through_cookie`], docs/ACCESS.md "Cookies and other
/// sites"): this is the one place a `/kn` request's credentials become a
/// principal.
pub(crate) fn principal(store: &Store, request: &Request) -> Principal {
    checked_principal(store, request).unwrap_or_else(|_| Principal::nobody())
}

/// Who makes `request` ([`principal`]), or the refusal (answered `401`)
/// of a bearer token presented but unusable.
pub(crate) fn checked_principal(store: &Store, request: &Request) -> Result<Principal, crate::bearer::Refused> {
    let cookie_name = &store.config().token_cookie;
    if let Some(token) = request.bearer_token(cookie_name) {
        let who = crate::bearer::principal(store, &token)?;
        return Ok(if request.bearer_in_cookie(cookie_name) { who.through_cookie(request.site()) } else { who });
    }
    if request.remote_user().is_some() {
        return Ok(request.principal());
    }
    let who = store.anonymous_with(request.session_cookie());
    Ok(if who.session().is_some() { who.through_cookie(request.site()) } else { who })
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
    // A page of another site never makes or learns a visitor's session
    // (the cookie is for this server's own pages; docs/ACCESS.md).
    if request.site() == Site::Elsewhere {
        let why = "do_method=session from a page of another site: sessions are for this server's own pages \
                   (docs/ACCESS.md, \"Cookies and other sites\")";
        return Err((403, "Forbidden", why.to_string()));
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
