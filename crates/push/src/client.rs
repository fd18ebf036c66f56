//! The sender's HTTP client: ureq over rustls, with the roots it trusts
//! and a resolver that lets it connect only where the push policy allows
//! (a push service's name must resolve to global addresses, as an address
//! literal in an endpoint must be one).

use std::io;
use std::path::Path;
use std::sync::Arc;

use kn_journal::Config;
use ureq::config::Config as UreqConfig;
use ureq::http::Uri;
use ureq::tls::{RootCerts, TlsConfig};
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use crate::PushPolicy;

/// What the resolver's refusal says, so that the sender can tell it from
/// a service that did not answer (a refusal is not retried).
pub(crate) const REFUSED_ADDRESS: &str = "push service refused:";

/// An agent for push requests with `config`'s timeouts and proxy, trusting
/// `roots` (Mozilla's built-in roots when `None`), connecting only to the
/// addresses `policy` allows. Through a proxy (`KN_HTTP_PROXY`) the proxy
/// resolves the push service's name, so the check is the proxy's.
pub(crate) fn agent(config: &Config, policy: &PushPolicy, roots: Option<RootCerts>) -> ureq::Agent {
    let tls = TlsConfig::builder().root_certs(roots.unwrap_or(RootCerts::WebPki)).build();
    let proxy = config.http_proxy.as_ref().and_then(|p| ureq::Proxy::new(p.as_str()).ok());
    let through_proxy = proxy.is_some();
    let ureq_config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(config.remote_timeout))
        .timeout_connect(Some(config.remote_connect_timeout))
        // The store's proxy (KN_HTTP_PROXY) or none, never ureq's
        // default `Proxy::try_from_env()`: in a CGI, `HTTP_PROXY` is
        // the client's `Proxy:` header (httpoxy).
        .proxy(proxy)
        .tls_config(tls)
        .build();
    let resolver = CheckingResolver { policy: policy.clone(), through_proxy };
    ureq::Agent::with_parts(ureq_config, DefaultConnector::new(), resolver)
}

/// The certificates of the PEM file `path` (`KN_PUSH_CA_FILE`), to trust
/// instead of the built-in roots; an error names the file.
pub(crate) fn roots_of_file(path: &Path) -> crate::Result<RootCerts> {
    let bad = |why: String| crate::Error::new(crate::ErrorKind::BadInput, format!("KN_PUSH_CA_FILE '{}': {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(cert)) => certs.push(cert),
            Ok(_) => {}
            Err(e) => return Err(bad(e.to_string())),
        }
    }
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(RootCerts::Specific(Arc::new(certs)))
}

/// ureq's resolver, then only the addresses the policy allows; none left
/// is a refusal naming the addresses.
#[derive(Debug)]
struct CheckingResolver {
    policy: PushPolicy,
    through_proxy: bool,
}

impl Resolver for CheckingResolver {
    fn resolve(&self, uri: &Uri, config: &UreqConfig, timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let resolved = DefaultResolver::default().resolve(uri, config, timeout)?;
        if self.through_proxy {
            return Ok(resolved);
        }
        let mut allowed = self.empty();
        let mut refused = Vec::new();
        for addr in resolved.iter() {
            if self.policy.may_connect(addr.ip()) {
                allowed.push(*addr);
            } else {
                refused.push(addr.ip().to_string());
            }
        }
        if allowed.is_empty() {
            let host = uri.host().unwrap_or("");
            return Err(ureq::Error::Io(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{REFUSED_ADDRESS} '{host}' resolves to {} (loopback, private or otherwise non-global)", refused.join(", ")),
            )));
        }
        Ok(allowed)
    }
}
