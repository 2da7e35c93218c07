//! The admin listener (`--admin-addr`): stands in for the web application's account settings,
//! and gives operators the service's events, counts and metrics.
//!
//! Every route needs `Authorization: Bearer <admin token>`: each handler takes an
//! [`AdminCaller`], which checks it (in constant time) before the handler runs. Bodies are JSON
//! in and out (lists as `{"data": [...]}`, the shapes in [`crate::views`]), errors are the
//! public API's envelope, and malformed input is the same 422 `validation_failed` body with
//! `loc`s. Key rules are [`actors::directory::keys`]'s, shared with the CLI and fixtures. Every
//! change is a message to the [`actors::DirectoryActor`], so it is logged and made durable like
//! any other write, and the reply leaves only after that.
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
//! | `GET /admin/v1/backup` | [`get_backup`] (a backup file, streamed) |
//! | `GET /admin/v1/cluster/digest` | [`get_digest`] (the state's digest at one position) |
//! | `POST /admin/v1/cluster/nodes` | [`add_node`] (a membership change) |
//! | `DELETE /admin/v1/cluster/nodes/{id}` | [`remove_node`] (a membership change) |

use actix_web::{web, HttpRequest, HttpResponse};
use actors::directory::fixture::Fixture;
use actors::directory::keys::{self, GrantSpec};
use actors::directory::{CreateKey, Import, RevokeKey, SetPlan, SetShare};
use actors::model::{Millis, Plan, Role, ScopeType, UserId};
use actors::replica::{Action, ChangeError, MembershipChange, Peer, Phase};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::AdminCaller;
use crate::error::{ApiError, Code};
use crate::input::{body_problem, json_body, paging, path_id, read_body};
use crate::response::ok;
use crate::routing::{no_route, read, resource};
use crate::state::AppState;
use crate::views::{
    AdminListView, CreatedKeyView, EventView, HealthView, ImportView, KeyView, PlanView, StatsView,
};

/// `GET /admin/v1/health`: 200 once recovery is complete (the listener starts after it), with
/// `status` `ok`, or `degraded` and the `reason` while the data dir takes no writes (reads are
/// served either way) or the log archive is behind because of an error; `archive` shows the
/// archive's position, lag and last error.
///
/// On a cluster node it adds `cluster`: the node's role, the leader it follows, and whether
/// it serves the API from its own state; `status` is `degraded` while no leader is known.
pub async fn health(_: AdminCaller, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let service = state.try_service();
    let reason = service.and_then(|s| s.unwritable_reason());
    let Some(cluster) = &state.cluster else {
        return ok(&HealthView::new(reason, service.and_then(|s| s.archive_status())));
    };
    // A cluster node's archive is its committed log's, on a follower too.
    let archive = cluster.archive_status();
    let status = cluster.status();
    let reason = reason.or_else(|| status.leader.is_none().then(|| "no leader is known".into()));
    let view = HealthView::new(reason, archive);
    let mut view = serde_json::to_value(view).map_err(ApiError::internal)?;
    view["cluster"] = json!({
        "nodeId": status.node_id,
        "role": status.role,
        "leaderId": status.leader,
        "serving": state.try_service().is_some(),
    });
    Ok(HttpResponse::Ok().json(view))
}

/// `GET /admin/v1/cluster`: what this node knows of its cluster (docs/spec/cluster.md,
/// "Membership"); answers also while no leader is known. 404 on a node that is not in one.
pub async fn get_cluster(
    _: AdminCaller,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::not_found("A cluster (this node runs alone)"));
    };
    let status = cluster.status();
    let commit = status.commit_index;
    let nodes: Vec<serde_json::Value> = status
        .members
        .iter()
        .map(|m| {
            let applied = if m.id == status.node_id { status.applied_index } else { m.matched };
            json!({
                "id": m.id,
                "raftAddr": m.node.raft_addr,
                "apiAddr": m.node.api_addr,
                "role": m.role,
                "voter": m.voter,
                "reachable": m.id == status.node_id || m.last_heard_ms.is_some_and(|ms| ms < 1000),
                "appliedIndex": applied,
                "lag": match (commit, applied) {
                    (Some(c), Some(a)) => Some(c.saturating_sub(a)),
                    _ => None,
                },
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "nodeId": status.node_id,
        "groupId": status.group,
        "term": status.term,
        "leaderId": status.leader,
        "commitIndex": commit,
        "nodes": nodes,
        "membershipChange": cluster.membership_change().as_ref().map(change_view),
        // Beyond the contract's fields (additive): where this node's snapshot and log begin.
        "snapshotIndex": status.snapshot_index,
        "purgedIndex": status.purged_index,
    })))
}

/// A membership change as the contract shows it.
fn change_view(change: &MembershipChange) -> serde_json::Value {
    json!({
        "nodeId": change.node_id,
        "action": match change.action { Action::Add => "add", Action::Remove => "remove" },
        "phase": match change.phase {
            Phase::CatchingUp => "catching_up",
            Phase::Joint => "joint",
            Phase::Done => "done",
            Phase::Failed => "failed",
        },
        "detail": change.detail,
    })
}

/// The answer to a membership change refused before it started.
fn change_refused(e: ChangeError) -> ApiError {
    match e {
        ChangeError::NotLeader { leader } => crate::error::cluster_unavailable(
            actors::error::ClusterOutcome::NotApplied,
            leader,
            "Membership changes run on the leader: send this to the node `leaderId` names.",
        ),
        ChangeError::Unknown(id) => ApiError::not_found(format!("Node {id} in this cluster")),
        e @ (ChangeError::Busy(_)
        | ChangeError::Member(_)
        | ChangeError::FormerMember(_)
        | ChangeError::LastVoter(_)) => ApiError::new(
            Code::MembershipConflict,
            format!("The membership cannot change so: {e}."),
        ),
    }
}

/// A node to add, as `POST /admin/v1/cluster/nodes` takes it.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NewNode {
    id: std::num::NonZeroU64,
    raft_addr: std::net::SocketAddr,
    api_addr: std::net::SocketAddr,
}

/// `POST /admin/v1/cluster/nodes`: adds a node, started with `--join`, as a learner that
/// catches up and then a voter; 202 with the change, which `GET /admin/v1/cluster` follows.
pub async fn add_node(
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::not_found("A cluster (this node runs alone)"));
    };
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let node: NewNode = json_body(&body)?;
    let peer = Peer { raft_addr: node.raft_addr.to_string(), api_addr: node.api_addr.to_string() };
    match cluster.add_member(node.id.get(), peer) {
        Ok(change) => {
            Ok(HttpResponse::Accepted().json(json!({ "membershipChange": change_view(&change) })))
        }
        Err(ChangeError::NotLeader { leader }) => {
            on_leader(cluster, &req, body.to_vec(), leader).await
        }
        Err(e) => Err(change_refused(e)),
    }
}

/// `DELETE /admin/v1/cluster/nodes/{id}`: removes a member; 202 with the change.
pub async fn remove_node(
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let Some(cluster) = &state.cluster else {
        return Err(ApiError::not_found("A cluster (this node runs alone)"));
    };
    let id = path_id(&req, "id")?;
    match cluster.remove_member(id) {
        Ok(change) => {
            Ok(HttpResponse::Accepted().json(json!({ "membershipChange": change_view(&change) })))
        }
        Err(ChangeError::NotLeader { leader }) => {
            on_leader(cluster, &req, Vec::new(), leader).await
        }
        Err(e) => Err(change_refused(e)),
    }
}

/// A membership change sent to a node that does not lead: run on the leader (one hop), as
/// every admin request of a cluster may reach any node.
async fn on_leader(
    cluster: &actors::replica::ClusterDomain,
    req: &HttpRequest,
    body: Vec<u8>,
    leader: Option<u64>,
) -> Result<HttpResponse, ApiError> {
    match crate::forward::admin_to_leader(cluster, req, body).await {
        Some(answer) => answer,
        None => Err(change_refused(ChangeError::NotLeader { leader })),
    }
}

/// `POST /admin/v1/import`: add a fixture's objects; 422 on an id clash or bad reference.
pub async fn import(
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let fixture: Fixture = json_body(&body)?;
    let report = state
        .service()?
        .directory_actor()
        .send(Import(fixture))
        .await
        .map_err(ApiError::internal)??;
    // Generated secrets are returned once, here, and never again.
    ok(&ImportView::from(&report))
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
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let now = state.service()?.now();
    let msg = create_key_message(json_body(&body)?, now)?;
    let (key, secret) =
        state.service()?.directory_actor().send(msg).await.map_err(ApiError::internal)??;
    tracing::info!(key_id = key.id, owner_id = key.owner_id, prefix = %key.prefix, "key created");
    let bytes =
        serde_json::to_vec(&CreatedKeyView::new(&key, secret)).map_err(ApiError::internal)?;
    Ok(HttpResponse::Created().content_type("application/json").body(bytes))
}

/// One optional unsigned integer from the query string (`ownerId`, `after`).
fn query_u64(req: &HttpRequest, name: &str) -> Result<Option<u64>, ApiError> {
    let pairs = crate::input::query_pairs(req);
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
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let owner = query_u64(&req, "ownerId")?;
    let now = state.service()?.now();
    let directory = state.service()?.directory();
    let data: Vec<KeyView> = directory
        .keys
        .values()
        .filter(|k| owner.is_none_or(|o| k.owner_id == o))
        .map(|k| KeyView::new(k, now))
        .collect();
    ok(&AdminListView { data })
}

/// `POST /admin/v1/keys/{id}/revoke`: immediate (the next request with the key is a 401) and
/// irreversible; 404 for an unknown id.
pub async fn revoke_key(
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let id = path_id(&req, "id")?;
    let key = state
        .service()?
        .directory_actor()
        .send(RevokeKey(id))
        .await
        .map_err(ApiError::internal)??;
    tracing::info!(key_id = key.id, owner_id = key.owner_id, "key revoked");
    ok(&KeyView::new(&key, state.service()?.now()))
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
    /// May read.
    Viewer,
    /// May read and write rows.
    Editor,
    /// Administers the object (no extra API power in v1).
    Admin,
    /// Holds every right on the object.
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
    /// The user given the role; every key of theirs feels it from the next request.
    pub user_id: UserId,
    /// `project`, `folder` or `sheet`.
    pub scope_type: ScopeType,
    /// The id of the project, folder or sheet.
    pub scope_id: u64,
    /// The role, or `none`.
    pub role: ShareRole,
}

/// `PUT /admin/v1/shares`: set a user's role on a project, folder or sheet; role `none` removes
/// the share. The change counts for every key of the user from the next request on.
pub async fn put_share(
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
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
    state.service()?.directory_actor().send(msg).await.map_err(ApiError::internal)??;
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
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let user_id = path_id(&req, "id")?;
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let PlanRequest { plan } = json_body(&body)?;
    state
        .service()?
        .directory_actor()
        .send(SetPlan { user_id, plan })
        .await
        .map_err(ApiError::internal)??;
    tracing::info!(user_id, ?plan, "plan set");
    ok(&PlanView { plan, user_id })
}

// ---------------------------------------------------------------------------------------------
// Events, stats, metrics
// ---------------------------------------------------------------------------------------------

/// `GET /admin/v1/events?after=SEQ&limit=`: internal events in order, resumable by passing the
/// last `seq` seen as `after`. Only events whose log record is durable are shown, so a reader
/// never sees an event a crash could take back.
pub async fn list_events(
    _: AdminCaller,
    state: web::Data<AppState>,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let after = query_u64(&req, "after")?.unwrap_or(0);
    let limit = paging(&req, &state.cursors, None)?.limit;
    let events = state.service()?.events(after, limit);
    ok(&AdminListView { data: events.iter().map(EventView::from).collect() })
}

/// `GET /admin/v1/stats`: `{users, projects, sheets, rows, attachments, attachmentBytes, keys,
/// walLsn}`; `walLsn` is the last durable LSN.
pub async fn get_stats(
    _: AdminCaller,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    ok(&StatsView::new(&state.service()?.counts(), state.service()?.durable_lsn()))
}

/// `GET /admin/v1/metrics`: Prometheus text (version 0.0.4): requests by route and status,
/// request latency, WAL flush latency and batch sizes, LSNs, and the domain's sizes.
pub async fn get_metrics(
    _: AdminCaller,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let text =
        crate::metrics::exposition(&state.metrics, state.try_service(), state.cluster.as_ref());
    Ok(HttpResponse::Ok().content_type(crate::prometheus::CONTENT_TYPE).body(text))
}

/// `GET /admin/v1/backup`: a backup of the running service (`actors::backup`'s file),
/// streamed as it is written. The copies are taken before the answer starts, so a refusal is
/// an error envelope; a failure later cuts the stream short, which the file's trailer makes
/// evident to the reader. Writes go on meanwhile; checkpoints wait for the backup to end.
pub async fn get_backup(
    _: AdminCaller,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if let (None, Some(cluster)) = (state.try_service(), &state.cluster) {
        if !cluster.removed() {
            let leader = cluster.status().leader;
            return Err(crate::error::cluster_unavailable(
                actors::error::ClusterOutcome::NotApplied,
                leader,
                "A backup is streamed by the leader: send it to the admin listener of the node \
                 `leaderId` names.",
            )
            .with_detail_field("reason", "not_leader"));
        }
    }
    let copies = state.service()?.backup().await?;
    let position = copies.position();
    let files = vec![(crate::backup::CURSOR_KEY_FILE.to_owned(), state.cursors.key().to_vec())];
    // Four chunks in flight: a slow client holds the writer back, not the server's memory.
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let budget = crate::priority::Budget::new(state.background_cpu_percent);
    let (served, waited) = {
        let (state, also) = (state.clone(), state.clone());
        let waited = move |w: std::time::Duration| {
            let paced = &also.metrics.backup_paced_micros;
            paced.fetch_add(w.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
        };
        (move || state.metrics.served(), waited)
    };
    // A thread of its own, at the lowest priority and paced while requests are served: the
    // writers' latency comes first (see `crate::priority`), and the blocking pool's threads
    // keep their priority.
    let spawned = std::thread::Builder::new().name("sheetd-backup".to_owned()).spawn(move || {
        crate::priority::lower_to_background("backup");
        let failed = tx.clone();
        let out = crate::backup::ChannelWriter::new(tx).paced(budget, served, waited);
        match actors::backup::write(copies, &files, out, &mut |_| {}) {
            Ok(manifest) => tracing::info!(
                position,
                rows = manifest.counts.rows,
                digest = %manifest.digest,
                "backup streamed"
            ),
            Err(e) => {
                tracing::warn!(position, error = %e, "backup stopped");
                let _ = failed.blocking_send(Err(std::io::Error::other(e.to_string())));
            }
        }
    });
    spawned.map_err(|e| ApiError::internal(format!("cannot start the backup's thread: {e}")))?;
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    Ok(HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header(("Backup-Position", position.to_string()))
        // Already compressed block by block; the marker keeps Compress away (see
        // `crate::compression`).
        .insert_header((
            actix_web::http::header::CONTENT_ENCODING,
            actix_web::http::header::HeaderValue::from_static("identity"),
        ))
        .streaming(body))
}

/// `GET /admin/v1/cluster/digest`: `{"appliedIndex", "digest"}`, the state's digest
/// (`actors::digest`) at one log position, taken as a backup takes its copies. Two nodes (or a
/// server and its restored backup) that applied the same position answer the same digest.
///
/// `appliedIndex` is the log position on a single node, and on a cluster node the Raft index
/// of the last entry applied, as `GET /admin/v1/cluster` and `Sheetd-Applied-Index` name it
/// (the entry at index `i` is the record at position `i + 1`).
pub async fn get_digest(
    _: AdminCaller,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let answer = |position: u64, digest: actors::digest::StateDigest| {
        let applied = if state.cluster.is_some() { position.saturating_sub(1) } else { position };
        HttpResponse::Ok().json(json!({"appliedIndex": applied, "digest": digest.to_string()}))
    };
    if let (None, Some(cluster)) = (state.try_service(), &state.cluster) {
        // A follower: the state it applied, without actors.
        if let Some((position, digest)) = cluster.following_digest() {
            return Ok(answer(position, digest));
        }
    }
    let copies = state.service()?.backup().await?;
    let (position, digest) =
        actix_web::rt::task::spawn_blocking(move || actors::backup::digest(copies))
            .await
            .map_err(ApiError::internal)?
            .map_err(ApiError::internal)?;
    Ok(answer(position, digest))
}

/// Register the admin routes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/admin/v1/health").route(read().to(health)))
        .service(resource("/admin/v1/import").route(web::post().to(import)))
        .service(
            resource("/admin/v1/keys")
                .route(web::post().to(create_key))
                .route(read().to(list_keys)),
        )
        .service(resource("/admin/v1/keys/{id}/revoke").route(web::post().to(revoke_key)))
        .service(resource("/admin/v1/shares").route(web::put().to(put_share)))
        .service(resource("/admin/v1/users/{id}/plan").route(web::put().to(put_plan)))
        .service(resource("/admin/v1/events").route(read().to(list_events)))
        .service(resource("/admin/v1/stats").route(read().to(get_stats)))
        .service(resource("/admin/v1/metrics").route(read().to(get_metrics)))
        .service(resource("/admin/v1/backup").route(web::get().to(get_backup)))
        .service(resource("/admin/v1/cluster").route(read().to(get_cluster)))
        .service(resource("/admin/v1/cluster/digest").route(read().to(get_digest)))
        .service(resource("/admin/v1/cluster/nodes").route(web::post().to(add_node)))
        .service(resource("/admin/v1/cluster/nodes/{id}").route(web::delete().to(remove_node)))
        .default_service(web::to(no_route));
}
