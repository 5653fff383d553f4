//! Bearer-token authentication of the Twin API and the latency predictor's HTTP API, and the
//! loopback rule for writes without a token.
//!
//! Bearer tokens: writes (SyncClusterConfig, PushInstanceState,
//! PushKvEvents, AddTrainingSamples) need `authorization: Bearer <token>` when a token is configured; reads
//! (predictions, forecasts, snapshots, HTTP `/metrics`) need it only when asked to. Health,
//! reflection, `/healthz` and `/readyz` never do (probes carry no secrets).
//!
//! The token comes from a file (`DITTO_AUTH_TOKEN_FILE`, e.g. a mounted Secret) or from the
//! environment (`DITTO_AUTH_TOKEN`), never from a flag value that `ps` shows. It is compared
//! in constant time and never printed: its `Debug` is redacted. A refused call gets
//! UNAUTHENTICATED (gRPC) or 401 (HTTP) before any handler runs, so it changes nothing.
//!
//! Without a token, writes are taken only from loopback peers (the pod itself, in a sidecar):
//! a write from any other address gets PERMISSION_DENIED (gRPC) or 403 (HTTP) naming the
//! ways out, unless `--allow-remote-writes` opts in to today's open behaviour.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::HeaderMap;
use prometheus::IntCounterVec;
use thiserror::Error;
use tonic::Status;
use tonic::body::Body;

use super::gate::Gate;

/// Environment variable holding the path of the token file.
pub const TOKEN_FILE_ENV: &str = "DITTO_AUTH_TOKEN_FILE";
/// Environment variable holding the token itself.
pub const TOKEN_ENV: &str = "DITTO_AUTH_TOKEN";
/// Shortest token accepted, bytes (a guessable token is no protection).
pub const TOKEN_BYTES_MIN: usize = 16;
/// Longest token accepted, bytes.
pub const TOKEN_BYTES_MAX: usize = 4096;

/// The Twin methods that change the mirror.
pub const WRITE_METHODS: [&str; 4] = [
    "SyncClusterConfig",
    "PushInstanceState",
    "PushKvEvents",
    "AddTrainingSamples",
];

/// Why the token could not be loaded.
#[derive(Debug, Error)]
pub enum AuthError {
    /// The token file could not be read.
    #[error("{TOKEN_FILE_ENV} {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Both sources were set.
    #[error("set one of {TOKEN_FILE_ENV} and {TOKEN_ENV}, not both")]
    Both,
    /// The token is unusable (the reason never includes the token).
    #[error("{source_name}: {reason}")]
    Bad {
        /// Where it came from.
        source_name: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// A bearer token (redacted in `Debug`).
#[derive(Clone)]
pub struct BearerToken(Arc<[u8]>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<redacted>)")
    }
}

impl BearerToken {
    /// A token from its text (surrounding whitespace, such as a file's final newline, is
    /// dropped): printable ASCII without spaces, [`TOKEN_BYTES_MIN`]..=[`TOKEN_BYTES_MAX`]
    /// bytes.
    pub fn new(text: &str, source_name: &'static str) -> Result<Self, AuthError> {
        let token = text.trim();
        let token_error = |reason: String| AuthError::Bad {
            source_name,
            reason,
        };
        if !(TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&token.len()) {
            return Err(token_error(format!(
                "the token has {} bytes; it needs {TOKEN_BYTES_MIN} to {TOKEN_BYTES_MAX}",
                token.len()
            )));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(token_error(
                "the token must be printable ASCII without spaces".to_owned(),
            ));
        }
        Ok(Self(Arc::from(token.as_bytes())))
    }

    /// Reads a token file.
    pub fn from_file(path: &Path) -> Result<Self, AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::File {
            path: path.to_owned(),
            source,
        })?;
        Self::new(&text, TOKEN_FILE_ENV)
    }

    /// The token configured by `file` (the path from `DITTO_AUTH_TOKEN_FILE`) or `value`
    /// (`DITTO_AUTH_TOKEN`); None when neither is set.
    pub fn configured(file: Option<&Path>, value: Option<&str>) -> Result<Option<Self>, AuthError> {
        match (file, value) {
            (Some(_), Some(_)) => Err(AuthError::Both),
            (Some(path), None) => Self::from_file(path).map(Some),
            (None, Some(value)) => Self::new(value, TOKEN_ENV).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The `authorization` metadata a client sends with this token, marked sensitive (never
    /// indexed by HTTP/2 header compression, redacted in `Debug`).
    pub fn client_metadata(&self) -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
        let mut text = String::with_capacity(self.0.len() + 7);
        text.push_str("Bearer ");
        text.extend(self.0.iter().map(|&byte| char::from(byte)));
        let mut value = tonic::metadata::MetadataValue::try_from(text)
            .expect("a token is printable ASCII without spaces (checked in BearerToken::new)");
        value.set_sensitive(true);
        value
    }

    /// Whether `authorization` (a header value) is `Bearer <this token>`; constant time in
    /// the token's content.
    pub fn accepts(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let Some(presented) = strip_bearer(value) else {
            return false;
        };
        constant_time_eq(presented, &self.0)
    }
}

/// The credentials after `Bearer ` (the scheme is case-insensitive).
fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}

/// Equality whose time depends only on the lengths, not on where the bytes differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The flag that lets peers other than loopback write without a token.
pub const REMOTE_WRITES_FLAG: &str = "--allow-remote-writes";

/// Who may call what.
#[derive(Clone, Debug, Default)]
pub struct AuthPolicy {
    /// The token; None turns authentication off.
    pub token: Option<BearerToken>,
    /// Whether reads need the token too.
    pub reads: bool,
    /// Without a token: whether peers other than loopback may write ([`REMOTE_WRITES_FLAG`]).
    /// Off by default: writes are then taken only from the pod or host itself.
    pub remote_writes: bool,
}

/// What the policy says about one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allow,
    /// Missing or wrong bearer token (401 / UNAUTHENTICATED).
    Unauthenticated,
    /// A write from a peer other than loopback with no token configured (403 /
    /// PERMISSION_DENIED).
    RemoteWrite,
}

/// The message of a refused remote write, naming the ways out.
pub const REMOTE_WRITE_REFUSED: &str = "writes are accepted only from loopback when no bearer \
     token is configured: configure a token (DITTO_AUTH_TOKEN_FILE or DITTO_AUTH_TOKEN) or \
     start ditto serve with --allow-remote-writes";

/// Whether `ip` is loopback (127.0.0.0/8, ::1, or 127.x mapped into IPv6).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

impl AuthPolicy {
    /// The verdict on a call with these headers from `peer` (None: unknown, treated as
    /// remote); `write` says whether it changes state. With a token the token rule applies;
    /// without one, reads always pass and writes pass from loopback, or from anywhere with
    /// [`AuthPolicy::remote_writes`].
    pub fn verdict(&self, write: bool, headers: &HeaderMap, peer: Option<IpAddr>) -> Verdict {
        if self.token.is_some() {
            return if self.allows(write, headers) {
                Verdict::Allow
            } else {
                Verdict::Unauthenticated
            };
        }
        if write && !self.remote_writes && !peer.is_some_and(is_loopback) {
            return Verdict::RemoteWrite;
        }
        Verdict::Allow
    }

    /// Whether a call with these headers may proceed; `write` says whether it changes the
    /// mirror.
    pub fn allows(&self, write: bool, headers: &HeaderMap) -> bool {
        match &self.token {
            None => true,
            Some(_) if !write && !self.reads => true,
            Some(token) => token.accepts(
                headers
                    .get(http::header::AUTHORIZATION)
                    .map(|value| value.as_bytes()),
            ),
        }
    }

    /// Whether a token is configured.
    pub fn enabled(&self) -> bool {
        self.token.is_some()
    }
}

/// Whether a gRPC path (`/ditto.v1.Twin/PushKvEvents`) names a write method.
pub fn is_write_path(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|method| WRITE_METHODS.contains(&method))
}

/// The authentication gate in front of the gRPC services (`server::gate`): refuses calls
/// the policy does not allow with UNAUTHENTICATED (counted in `rejections` by method) before
/// they reach the service. On the way out it also gives an oversized request message
/// RESOURCE_EXHAUSTED (see `codec`).
#[derive(Clone, Debug)]
pub struct AuthGate {
    policy: Arc<AuthPolicy>,
    rejections: IntCounterVec,
}

impl AuthGate {
    /// Gates by `policy`; refusals are counted in `rejections` (label: method).
    pub fn new(policy: Arc<AuthPolicy>, rejections: IntCounterVec) -> Self {
        Self { policy, rejections }
    }
}

impl Gate for AuthGate {
    type Pass = ();

    fn admit<B>(&self, request: &http::Request<B>) -> Result<(), Box<Status>> {
        let path = request.uri().path();
        let peer = request
            .extensions()
            .get::<tonic::transport::server::TcpConnectInfo>()
            .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
            .map(|addr| addr.ip());
        let verdict = self
            .policy
            .verdict(is_write_path(path), request.headers(), peer);
        if verdict == Verdict::Allow {
            return Ok(());
        }
        let method = path.rsplit('/').next().unwrap_or("");
        let method = if method.len() <= 64 { method } else { "other" };
        self.rejections.with_label_values(&[method]).inc();
        let status = match verdict {
            Verdict::RemoteWrite => Status::permission_denied(REMOTE_WRITE_REFUSED),
            _ => Status::unauthenticated(
                "missing or wrong bearer token (send `authorization: Bearer <token>`)",
            ),
        };
        Err(Box::new(status))
    }

    fn respond((): (), mut response: http::Response<Body>) -> http::Response<Body> {
        super::codec::message_too_large_is_resource_exhausted(&mut response);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-t0ken-0123456789";

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        headers
    }

    #[test]
    fn tokens_are_checked_and_redacted() {
        let token = BearerToken::new(&format!("{SECRET}\n"), TOKEN_ENV).unwrap();
        assert!(!format!("{token:?}").contains(SECRET));
        assert!(token.accepts(Some(format!("Bearer {SECRET}").as_bytes())));
        assert!(token.accepts(Some(format!("bearer {SECRET}").as_bytes())));
        assert!(!token.accepts(Some(format!("Bearer {SECRET}x").as_bytes())));
        assert!(!token.accepts(Some(SECRET.as_bytes())));
        assert!(!token.accepts(Some(b"Bearer ")));
        assert!(!token.accepts(None));
        assert!(BearerToken::new("short", TOKEN_ENV).is_err());
        let err = BearerToken::new("has a space in it!!", TOKEN_ENV).unwrap_err();
        assert!(!err.to_string().contains("space in it"), "{err}");
        assert!(matches!(
            BearerToken::configured(Some(Path::new("/x")), Some(SECRET)),
            Err(AuthError::Both)
        ));
        assert!(BearerToken::configured(None, None).unwrap().is_none());
    }

    #[test]
    fn writes_need_the_token_and_reads_only_when_asked() {
        let token = Some(BearerToken::new(SECRET, TOKEN_ENV).unwrap());
        let good = headers(&format!("Bearer {SECRET}"));
        let bad = headers("Bearer nope-nope-nope-nope");
        let none = HeaderMap::new();
        let writes_only = AuthPolicy {
            token: token.clone(),
            reads: false,
            remote_writes: false,
        };
        assert!(writes_only.allows(true, &good));
        assert!(!writes_only.allows(true, &bad));
        assert!(!writes_only.allows(true, &none));
        assert!(writes_only.allows(false, &none));
        let all = AuthPolicy {
            token,
            reads: true,
            remote_writes: false,
        };
        assert!(!all.allows(false, &none));
        assert!(all.allows(false, &good));
        assert!(AuthPolicy::default().allows(true, &none));
        assert!(is_write_path("/ditto.v1.Twin/PushKvEvents"));
        assert!(is_write_path("/ditto.v1.Twin/SyncClusterConfig"));
        assert!(is_write_path("/ditto.v1.Twin/AddTrainingSamples"));
        assert!(!is_write_path("/ditto.v1.Twin/PredictRouting"));
    }

    #[test]
    fn without_a_token_writes_come_only_from_loopback_unless_opted_in() {
        let none = HeaderMap::new();
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let local6: IpAddr = "::1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.9".parse().unwrap();
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        let open = AuthPolicy::default();
        for peer in [local, local6, mapped] {
            assert_eq!(
                open.verdict(true, &none, Some(peer)),
                Verdict::Allow,
                "{peer}"
            );
        }
        assert_eq!(
            open.verdict(true, &none, Some(remote)),
            Verdict::RemoteWrite
        );
        assert_eq!(open.verdict(true, &none, None), Verdict::RemoteWrite);
        assert_eq!(open.verdict(false, &none, Some(remote)), Verdict::Allow);
        let opted_in = AuthPolicy {
            remote_writes: true,
            ..AuthPolicy::default()
        };
        assert_eq!(opted_in.verdict(true, &none, Some(remote)), Verdict::Allow);
        // With a token the token rule applies, from anywhere.
        let token = AuthPolicy {
            token: Some(BearerToken::new(SECRET, TOKEN_ENV).unwrap()),
            ..AuthPolicy::default()
        };
        let good = headers(&format!("Bearer {SECRET}"));
        assert_eq!(token.verdict(true, &good, Some(remote)), Verdict::Allow);
        assert_eq!(
            token.verdict(true, &none, Some(local)),
            Verdict::Unauthenticated
        );
        assert!(REMOTE_WRITE_REFUSED.contains(REMOTE_WRITES_FLAG));
    }
}
