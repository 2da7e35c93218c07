//! `POST /webhooks`, `GET /webhooks`, `GET|DELETE /webhooks/{webhook_id}` and
//! `POST /webhooks/{webhook_id}:enable` (X8): a key's subscriptions to a sheet's change feed.
//!
//! A webhook belongs to the key that made it: any other key gets 404, as for an object out of
//! reach. Making one needs read access to the sheet; seeing, deleting and enabling it needs only
//! the key (so a key that lost the sheet can still see why deliveries stopped). Deliveries are
//! `crate::webhooks`'.

use actix_web::{web, HttpRequest, HttpResponse};
use actors::webhook::{Webhook, WebhookChange};
use actors::Target;
use serde::Deserialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::api_doc as oa;
use crate::auth::{Caller, Need};
use crate::cursor::Kind;
use crate::error::ApiError;
use crate::input::{json_body, paging, path_id, read_body};
use crate::response::ok;
use crate::routes::changes::expired;
use crate::state::AppState;
use crate::views::{ListView, WebhookCreatedView, WebhookReplyView, WebhookView};
use crate::webhooks::address::{self, AddressError};
use crate::webhooks::{sign, MAX_PER_KEY};

/// The longest `description`.
const MAX_DESCRIPTION_CHARS: usize = 1000;

/// createWebhook's body (CreateWebhookRequest).
#[derive(Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(example = json!({"sheetId": 10, "url": "https://example.com/hooks/sheetd", "description": "sync to the warehouse"}))]
pub struct CreateWebhookRequest {
    /// The sheet whose changes to deliver; the key must be able to read it.
    #[serde(deserialize_with = "crate::input::integer")]
    #[schema(minimum = 0)]
    sheet_id: u64,
    /// Where to post: `http` or `https`, at most 2,048 characters, no credentials; its host
    /// must resolve to public addresses (unless the server allows private receivers).
    #[schema(max_length = 2048)]
    url: String,
    /// A note for people.
    #[serde(default)]
    #[schema(max_length = 1000)]
    description: Option<String>,
    /// A change-feed cursor of the sheet (listChanges' `nextCursor`): deliveries start there.
    /// Default: the feed's position now, so only later changes are delivered.
    #[serde(default)]
    from: Option<String>,
}

/// The view of `w`, its cursor encoded and its waiting changes counted.
fn view(state: &AppState, w: &Webhook) -> Result<WebhookView, ApiError> {
    let next = state
        .service()?
        .sheet_snapshot(w.sheet_id)
        .map_or(w.cursor, |s| s.state.changes.next_seq());
    let cursor = state.cursors.encode(Kind::Changes, w.sheet_id, w.cursor);
    Ok(WebhookView::new(w, cursor, next.saturating_sub(w.cursor)))
}

/// The caller's webhook `webhook_id` from the path, or 404.
fn own_webhook(state: &AppState, req: &HttpRequest, caller: &Caller) -> Result<Webhook, ApiError> {
    let id = path_id(req, "webhook_id")?;
    state
        .service()?
        .webhooks()
        .get(id)
        .filter(|w| w.key_id == caller.key.id)
        .ok_or_else(|| ApiError::not_found(format!("Webhook {id}")))
}

fn url_problem(msg: impl Into<String>) -> ApiError {
    ApiError::validation(vec![json!("body"), json!("url")], msg, "value_error")
}

/// createWebhook.
#[utoipa::path(
    post,
    path = "/webhooks",
    operation_id = "createWebhook",
    tag = "webhooks",
    summary = "Subscribe a URL to a sheet's changes",
    description = "Deliveries post the sheet's change feed to `url` in messages of up to 100 \
        changes, in order, at least once, signed per Standard Webhooks v1 with the `secret` \
        returned here (and never again); see the `sheetChanges` webhook. They start at `from`, \
        else at the feed's position now. A key holds at most 50 webhooks.",
    request_body = CreateWebhookRequest,
    responses(
        (status = 201, description = "The webhook, with its signing secret (shown this once).",
            body = WebhookCreatedView,
            links(
                ("getCreatedWebhook" = (operation_id = "getWebhook", parameters(
                    ("webhook_id" = "$response.body#/id"),
                ))),
                ("enableCreatedWebhook" = (operation_id = "enableWebhook", parameters(
                    ("webhook_id" = "$response.body#/id"),
                ))),
                ("deleteCreatedWebhook" = (operation_id = "deleteWebhook", parameters(
                    ("webhook_id" = "$response.body#/id"),
                ))),
            )),
        oa::ReadErrors,
        (status = 410, response = oa::CursorExpired),
        (status = 413, response = oa::PayloadTooLarge),
        (status = 503, response = oa::StorageUnavailable),
    )
)]
pub async fn create_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let body = read_body(&req, payload, state.max_body_bytes).await?;
    let parsed: CreateWebhookRequest = json_body(&body)?;
    let url = address::parse(&parsed.url).map_err(|e| url_problem(e.to_string()))?;
    if parsed.description.as_ref().is_some_and(|d| d.chars().count() > MAX_DESCRIPTION_CHARS) {
        return Err(ApiError::validation(
            vec![json!("body"), json!("description")],
            format!("`description` must be at most {MAX_DESCRIPTION_CHARS} characters"),
            "string_too_long",
        ));
    }
    let sheet_id = parsed.sheet_id;
    let what = format!("Sheet {sheet_id}");
    caller.authorize(Target::Sheet(sheet_id), Need::Read, &what)?;
    let service = state.service()?;
    let snapshot = service.sheet_snapshot(sheet_id).ok_or_else(|| ApiError::not_found(&what))?;
    let changes = &snapshot.state.changes;
    let start = match &parsed.from {
        None => changes.next_seq(),
        Some(from) => {
            let seq = state.cursors.decode(from, Kind::Changes, sheet_id).map_err(|_| {
                ApiError::validation(
                    vec![json!("body"), json!("from")],
                    "`from` is not a change-feed cursor of this sheet",
                    "value_error",
                )
            })?;
            if seq < changes.oldest_seq() {
                return Err(expired(&state.cursors, sheet_id, changes.oldest_seq()));
            }
            seq.min(changes.next_seq())
        }
    };
    if !state.webhooks.allow_private {
        match address::resolve(&url, false).await {
            Ok(_) => {}
            Err(AddressError::NotPublic(msg) | AddressError::Malformed(msg)) => {
                return Err(url_problem(msg))
            }
            // A host that does not resolve now may later; every delivery checks again.
            Err(AddressError::Unresolved(_)) => {}
        }
    }
    let secret = sign::generate_secret();
    let shown = sign::show_secret(&secret);
    let (key_id, now) = (caller.key.id, service.now());
    let made = service
        .create_webhook(key_id, MAX_PER_KEY, |id| Webhook {
            id,
            key_id,
            sheet_id,
            url: url.to_string(),
            description: parsed.description,
            secret,
            disabled: None,
            cursor: start,
            in_flight: None,
            last_delivery: None,
            consecutive_failures: 0,
            failing_since: None,
            created_at: now,
        })
        .await?
        .ok_or_else(|| {
            ApiError::validation(
                vec![json!("body")],
                format!("this key has {MAX_PER_KEY} webhooks already; delete one first"),
                "too_many",
            )
        })?;
    let view = WebhookCreatedView {
        webhook: view(&state, &made)?,
        secret: shown,
        request_id: caller.request_id,
    };
    let bytes = serde_json::to_vec(&view).map_err(ApiError::internal)?;
    Ok(HttpResponse::Created().content_type("application/json").body(bytes))
}

/// listWebhooks.
#[utoipa::path(
    get,
    path = "/webhooks",
    operation_id = "listWebhooks",
    tag = "webhooks",
    summary = "The calling key's webhooks, by id",
    params(oa::PageQuery),
    responses(
        (status = 200, description = "A page of webhooks; `nextCursor` is null on the last page.",
            body = ListView<WebhookView>),
        oa::ListErrors,
    )
)]
pub async fn list_webhooks(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let key_id = caller.key.id;
    let page = paging(&req, &state.cursors, Some((Kind::Webhooks, key_id)))?;
    let (webhooks, more) =
        state.service()?.webhooks().page_of_key(key_id, page.after.unwrap_or(0), page.limit);
    let data = webhooks.iter().map(|w| view(&state, w)).collect::<Result<Vec<_>, _>>()?;
    let next_cursor = more
        .then(|| state.cursors.encode(Kind::Webhooks, key_id, webhooks.last().map_or(0, |w| w.id)));
    ok(&ListView { data, next_cursor, request_id: caller.request_id })
}

/// getWebhook.
#[utoipa::path(
    get,
    path = "/webhooks/{webhook_id}",
    operation_id = "getWebhook",
    tag = "webhooks",
    summary = "One of the calling key's webhooks: its status, position and last delivery",
    params(("webhook_id" = u64, Path, description = "Webhook id.", example = 1)),
    responses(
        (status = 200, description = "The webhook.", body = WebhookReplyView),
        oa::ReadErrors,
    )
)]
pub async fn get_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let w = own_webhook(&state, &req, &caller)?;
    ok(&WebhookReplyView { webhook: view(&state, &w)?, request_id: caller.request_id })
}

/// deleteWebhook.
#[utoipa::path(
    delete,
    path = "/webhooks/{webhook_id}",
    operation_id = "deleteWebhook",
    tag = "webhooks",
    summary = "Remove a webhook; its deliveries stop",
    params(("webhook_id" = u64, Path, description = "Webhook id.", example = 1)),
    responses(
        (status = 204, description = "Removed."),
        oa::ReadErrors,
        (status = 503, response = oa::StorageUnavailable),
    )
)]
pub async fn delete_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let w = own_webhook(&state, &req, &caller)?;
    state.service()?.change_webhook(WebhookChange::Delete { id: w.id }).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// enableWebhook.
#[utoipa::path(
    post,
    path = "/webhooks/{webhook_id}:enable",
    operation_id = "enableWebhook",
    tag = "webhooks",
    summary = "Resume a disabled webhook where it stopped",
    description = "A disabled webhook resumes from its `cursor`, with its failure count reset; \
        an active one is returned as it is. 410 `cursor_expired` when the feed no longer holds \
        the changes after its cursor.",
    params(("webhook_id" = u64, Path, description = "Webhook id.", example = 1)),
    responses(
        (status = 200, description = "The webhook, active.", body = WebhookReplyView),
        oa::ReadErrors,
        (status = 410, response = oa::CursorExpired),
        (status = 503, response = oa::StorageUnavailable),
    )
)]
pub async fn enable_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let w = own_webhook(&state, &req, &caller)?;
    let service = state.service()?;
    if !w.is_active() {
        if let Some(snapshot) = service.sheet_snapshot(w.sheet_id) {
            let oldest = snapshot.state.changes.oldest_seq();
            if w.cursor < oldest {
                return Err(expired(&state.cursors, w.sheet_id, oldest));
            }
        }
        service.change_webhook(WebhookChange::Enable { id: w.id }).await?;
    }
    let w = service
        .webhooks()
        .get(w.id)
        .ok_or_else(|| ApiError::not_found(format!("Webhook {}", w.id)))?;
    ok(&WebhookReplyView { webhook: view(&state, &w)?, request_id: caller.request_id })
}
