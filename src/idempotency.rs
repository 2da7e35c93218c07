//! `Idempotency-Key` on the four row writes (docs/spec/decisions.md §8).
//!
//! 1. The header is checked (1 to 255 visible ASCII characters, else 422) and the request is
//!    fingerprinted: SHA-256 of method, path, query and body bytes, and of `If-Match` when the
//!    request sends one. A precondition changes what the write does, so the same key with
//!    another `If-Match` is another request (409 `idempotency_key_reused`), not a replay;
//!    without the header the fingerprint is exactly what docs/spec/decisions.md §8 names.
//! 2. The key is claimed in the idempotency store, namespaced by API key: a completed request
//!    with the same fingerprint is replayed byte for byte (after its record is durable), a
//!    different request under the same key is 409 `idempotency_key_reused`, a running one 409
//!    `idempotency_in_progress`.
//! 3. The response is stored in the **same log record** as the write it guards (the sheet
//!    actor renders it through [`actors::sheet::Render`]); an answer decided before any sheet is
//!    reached (404, 403) is stored in a record of its own ([`actors::Service::store_answer`]).
//!    Either way, after a crash the write and its stored response both exist or neither does.
//! 4. If the request ends any other way (5xx), the claim is released so a retry runs again.

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse};
use actors::record::IdemEntry;
use actors::shared::Claim;
use sha2::{Digest, Sha256};

use crate::auth::Caller;
use crate::error::{ApiError, Code};
use crate::response::respond;
use crate::state::AppState;

/// The request header that carries an idempotency key (`Idempotency-Key`).
pub const HEADER: &str = "idempotency-key";

/// A claimed idempotency key; released on drop unless its response was stored or the write
/// was handed to a sheet actor.
pub struct Claimed {
    state: actix_web::web::Data<AppState>,
    /// Whether dropping releases the key; cleared by [`Claimed::hand_off`].
    armed: bool,
    /// The key's namespace.
    pub key_id: u64,
    /// The header value.
    pub idem_key: String,
    /// The request's fingerprint.
    pub fingerprint: [u8; 32],
}

impl Claimed {
    /// The write carrying this key is being queued to its sheet actor, which will store the
    /// response in the write's own record. From here the claim must outlive the request: if
    /// the client disconnects now, releasing the key would let a retry run the write again
    /// before the first one has stored its response. Returns what [`release`] needs when the
    /// write ends without a stored response.
    pub fn hand_off(mut self) -> (u64, String) {
        self.armed = false;
        (self.key_id, std::mem::take(&mut self.idem_key))
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        // A no-op once the response is stored: only an in-progress claim is removed.
        if let (true, Some(service)) = (self.armed, self.state.try_service()) {
            service.release_idempotency_key(self.key_id, &self.idem_key);
        }
    }
}

/// What to do with a write request.
pub enum Begin {
    /// Run it; with `Some`, its response must be stored.
    Run(Option<Claimed>),
    /// Answer with this (a replay).
    Answer(HttpResponse),
}

/// Give back a handed-off key whose write ended without a stored response (a 5xx).
pub fn release(state: &AppState, handed: Option<(u64, String)>) {
    if let (Some((key_id, idem_key)), Some(service)) = (handed, state.try_service()) {
        service.release_idempotency_key(key_id, &idem_key);
    }
}

/// Whether a response of this status is stored for replay (§8): every status below 500 except
/// 401, 429, request-validation 422 and the idempotency 409s (none of which reach this point).
pub fn storable(status: u16) -> bool {
    status < 500
}

/// Whether the outcome of a write the sheet decided is stored for replay: [`storable`], except
/// a 422 the sheet decides from the request alone, which is request validation (§6) in the
/// shape of one (an upsert's `keyColumn` that is no key column of the sheet).
pub fn storable_outcome<T>(status: u16, result: &actors::Result<T>) -> bool {
    storable(status) && !matches!(result, Err(actors::Error::KeyColumn(_)))
}

/// Check the header, fingerprint the request and claim the key.
pub async fn begin(
    state: &actix_web::web::Data<AppState>,
    req: &HttpRequest,
    caller: &Caller,
    body: &[u8],
) -> Result<Begin, ApiError> {
    let Some(raw) = req.headers().get(HEADER) else { return Ok(Begin::Run(None)) };
    let key = raw
        .to_str()
        .ok()
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            ApiError::validation(
                vec!["header".into(), "Idempotency-Key".into()],
                "`Idempotency-Key` must be 1 to 255 visible ASCII characters",
                "value_error",
            )
        })?
        .to_owned();
    let mut hash = Sha256::new();
    let mut parts = vec![
        req.method().as_str().as_bytes(),
        req.path().as_bytes(),
        req.query_string().as_bytes(),
        body,
    ];
    let if_match = req.headers().get_all(actix_web::http::header::IF_MATCH);
    for value in if_match {
        parts.extend([b"if-match".as_slice(), value.as_bytes()]);
    }
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    let fingerprint: [u8; 32] = hash.finalize().into();
    match state.service()?.claim_idempotency_key(caller.key.id, &key, fingerprint) {
        Claim::Fresh => Ok(Begin::Run(Some(Claimed {
            state: state.clone(),
            armed: true,
            key_id: caller.key.id,
            idem_key: key,
            fingerprint,
        }))),
        Claim::Replay(entry, lsn) => {
            state.service()?.visible(lsn).await?;
            Ok(Begin::Answer(replay(&entry)))
        }
        Claim::InProgress => Err(ApiError::new(
            Code::IdempotencyInProgress,
            "A request with this Idempotency-Key is still being processed; retry shortly.",
        )),
        Claim::Reused => Err(ApiError::new(
            Code::IdempotencyKeyReused,
            "This Idempotency-Key was already used for a different request.",
        )),
    }
}

/// The stored response, byte for byte, marked as a replay.
pub fn replay(entry: &IdemEntry) -> HttpResponse {
    let mut res = respond(entry.status, entry.body.clone());
    let headers = res.headers_mut();
    if let Ok(rid) = HeaderValue::from_str(&entry.request_id) {
        headers.insert(HeaderName::from_static("x-request-id"), rid);
    }
    headers
        .insert(HeaderName::from_static("idempotent-replayed"), HeaderValue::from_static("true"));
    res
}

/// Store an error decided before the write reached a sheet (404, 403), in a record of its own,
/// and answer with exactly the stored bytes.
pub async fn store_error(
    state: &actix_web::web::Data<AppState>,
    claim: Claimed,
    err: ApiError,
    request_id: &str,
) -> Result<HttpResponse, ApiError> {
    let status = err.code.status().as_u16();
    if !storable(status) {
        return Err(err);
    }
    let body = err.body(request_id);
    let entry = IdemEntry {
        key_id: claim.key_id,
        idem_key: claim.idem_key.clone(),
        fingerprint: claim.fingerprint,
        status,
        body: body.clone(),
        request_id: request_id.to_owned(),
        completed_at: state.service()?.now(),
    };
    state.service()?.store_answer(entry).await.map_err(ApiError::internal)?;
    // The claim is now a stored response; dropping it releases nothing.
    drop(claim);
    Ok(respond(status, body))
}
