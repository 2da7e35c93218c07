//! Authentication and the one authorization function.
//!
//! The request middleware resolves the bearer key once (it needs it for rate limiting) and
//! leaves an [`Authn`] in the request; the [`Caller`] extractor turns "no usable key" into the
//! single 401. [`Caller::authorize`] is the only place a handler decides access: it asks the
//! directory for the effective role and answers 404 (not readable, identical to missing) or 403
//! (readable, not writable).
//!
//! The admin API has one credential, the admin token, and no roles: the [`AdminCaller`]
//! extractor admits a request bearing it and answers 401 otherwise, before the handler runs.

use std::future::{ready, Ready};
use std::sync::Arc;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use actors::directory::keys;
use actors::model::{ApiKey, KeyState, Millis, Role};
use actors::{DirectoryState, Target};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, Code};

/// The request id, set by the request middleware.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

impl FromRequest for RequestId {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(Ok(req
            .extensions()
            .get::<RequestId>()
            .cloned()
            .unwrap_or_else(|| RequestId(String::new()))))
    }
}

/// What the middleware found about the caller's key.
#[derive(Clone)]
pub struct Authn {
    /// The usable key, if the request carried one.
    pub key: Option<ApiKey>,
    /// The directory the key was found in (used for every decision of this request).
    pub directory: Arc<DirectoryState>,
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The usable key of a `Authorization: Bearer <key>` header, if any. Every failure is the same
/// `None`: the 401 never says whether the token's shape was recognized.
pub fn resolve_key(
    header: Option<&str>,
    directory: &DirectoryState,
    now: Millis,
) -> Option<ApiKey> {
    let token = bearer_token(header)?;
    if !keys::is_valid_secret(token) {
        return None;
    }
    let key = directory.key_by_hash(&keys::hash_secret(token))?;
    (key.state(now) == KeyState::Active).then(|| key.clone())
}

/// What a request needs on its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Viewer level.
    Read,
    /// Editor level.
    Write,
}

/// An authenticated caller.
#[derive(Clone)]
pub struct Caller {
    /// The key that authenticated the request; its grants and owner decide access.
    pub key: ApiKey,
    /// The directory this request decides by.
    pub directory: Arc<DirectoryState>,
    /// The request's id (`X-Request-Id`), for error bodies and log lines.
    pub request_id: String,
    /// Whether the request is a local read ([`LocalRead`]): its handler reads with
    /// `AppState::reads_of(caller.local)`.
    pub local: bool,
}

/// Marks a request the middleware answers as a local read (`Sheetd-Consistency: local`).
#[derive(Clone, Copy, Debug)]
pub struct LocalRead;

impl Caller {
    /// The effective role on `target`, or 404 / 403 as the contract says. `what` names the
    /// target in the 404 message (the same text whether missing or out of reach).
    pub fn authorize(&self, target: Target, need: Need, what: &str) -> Result<Role, ApiError> {
        match self.directory.effective_role(&self.key, target) {
            None => Err(ApiError::not_found(what)),
            Some(role) if need == Need::Write && role < Role::Editor => Err(ApiError::new(
                crate::error::Code::Forbidden,
                format!("This key can read {} but not write it.", what.to_lowercase()),
            )),
            Some(role) => Ok(role),
        }
    }

    /// The same caller deciding by `directory` (a newer one) at `now`: `None` once its key is
    /// revoked, expired or gone. A long-running response (a change stream) re-checks access
    /// with it, as a new request would.
    pub fn refreshed(&self, directory: Arc<DirectoryState>, now: Millis) -> Option<Caller> {
        let caller = Caller::of_key(self.key.id, directory, self.request_id.clone(), now)?;
        Some(Caller { local: self.local, ..caller })
    }

    /// The caller of key `key_id` deciding by `directory` at `now`: `None` when the key is
    /// revoked, expired or gone. For work done on a key's behalf outside a request (a
    /// webhook's deliveries), so it is decided as that key's requests are.
    pub fn of_key(
        key_id: actors::model::KeyId,
        directory: Arc<DirectoryState>,
        request_id: String,
        now: Millis,
    ) -> Option<Caller> {
        let key = directory.keys.get(&key_id)?;
        (key.state(now) == KeyState::Active).then(|| Caller {
            key: key.clone(),
            directory: directory.clone(),
            request_id,
            local: false,
        })
    }

    /// Whether `target` is readable (for filtering lists).
    pub fn can_read(&self, target: Target) -> bool {
        self.directory.effective_role(&self.key, target).is_some()
    }
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let ext = req.extensions();
        let request_id = ext.get::<RequestId>().map(|r| r.0.clone()).unwrap_or_default();
        ready(match ext.get::<Authn>() {
            Some(Authn { key: Some(key), directory }) => Ok(Caller {
                key: key.clone(),
                directory: directory.clone(),
                request_id,
                local: ext.get::<LocalRead>().is_some(),
            }),
            _ => Err(ApiError::unauthorized()),
        })
    }
}

/// The admin API's token, as the admin listener's app data. Only its SHA-256 is kept: the
/// comparison runs over two digests of equal length, so its time depends neither on where the
/// first differing byte is nor on the token's length.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
}

impl AdminToken {
    /// The token the admin API accepts.
    pub fn new(token: &str) -> Self {
        AdminToken { digest: Sha256::digest(token.as_bytes()).into() }
    }

    /// Whether `given` is the token, compared in constant time.
    fn admits(&self, given: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        bool::from(given.ct_eq(&self.digest))
    }
}

/// A request that bears the admin token. Every admin handler takes one, so none can forget the
/// check; without the token (or on a listener with no [`AdminToken`]) the request is a 401.
#[derive(Clone, Copy, Debug)]
pub struct AdminCaller;

impl FromRequest for AdminCaller {
    type Error = ApiError;
    type Future = Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let header = req.headers().get("authorization").and_then(|v| v.to_str().ok());
        let given = bearer_token(header).unwrap_or_default();
        let admitted = req.app_data::<web::Data<AdminToken>>().is_some_and(|t| t.admits(given));
        ready(if admitted {
            Ok(AdminCaller)
        } else {
            Err(ApiError::new(
                Code::Unauthorized,
                "The admin token is required: send `Authorization: Bearer <token>`.",
            ))
        })
    }
}
