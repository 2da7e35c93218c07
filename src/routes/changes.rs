//! The change feed: `GET /sheets/{sheet_id}/changes` (listChanges), as JSON pages with an
//! optional long-poll (`wait`), or as a stream of Server-Sent Events (`Accept:
//! text/event-stream`).
//!
//! Changes come from the sheet's published snapshot, so only durable ones are shown, through
//! [`actors::Service::read_changes`], which reads them back from the log records that hold them.
//! A follower that is caught up waits on the snapshot's publication signal
//! ([`actors::sheet::Published::subscribe`]): it wakes when a durable write lands and costs
//! nothing while none does. Waiting requests end early when the server begins to stop, and
//! re-check access after every wait, as a new request would.

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header::{self, HeaderValue};
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use actors::service::ChangesError;
use actors::sheet::{Change, PublishedSheet, SheetSnapshot};
use actors::Target;
use futures_util::stream::{self, StreamExt};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api_doc as oa;
use crate::auth::Caller;
use crate::cursor::{CursorCodec, Kind};
use crate::error::{ApiError, Code};
use crate::input::{paging_bound, path_id, query_pairs};
use crate::response::ok;
use crate::routes::sheets::sheet_snapshot;
use crate::state::AppState;
use crate::views::{ChangeView, ChangesView};

/// The longest long-poll `wait`, in seconds.
const MAX_WAIT_SECS: u64 = 30;
/// A stream sends a comment this long after its last line, so proxies keep it open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How often a stream re-checks that its key may still read the sheet.
const RECHECK: Duration = Duration::from_secs(1);
/// A stream ends after this long; the client resumes with `Last-Event-ID`.
const MAX_STREAM: Duration = Duration::from_secs(3600);
/// Most changes one stream event batch reads at once.
const STREAM_BATCH: usize = 500;

/// listChanges: the sheet's changes after a cursor.
#[utoipa::path(
    get,
    path = "/sheets/{sheet_id}/changes",
    operation_id = "listChanges",
    tag = "changes",
    summary = "A sheet's row changes in apply order: created, updated and deleted rows",
    description = "Every change to the sheet's rows, in the order the sheet applied them, \
        durable ones only, with deletes (a subtree delete gives one `row.deleted` per row; a \
        bulk request one change per succeeded item, in item order). `seq` is per sheet, gap-free \
        and the same across restarts. Store `nextCursor` (never null) and ask again; with \
        `wait` the request is held until a change is durable. With `Accept: \
        text/event-stream` the same URL streams the changes as Server-Sent Events (`id:` the \
        cursor after the change, `data:` the Change), a `: keep-alive` comment every 15 s, \
        resumable with `Last-Event-ID`; the stream ends when the key can no longer read the \
        sheet, and after at most one hour.",
    params(
        ("sheet_id" = u64, Path, description = "Sheet id.", example = 10),
        oa::ChangesQuery,
        oa::LastEventId,
    ),
    responses(
        (status = 200, description = "The changes after the cursor (possibly none), and the \
            cursor to continue from. As an event stream: `text/event-stream`.",
            body = ChangesView, content_type = "application/json"),
        oa::ReadErrors,
        (status = 410, response = oa::CursorExpired),
    )
)]
pub async fn list_changes(
    state: web::Data<AppState>,
    req: HttpRequest,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let sheet_id = path_id(&req, "sheet_id")?;
    let page = paging_bound(&req, &state.cursors, Some((Kind::Changes, sheet_id)), 0)?;
    let wait = wait_param(&req)?;
    let stream = wants_event_stream(&req);
    let resume = if stream { last_event_id(&req, &state.cursors, sheet_id)? } else { None };
    let snapshot = sheet_snapshot(&state, &caller, sheet_id)?;
    let published = state
        .reads_of(caller.local)?
        .sheet_published(sheet_id)
        .ok_or_else(|| ApiError::not_found(format!("Sheet {sheet_id}")))?;
    let from = resume.or(page.after).unwrap_or_else(|| snapshot.state.changes.oldest_seq());
    let oldest = snapshot.state.changes.oldest_seq();
    if from < oldest {
        return Err(expired(&state.cursors, sheet_id, oldest));
    }
    if stream {
        return Ok(event_stream(state, caller, sheet_id, published, from));
    }
    let deadline = Instant::now() + Duration::from_secs(wait);
    let mut published_rx = published.subscribe();
    let mut stopping = state.stopping.subscribe();
    let mut caller = caller;
    loop {
        published_rx.borrow_and_update();
        let snapshot = published.load_full();
        let changes = read(&state, caller.local, snapshot, sheet_id, from, page.limit).await?;
        let waited_out = Instant::now() >= deadline || *stopping.borrow();
        if !changes.is_empty() || waited_out {
            let next = changes.last().map_or(from, |c| c.seq + 1);
            let view = ChangesView {
                data: changes.iter().map(ChangeView::new).collect(),
                next_cursor: state.cursors.encode(Kind::Changes, sheet_id, next),
                request_id: caller.request_id.clone(),
            };
            return ok(&view);
        }
        tokio::select! {
            changed = published_rx.changed() => {
                if changed.is_err() {
                    return Err(ApiError::not_found(format!("Sheet {sheet_id}")));
                }
            }
            () = tokio::time::sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
        // As a new request would: a key that lost access during the wait gets the 404.
        caller = still_reading(&state, &caller, sheet_id)
            .ok_or_else(|| ApiError::not_found(format!("Sheet {sheet_id}")))?;
    }
}

/// `wait`: whole seconds, 0 to 30 (422 otherwise).
fn wait_param(req: &HttpRequest) -> Result<u64, ApiError> {
    let mut wait = 0;
    for (name, value) in query_pairs(req) {
        if name == "wait" {
            wait = value.trim().parse::<u64>().ok().filter(|w| *w <= MAX_WAIT_SECS).ok_or_else(
                || {
                    ApiError::validation(
                        vec![json!("query"), json!("wait")],
                        format!(
                            "`wait` must be an integer from 0 to {MAX_WAIT_SECS}, got `{value}`"
                        ),
                        "value_error",
                    )
                },
            )?;
        }
    }
    Ok(wait)
}

/// Whether the client asks for Server-Sent Events.
fn wants_event_stream(req: &HttpRequest) -> bool {
    req.headers()
        .get_all(header::ACCEPT)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| {
            v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

/// `Last-Event-ID`: the cursor after the last event the client received.
fn last_event_id(
    req: &HttpRequest,
    cursors: &CursorCodec,
    sheet_id: u64,
) -> Result<Option<u64>, ApiError> {
    let Some(value) = req.headers().get("last-event-id") else { return Ok(None) };
    let value = value.to_str().unwrap_or_default().trim();
    cursors.decode(value, Kind::Changes, sheet_id).map(Some).map_err(|_| {
        ApiError::validation(
            vec![json!("header"), json!("Last-Event-ID")],
            "`Last-Event-ID` is not the id of an event of this sheet's change stream",
            "value_error",
        )
    })
}

/// The 410 of a position older than the retained changes.
pub(crate) fn expired(cursors: &CursorCodec, sheet_id: u64, oldest: u64) -> ApiError {
    ApiError::new(
        Code::CursorExpired,
        format!(
            "The cursor points before the oldest change sheet {sheet_id} still keeps. Export \
             the sheet and follow from its `Sheet-Changes-Cursor`."
        ),
    )
    .with_detail(json!({"oldestCursor": cursors.encode(Kind::Changes, sheet_id, oldest)}))
}

/// The caller as it stands now, if it may still read the sheet.
fn still_reading(state: &AppState, caller: &Caller, sheet_id: u64) -> Option<Caller> {
    let reads = state.reads_of(caller.local).ok()?;
    let caller = caller.refreshed(reads.directory(), reads.now())?;
    caller.can_read(Target::Sheet(sheet_id)).then_some(caller)
}

/// Up to `limit` changes from `from` on, read off the worker (the log may reach the disk);
/// `local`: for a local read.
async fn read(
    state: &AppState,
    local: bool,
    snapshot: Arc<SheetSnapshot>,
    sheet_id: u64,
    from: u64,
    limit: usize,
) -> Result<Vec<Change>, ApiError> {
    if from >= snapshot.state.changes.next_seq() {
        return Ok(Vec::new());
    }
    let reads = state.reads_of(local)?.to_owned();
    let read = web::block(move || reads.read_changes(&snapshot, Some(from), limit))
        .await
        .map_err(|e| ApiError::internal(format!("reading changes: {e}")))?;
    read.map_err(|e| match e {
        ChangesError::Expired { oldest } => expired(&state.cursors, sheet_id, oldest),
        ChangesError::Other(e) => e.into(),
    })
}

/// What a change stream carries between polls.
struct Follow {
    state: web::Data<AppState>,
    caller: Caller,
    sheet_id: u64,
    published: PublishedSheet,
    published_rx: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
    /// The `seq` of the next change to send.
    next: u64,
    opened: Instant,
    checked: Instant,
    sent: Instant,
    ended: bool,
}

/// The Server-Sent Events response: a comment at once (so the client sees the stream open),
/// then the changes as they become durable.
fn event_stream(
    state: web::Data<AppState>,
    caller: Caller,
    sheet_id: u64,
    published: PublishedSheet,
    from: u64,
) -> HttpResponse {
    let now = Instant::now();
    let follow = Follow {
        published_rx: published.subscribe(),
        stopping: state.stopping.subscribe(),
        state,
        caller,
        sheet_id,
        published,
        next: from,
        opened: now,
        checked: now,
        sent: now,
        ended: false,
    };
    let opening = Bytes::from(format!(": changes of sheet {sheet_id}\n\n"));
    let body =
        stream::once(async move { Ok::<_, actix_web::Error>(opening) })
            .chain(stream::unfold(follow, |f| async move {
                next_event(f).await.map(|(b, f)| (Ok(b), f))
            }));
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        // Compress would buffer the events; this marker makes it leave the stream alone (see
        // `crate::compression`), and the outer layer removes it.
        .insert_header((header::CONTENT_ENCODING, HeaderValue::from_static("identity")))
        .streaming(body)
}

/// The next bytes of a stream, or `None` when it ends.
async fn next_event(mut f: Follow) -> Option<(Bytes, Follow)> {
    loop {
        if f.ended || *f.stopping.borrow() || f.opened.elapsed() >= MAX_STREAM {
            return None;
        }
        if f.checked.elapsed() >= RECHECK {
            f.checked = Instant::now();
            f.caller = still_reading(&f.state, &f.caller, f.sheet_id)?;
        }
        f.published_rx.borrow_and_update();
        let snapshot = f.published.load_full();
        let local = f.caller.local;
        match read(&f.state, local, snapshot, f.sheet_id, f.next, STREAM_BATCH).await {
            Ok(changes) if !changes.is_empty() => {
                let mut out = Vec::new();
                for change in &changes {
                    let id = f.state.cursors.encode(Kind::Changes, f.sheet_id, change.seq + 1);
                    out.extend_from_slice(b"id: ");
                    out.extend_from_slice(id.as_bytes());
                    out.extend_from_slice(b"\ndata: ");
                    serde_json::to_writer(&mut out, &ChangeView::new(change)).ok()?;
                    out.extend_from_slice(b"\n\n");
                }
                f.next = changes.last().map_or(f.next, |c| c.seq + 1);
                f.sent = Instant::now();
                return Some((Bytes::from(out), f));
            }
            Ok(_) => {}
            Err(e) => {
                // Said in the stream, then the end: the client re-syncs as the error asks.
                let envelope = e.body(&f.caller.request_id);
                let mut out = b"event: error\ndata: ".to_vec();
                out.extend_from_slice(&envelope);
                out.extend_from_slice(b"\n\n");
                f.ended = true;
                return Some((Bytes::from(out), f));
            }
        }
        if f.sent.elapsed() >= KEEP_ALIVE {
            f.sent = Instant::now();
            return Some((Bytes::from_static(b": keep-alive\n\n"), f));
        }
        let nap = RECHECK
            .min(KEEP_ALIVE.saturating_sub(f.sent.elapsed()))
            .min(MAX_STREAM.saturating_sub(f.opened.elapsed()));
        tokio::select! {
            changed = f.published_rx.changed() => changed.ok()?,
            () = tokio::time::sleep(nap) => {}
            stop = f.stopping.changed() => stop.ok()?,
        }
    }
}
