//! Parsing of path ids, paging queries and JSON bodies into the 422 bodies of the contract.
//!
//! Framework extractors report errors in their own shapes, so requests are read here instead:
//! every problem becomes one `validation_failed` envelope whose `detail` names the place
//! (`["path", "sheet_id"]`, `["query", "limit"]`, `["body", "rows", 3, "version"]`).

use actix_web::{web, HttpRequest};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::cursor::{CursorCodec, CursorError, Kind};
use crate::error::{ApiError, Code};

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page; larger values are clamped.
pub const MAX_LIMIT: usize = 500;

/// An integer id from the path, e.g. `sheet_id`.
pub fn path_id(req: &HttpRequest, name: &str) -> Result<u64, ApiError> {
    let raw = req.match_info().get(name).unwrap_or_default();
    raw.parse::<u64>().map_err(|_| {
        ApiError::validation(
            vec![json!("path"), json!(name)],
            format!("`{name}` must be a non-negative integer, got `{raw}`"),
            "int_parsing",
        )
    })
}

/// The query string as pairs (the last value of a repeated name wins).
pub fn query_pairs(req: &HttpRequest) -> Result<Vec<(String, String)>, ApiError> {
    web::Query::<Vec<(String, String)>>::from_query(req.query_string())
        .map(|q| q.into_inner())
        .map_err(|e| {
            ApiError::validation(
                vec![json!("query")],
                format!("the query string is malformed: {e}"),
                "value_error",
            )
        })
}

/// An integer `limit`; one too large for `i64` is still an integer above the maximum, so it
/// saturates (and is then clamped) instead of being refused.
fn parse_limit(text: &str) -> Option<i64> {
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().unwrap_or(if text.starts_with('-') { i64::MIN } else { i64::MAX }))
}

/// `limit` and `cursor` of a paged request.
#[derive(Debug, Clone, Default)]
pub struct Paging {
    /// Page size, already clamped to 1..=500.
    pub limit: usize,
    /// The decoded cursor position.
    pub after: Option<u64>,
}

/// Parse `limit` (default 100, above 500 clamped, below 1 or not an integer refused) and, when
/// `kind` is given, `cursor` bound to `kind` and `resource`.
pub fn paging(
    req: &HttpRequest,
    codec: &CursorCodec,
    cursor: Option<(Kind, u64)>,
) -> Result<Paging, ApiError> {
    let mut paging = Paging { limit: DEFAULT_LIMIT, after: None };
    for (name, value) in query_pairs(req)? {
        match name.as_str() {
            "limit" => {
                let n = parse_limit(value.trim()).ok_or_else(|| {
                    ApiError::validation(
                        vec![json!("query"), json!("limit")],
                        format!("`limit` must be an integer, got `{value}`"),
                        "int_parsing",
                    )
                })?;
                if n < 1 {
                    return Err(ApiError::validation(
                        vec![json!("query"), json!("limit")],
                        format!("`limit` must be at least 1, got {n}"),
                        "greater_than_equal",
                    ));
                }
                paging.limit = (n as u64).min(MAX_LIMIT as u64) as usize;
            }
            "cursor" => {
                if let Some((kind, resource)) = cursor {
                    let pos = codec.decode(&value, kind, resource).map_err(|e| {
                        let msg = match e {
                            CursorError::Malformed => {
                                "`cursor` is not a cursor this service issued (or it was altered)"
                            }
                            CursorError::WrongPlace => {
                                "`cursor` belongs to another endpoint or resource"
                            }
                        };
                        ApiError::validation(
                            vec![json!("query"), json!("cursor")],
                            msg,
                            "value_error",
                        )
                    })?;
                    paging.after = Some(pos);
                }
            }
            _ => {}
        }
    }
    Ok(paging)
}

impl Paging {
    /// One keyset page of a map ordered by id: the entries after the cursor that `keep`
    /// accepts, at most `limit` of them, and whether more follow.
    pub fn page_of<'a, T>(
        &self,
        items: &'a std::collections::BTreeMap<u64, T>,
        keep: impl Fn(&T) -> bool,
    ) -> (Vec<&'a T>, bool) {
        let start = self.after.map_or(0, |a| a.saturating_add(1));
        let mut page: Vec<&T> =
            items.range(start..).map(|(_, v)| v).filter(|v| keep(v)).take(self.limit + 1).collect();
        let more = page.len() > self.limit;
        page.truncate(self.limit);
        (page, more)
    }
}

/// Read the whole body, refusing one over `limit` bytes with 413 before buffering it whole.
pub async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            Code::PayloadTooLarge,
            format!("The request body exceeds the limit of {limit} bytes."),
        )
        .with_detail(json!({"maxBytes": limit}))
    };
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::validation(
                vec![json!("body")],
                format!("the body could not be read: {e}"),
                "value_error",
            )
        })?;
        if body.len() + chunk.len() > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Parse a JSON body into `T`, naming the place of the first problem.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err(ApiError::validation(
            vec![json!("body")],
            "a JSON body is required",
            "missing",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let mut loc = vec![json!("body")];
        for seg in err.path().iter() {
            match seg {
                serde_path_to_error::Segment::Seq { index } => loc.push(json!(index)),
                serde_path_to_error::Segment::Map { key } => loc.push(json!(key)),
                serde_path_to_error::Segment::Enum { variant } => loc.push(json!(variant)),
                serde_path_to_error::Segment::Unknown => {}
            }
        }
        let inner = err.into_inner();
        let msg = inner.to_string();
        let kind = match inner.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "json_invalid"
            }
            _ if msg.starts_with("missing field") => "missing",
            _ if msg.starts_with("unknown field") => "extra_forbidden",
            _ if msg.starts_with("invalid type") => "type_error",
            _ => "value_error",
        };
        if kind == "missing" {
            if let Some(field) = msg.split('`').nth(1) {
                loc.push(json!(field));
            }
        }
        // serde's messages carry " at line 1 column 9"; the loc already says where.
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_owned();
        ApiError::validation(loc, msg, kind)
    })
}

/// A validation problem at `loc` under the body.
pub fn body_problem(loc: &[Value], msg: impl Into<String>, kind: &str) -> ApiError {
    let mut full = vec![json!("body")];
    full.extend_from_slice(loc);
    ApiError::validation(full, msg, kind)
}
