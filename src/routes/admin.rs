//! The admin listener (`--admin-addr`): stands in for the web application's account settings,
//! and gives operators the service's events, counts and metrics.
//!
//! Every route needs `Authorization: Bearer <admin token>`, compared in constant time. Bodies
//! are JSON in and out (lists as `{"data": [...]}`), errors are the public API's envelope, and
//! malformed input is the same 422 `validation_failed` body with `loc`s. Every change is a
//! message to the [`actors::DirectoryActor`], so it is logged and made durable like any other
//! write, and the reply leaves only after that.
//!
//! | route | handler |
//! |---|---|
//! | `GET /admin/v1/health` | [`health`] |
//! | `POST /admin/v1/import` | [`import`] |
//! | `POST /admin/v1/keys`, `GET /admin/v1/keys` | [`create_key`], [`list_keys`] |
//! | `POST /admin/v1/keys/{id}/revoke` | [`revoke_key`] |
//! | `PUT /admin/v1/shares` | [`put_share`] |
//! | `PUT /admin/v1/users/{id}/plan` | [`put_plan`] |
//! | `GET /admin/v1/events` | [`list_events`] |
//! | `GET /admin/v1/stats` | [`get_stats`] |
//! | `GET /admin/v1/metrics` | [`get_metrics`] (Prometheus text) |

use actix_web::{web, HttpRequest, HttpResponse};
use actors::directory::fixture::Fixture;
use actors::directory::keys::{self, GrantSpec};
use actors::directory::{CreateKey, Import, RevokeKey, SetPlan, SetShare};
use actors::model::{ApiKey, Millis, Plan, Role, ScopeType, UserId};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, Code};
use crate::input::{body_problem, json_body, paging, path_id, read_body};
use crate::prometheus::Exposition;
use crate::routes::ok;
use crate::server::AppState;
use crate::views::{timestamp, GrantView};

/// Refuse a request without the admin token.
pub fn check_admin(state: &AppState, req: &HttpRequest) -> Result<(), ApiError> {
    let header = req.headers().get("authorization").and_then(|v| v.to_str().ok());
    let given = crate::auth::bearer_token(header).unwrap_or_default();
    // Compare hashes so the comparison's time does not depend on the token's length either.
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(state.admin_token.as_bytes());
    if bool::from(a.as_slice().ct_eq(b.as_slice())) {
        Ok(())
    } else {
        Err(ApiError::new(
            Code::Unauthorized,
            "The admin token is required: send `Authorization: Bearer <token>`.",
        ))
    }
}

/// `GET /admin/v1/health`: 200 once recovery is complete (the listener starts after it), with
/// `status` `ok`, or `degraded` and the `reason` while the data dir takes no writes (reads are
/// served either way).
pub async fn health(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    match state.service.unwritable_reason() {
        None => ok(&json!({"status": "ok"})),
        Some(reason) => ok(&json!({"status": "degraded", "reason": reason})),
    }
}

/// `POST /admin/v1/import`: add a fixture's objects; 422 on an id clash or bad reference.
pub async fn import(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let fixture: Fixture = json_body(&body)?;
    let report = state
        .service
        .directory_actor()
        .send(Import(fixture))
        .await
        .map_err(ApiError::internal)??;
    let counts: serde_json::Map<String, serde_json::Value> =
        report.counts.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    // Generated secrets are returned once, here, and never again.
    let keys: Vec<_> = report
        .issued
        .iter()
        .map(|k| json!({"keyId": k.key_id, "name": k.name, "ownerId": k.owner_id, "secret": k.secret}))
        .collect();
    ok(&json!({"imported": counts, "issuedKeys": keys}))
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

/// Body of `POST /admin/v1/keys`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// The user whose access the key carries.
    pub owner_id: UserId,
    /// A name to recognise the key by.
    pub name: String,
    /// At least one grant; each at most the level the owner holds now.
    pub grants: Vec<GrantSpec>,
    /// RFC 3339; default one year from now.
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// A key as the admin side shows it: never its secret or hash, only the visible prefix.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyView {
    /// Key id.
    pub key_id: u64,
    /// Owner.
    pub owner_id: UserId,
    /// Name.
    pub name: String,
    /// `svc_live_` and the first characters of the secret.
    pub prefix: String,
    /// Grants.
    pub grants: Vec<GrantView>,
    /// `active`, `revoked` or `expired`.
    pub state: &'static str,
    /// Creation time.
    pub created_at: Option<String>,
    /// Expiry, null for never.
    pub expires_at: Option<String>,
}

impl KeyView {
    /// The view of `key` at `now`.
    pub fn new(key: &ApiKey, now: Millis) -> Self {
        KeyView {
            key_id: key.id,
            owner_id: key.owner_id,
            name: key.name.clone(),
            prefix: key.prefix.clone(),
            grants: key.grants.iter().map(GrantView::from).collect(),
            state: key.state(now).as_str(),
            created_at: timestamp(key.created_at),
            expires_at: key.expires_at.and_then(timestamp),
        }
    }
}

/// Check a create-key body's own fields (the owner's rights are the directory's to check) and
/// turn it into the directory's message.
pub fn create_key_message(body: CreateKeyRequest, now: Millis) -> Result<CreateKey, ApiError> {
    let checked =
        keys::check_request_fields(&body.name, &body.grants, body.expires_at.as_deref(), now);
    let (name, expires_at) =
        checked.map_err(|p| body_problem(&[json!(p.field)], p.message, p.kind))?;
    Ok(CreateKey { owner_id: body.owner_id, name, grants: body.grants, expires_at })
}

/// `POST /admin/v1/keys`: 201 `{keyId, secret, prefix, expiresAt}`. The secret is in this
/// response and nowhere else: only its hash is kept. Over-grant: 422 naming the `scopeId`.
pub async fn create_key(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let now = state.service.now();
    let msg = create_key_message(json_body(&body)?, now)?;
    let (key, secret) =
        state.service.directory_actor().send(msg).await.map_err(ApiError::internal)??;
    tracing::info!(key_id = key.id, owner_id = key.owner_id, prefix = %key.prefix, "key created");
    let body = json!({
        "keyId": key.id,
        "secret": secret,
        "prefix": key.prefix,
        "expiresAt": key.expires_at.and_then(timestamp),
    });
    let bytes = serde_json::to_vec(&body).map_err(ApiError::internal)?;
    Ok(HttpResponse::Created().content_type("application/json").body(bytes))
}

/// One optional unsigned integer from the query string (`ownerId`, `after`).
fn query_u64(req: &HttpRequest, name: &str) -> Result<Option<u64>, ApiError> {
    let pairs = crate::input::query_pairs(req)?;
    // The last value of a repeated name wins, as for the public API's queries.
    match pairs.into_iter().rev().find(|(k, _)| k == name) {
        None => Ok(None),
        Some((_, v)) => v.trim().parse::<u64>().map(Some).map_err(|_| {
            ApiError::validation(
                vec![json!("query"), json!(name)],
                format!("`{name}` must be a non-negative integer, got `{v}`"),
                "int_parsing",
            )
        }),
    }
}

/// `GET /admin/v1/keys?ownerId=`: every key (or one owner's), by id, never a secret.
pub async fn list_keys(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let owner = query_u64(&req, "ownerId")?;
    let now = state.service.now();
    let directory = state.service.directory();
    let data: Vec<KeyView> = directory
        .keys
        .values()
        .filter(|k| owner.is_none_or(|o| k.owner_id == o))
        .map(|k| KeyView::new(k, now))
        .collect();
    ok(&json!({"data": data}))
}

/// `POST /admin/v1/keys/{id}/revoke`: immediate (the next request with the key is a 401) and
/// irreversible; 404 for an unknown id.
pub async fn revoke_key(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let id = path_id(&req, "id")?;
    let key =
        state.service.directory_actor().send(RevokeKey(id)).await.map_err(ApiError::internal)??;
    tracing::info!(key_id = key.id, owner_id = key.owner_id, "key revoked");
    ok(&KeyView::new(&key, state.service.now()))
}

// ---------------------------------------------------------------------------------------------
// Shares and plans
// ---------------------------------------------------------------------------------------------

/// A share's role, or `none` to remove the share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ShareRole {
    /// Remove the share.
    None,
    /// Viewer.
    Viewer,
    /// Editor.
    Editor,
    /// Admin.
    Admin,
    /// Owner.
    Owner,
}

impl ShareRole {
    fn role(self) -> Option<Role> {
        match self {
            ShareRole::None => None,
            ShareRole::Viewer => Some(Role::Viewer),
            ShareRole::Editor => Some(Role::Editor),
            ShareRole::Admin => Some(Role::Admin),
            ShareRole::Owner => Some(Role::Owner),
        }
    }
}

/// Body of `PUT /admin/v1/shares` (and its 200 reply).
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShareRequest {
    /// The user.
    pub user_id: UserId,
    /// `project`, `folder` or `sheet`.
    pub scope_type: ScopeType,
    /// The object.
    pub scope_id: u64,
    /// The role, or `none`.
    pub role: ShareRole,
}

/// `PUT /admin/v1/shares`: set a user's role on a project, folder or sheet; role `none` removes
/// the share. The change counts for every key of the user from the next request on.
pub async fn put_share(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let share: ShareRequest = json_body(&body)?;
    if share.scope_type == ScopeType::Account {
        return Err(body_problem(
            &[json!("scopeType")],
            "a share is on a `project`, `folder` or `sheet`",
            "enum",
        ));
    }
    let msg = SetShare {
        user_id: share.user_id,
        scope_type: share.scope_type,
        scope_id: share.scope_id,
        role: share.role.role(),
    };
    state.service.directory_actor().send(msg).await.map_err(ApiError::internal)??;
    tracing::info!(
        user_id = share.user_id,
        scope_type = ?share.scope_type,
        scope_id = share.scope_id,
        role = ?share.role,
        "share set"
    );
    ok(&share)
}

/// Body of `PUT /admin/v1/users/{id}/plan`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanRequest {
    /// `free` or `paid`.
    pub plan: Plan,
}

/// `PUT /admin/v1/users/{id}/plan`: the plan decides row caps and whether reports may run.
pub async fn put_plan(
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let user_id = path_id(&req, "id")?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let PlanRequest { plan } = json_body(&body)?;
    state
        .service
        .directory_actor()
        .send(SetPlan { user_id, plan })
        .await
        .map_err(ApiError::internal)??;
    tracing::info!(user_id, ?plan, "plan set");
    ok(&json!({"userId": user_id, "plan": plan}))
}

// ---------------------------------------------------------------------------------------------
// Events, stats, metrics
// ---------------------------------------------------------------------------------------------

/// `GET /admin/v1/events?after=SEQ&limit=`: internal events in order, resumable by passing the
/// last `seq` seen as `after`. Only events whose log record is durable are shown, so a reader
/// never sees an event a crash could take back.
pub async fn list_events(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let after = query_u64(&req, "after")?.unwrap_or(0);
    let limit = paging(&req, &state.cursors, None)?.limit;
    let events = state.service.events(after, limit);
    let data: Vec<_> = events
        .iter()
        .map(|e| {
            json!({
                "seq": e.seq,
                "type": e.kind,
                "sheetId": e.sheet_id,
                "rowId": e.row_id,
                "at": timestamp(e.at),
            })
        })
        .collect();
    ok(&json!({"data": data}))
}

/// `GET /admin/v1/stats`: `{users, projects, sheets, rows, attachments, attachmentBytes, keys,
/// walLsn}`; `walLsn` is the last durable LSN.
pub async fn get_stats(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let c = state.service.counts();
    ok(&json!({
        "users": c.users,
        "projects": c.projects,
        "sheets": c.sheets,
        "rows": c.rows,
        "attachments": c.attachments,
        "attachmentBytes": c.attachment_bytes,
        "keys": c.keys,
        "walLsn": state.service.durable_lsn(),
    }))
}

/// `GET /admin/v1/metrics`: Prometheus text (version 0.0.4): requests by route and status,
/// request latency, WAL flush latency and batch sizes, LSNs, and the domain's sizes.
pub async fn get_metrics(
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    check_admin(&state, &req)?;
    let counts = state.service.counts();
    let wal = state.service.log_stats();
    let sides = state.service.side_store_sizes();
    let mut e = Exposition::new();

    let requests = state.metrics.requests();
    let statuses: Vec<String> = requests.iter().map(|((_, s), _)| s.to_string()).collect();
    let labels: Vec<[(&str, &str); 2]> = requests
        .iter()
        .zip(&statuses)
        .map(|(((route, _), _), status)| [("route", route.as_str()), ("status", status.as_str())])
        .collect();
    e.counters(
        "sheetd_http_requests_total",
        "HTTP requests served, by route pattern and status.",
        labels.iter().zip(&requests).map(|(l, (_, n))| (&l[..], *n as f64)),
    );
    let (buckets, count, sum) = state.metrics.latency();
    e.histogram(
        "sheetd_http_request_duration_seconds",
        "Time from a request's arrival to its response.",
        crate::metrics::LATENCY_BUCKETS,
        &buckets,
        count,
        sum,
    );

    e.histogram(
        "sheetd_wal_flush_duration_seconds",
        "Time of one group commit of the log (write, flush and fsync).",
        actors::FLUSH_LATENCY_BUCKETS_SECONDS,
        &wal.flush_latency_buckets,
        wal.flushes,
        wal.flush_seconds_total,
    );
    e.counter("sheetd_wal_flushes_total", "Group commits of the log.", wal.flushes as f64);
    e.counter(
        "sheetd_wal_records_flushed_total",
        "Records made durable by group commits (divide by flushes for the mean batch size).",
        wal.records_flushed as f64,
    );
    e.gauge(
        "sheetd_wal_flush_batch_size_max",
        "Most records made durable by one group commit.",
        wal.batch_size_max as f64,
    );
    e.gauge("sheetd_wal_last_lsn", "Highest LSN assigned.", wal.last_lsn as f64);
    e.gauge("sheetd_wal_durable_lsn", "Highest LSN known durable.", wal.durable_lsn as f64);
    e.gauge(
        "sheetd_wal_checkpoint_lsn",
        "LSN of the current checkpoint.",
        wal.checkpoint_lsn as f64,
    );
    e.gauge(
        "sheetd_wal_records_since_checkpoint",
        "Records after the checkpoint: what a restart would replay.",
        wal.records_since_checkpoint as f64,
    );
    e.gauge(
        "sheetd_wal_bytes_since_checkpoint",
        "Payload bytes after the checkpoint.",
        wal.bytes_since_checkpoint as f64,
    );
    e.gauge(
        "sheetd_storage_writable",
        "1 while the data dir takes writes; 0 while they get 503 storage_unavailable.",
        f64::from(u8::from(wal.writable)),
    );
    e.gauge(
        "sheetd_disk_free_bytes",
        "Free bytes on the data dir's file system at the last measurement.",
        wal.free_bytes as f64,
    );
    e.gauge(
        "sheetd_disk_min_free_bytes",
        "The free-space floor below which writes are refused (0: none).",
        wal.min_free_bytes as f64,
    );
    e.gauge(
        "sheetd_wal_disk_bytes",
        "Bytes the log store uses on disk.",
        wal.log_bytes_on_disk as f64,
    );

    e.gauge("sheetd_users", "Users.", counts.users as f64);
    e.gauge("sheetd_projects", "Projects.", counts.projects as f64);
    e.gauge("sheetd_sheets", "Sheets.", counts.sheets as f64);
    e.gauge("sheetd_rows", "Rows in every sheet.", counts.rows as f64);
    e.gauge("sheetd_attachments", "Attachments of live rows.", counts.attachments as f64);
    e.gauge("sheetd_keys", "API keys (any state).", counts.keys as f64);
    e.gauge(
        "sheetd_idempotency_records",
        "Idempotency keys held (completed within the replay window, or in progress).",
        sides.idempotency as f64,
    );
    e.gauge("sheetd_events", "Internal events held in the outbox.", sides.events as f64);

    Ok(HttpResponse::Ok().content_type(crate::prometheus::CONTENT_TYPE).body(e.finish()))
}

/// Register the admin routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let resource = crate::routes::resource;
    cfg.service(resource("/admin/v1/health").route(crate::routes::read().to(health)))
        .service(resource("/admin/v1/import").route(web::post().to(import)))
        .service(
            resource("/admin/v1/keys")
                .route(web::post().to(create_key))
                .route(crate::routes::read().to(list_keys)),
        )
        .service(resource("/admin/v1/keys/{id}/revoke").route(web::post().to(revoke_key)))
        .service(resource("/admin/v1/shares").route(web::put().to(put_share)))
        .service(resource("/admin/v1/users/{id}/plan").route(web::put().to(put_plan)))
        .service(resource("/admin/v1/events").route(crate::routes::read().to(list_events)))
        .service(resource("/admin/v1/stats").route(crate::routes::read().to(get_stats)))
        .service(resource("/admin/v1/metrics").route(crate::routes::read().to(get_metrics)))
        .default_service(web::to(crate::routes::no_route));
}
