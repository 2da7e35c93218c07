//! Parsing of path ids, paging queries and JSON bodies into the 422 bodies of the contract.
//!
//! Framework extractors report errors in their own shapes, so requests are read here instead:
//! every problem becomes one `validation_failed` envelope whose `detail` names the place
//! (`["path", "sheet_id"]`, `["query", "limit"]`, `["header", "Content-Type"]`,
//! `["body", "rows", 3, "version"]`).
//!
//! # Rules chosen where the contract is silent
//!
//! - A path id is decimal digits only: `+812` is refused like `1.5` (an id has one spelling).
//! - A body must be sent as `application/json` (parameters allowed, a charset only `utf-8`):
//!   a form, multipart or text body is refused before it is read. 415 is not among the
//!   contract's codes, so this is a 422 at `["header", "Content-Type"]`.
//! - A body may be sent with `Content-Encoding: gzip` or `zstd` (see [`crate::compression`]);
//!   the body limit counts its decompressed bytes (and its compressed ones). Any other coding
//!   is a 422 at `["header", "Content-Encoding"]`.
//! - A body is exactly one JSON document: trailing characters other than whitespace (a second
//!   document, `{...} xyz`) make it not JSON.
//! - An integer field of a body accepts an integral JSON number in any spelling (`1187`,
//!   `1187.0`, `1.187e3`), as JSON Schema's `integer` does, from 0 to the documented `int64`
//!   maximum ([`integer`]).
//! - listRows' `fields` is a comma-separated list of column ids, repeats allowed; an empty one
//!   keeps no cell (ids and versions only). Its order does not matter, and neither does the
//!   order of a `filter`'s keys: the cursor binding uses their normalized forms.
//! - An empty `cursor` is not a cursor this service issued: 422, as an altered one (the
//!   document says `minLength: 1`). Treating it as absent would restart a client whose empty
//!   cursor is a bug at page one, over and over.

use std::borrow::Cow;
use std::collections::BTreeSet;

use actix_web::{web, HttpMessage, HttpRequest};
use actors::report::definition::{parse_filter_alone, Filter};
use futures_util::StreamExt;
use serde::de::{DeserializeOwned, Deserializer, Unexpected, Visitor};
use serde_json::{json, Value};

use crate::compression::{BodyDecoder, DecodeError};
use crate::cursor::{CursorCodec, CursorError, Kind};
use crate::error::{ApiError, Code};

/// Default page size.
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page; larger values are clamped.
pub const MAX_LIMIT: usize = 500;

/// An integer id from the path, e.g. `sheet_id`.
pub fn path_id(req: &HttpRequest, name: &str) -> Result<u64, ApiError> {
    let raw = req.match_info().get(name).unwrap_or_default();
    // `u64::from_str` also takes a leading `+`.
    let digits = !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit());
    digits.then(|| raw.parse::<u64>().ok()).flatten().ok_or_else(|| {
        ApiError::validation(
            vec![json!("path"), json!(name)],
            format!("`{name}` must be a non-negative integer, got `{raw}`"),
            "int_parsing",
        )
    })
}

/// The query string as pairs, in order (a reader keeps the last value of a repeated name),
/// percent-decoded (`+` is a space; a bad escape or invalid UTF-8 is kept as text, so no query
/// string is refused here). Borrowed from the request where nothing needed decoding.
pub fn query_pairs(req: &HttpRequest) -> Vec<(Cow<'_, str>, Cow<'_, str>)> {
    url::form_urlencoded::parse(req.query_string().as_bytes()).collect()
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
    paging_bound(req, codec, cursor, 0)
}

/// [`paging`] for a request whose cursor is bound to its query (`binding`, see
/// [`crate::cursor::query_binding`]).
pub fn paging_bound(
    req: &HttpRequest,
    codec: &CursorCodec,
    cursor: Option<(Kind, u64)>,
    binding: u64,
) -> Result<Paging, ApiError> {
    let mut paging = Paging { limit: DEFAULT_LIMIT, after: None };
    for (name, value) in query_pairs(req) {
        match name.as_ref() {
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
                    let pos = codec.decode_bound(&value, kind, resource, binding).map_err(|e| {
                        let msg = match e {
                            CursorError::Malformed => {
                                "`cursor` is not a cursor this service issued (or it was altered)"
                            }
                            CursorError::WrongPlace => {
                                "`cursor` belongs to another endpoint or resource"
                            }
                            CursorError::OtherQuery => {
                                "`cursor` was issued for another `filter` or `fields`; \
                                 pass the ones it came with, or start without a cursor"
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

/// listRows' `fields` and `filter`, parsed but not yet checked against the sheet's columns.
#[derive(Debug, Default)]
pub struct RowQuery {
    /// `fields`: the column ids whose cells to show (`None`: every cell).
    pub fields: Option<BTreeSet<u64>>,
    /// `filter`: the parsed filter (`None`: every row).
    pub filter: Option<Filter>,
    /// What the cursor is bound to: the sorted fields and the filter's JSON with its keys
    /// sorted, so equal queries spelled differently share cursors. Empty for neither.
    pub normalized: String,
}

/// Parse `fields` (comma-separated column ids; empty: no cells) and `filter` (a filter in the
/// shape of docs/spec/decisions.md §7 as JSON, its `column`s column ids) of a listRows request.
pub fn row_query(req: &HttpRequest) -> Result<RowQuery, ApiError> {
    let mut query = RowQuery::default();
    let mut filter_json = None;
    for (name, value) in query_pairs(req) {
        match name.as_ref() {
            "fields" => {
                let ids = value
                    .split(',')
                    .map(str::trim)
                    .filter(|part| !part.is_empty())
                    .map(|part| {
                        let digits = part.bytes().all(|b| b.is_ascii_digit());
                        digits.then(|| part.parse::<u64>().ok()).flatten().ok_or_else(|| {
                            ApiError::validation(
                                vec![json!("query"), json!("fields")],
                                format!(
                                    "`fields` is a comma-separated list of column ids; \
                                     `{part}` is not one"
                                ),
                                "value_error",
                            )
                        })
                    })
                    .collect::<Result<BTreeSet<u64>, ApiError>>()?;
                query.fields = Some(ids);
            }
            "filter" => {
                let problem = |msg: String| {
                    ApiError::validation(vec![json!("query"), json!("filter")], msg, "value_error")
                };
                let raw: Value = serde_json::from_str(&value)
                    .map_err(|e| problem(format!("`filter` is not JSON: {e}")))?;
                let parsed = parse_filter_alone(&raw).map_err(|e| problem(filter_problem(&e)))?;
                query.filter = Some(parsed);
                filter_json = Some(raw);
            }
            _ => {}
        }
    }
    if query.fields.is_some() || filter_json.is_some() {
        let fields = query
            .fields
            .as_ref()
            .map(|f| f.iter().map(u64::to_string).collect::<Vec<_>>().join(","));
        // serde_json's maps are ordered by key, so this text is the same for equal filters.
        query.normalized = json!({"fields": fields, "filter": filter_json}).to_string();
    }
    Ok(query)
}

/// The sentence for a filter refused by the filter compiler: its message, and the reason when
/// the message does not already hold it.
pub fn filter_problem(e: &actors::Error) -> String {
    match e {
        actors::Error::Report { message, detail, .. } => {
            let reason = detail.get("reason").and_then(Value::as_str).unwrap_or_default();
            if reason.is_empty() || message.contains(reason) {
                message.clone()
            } else {
                format!("{} ({reason})", message.trim_end_matches('.'))
            }
        }
        other => other.to_string(),
    }
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

/// Refuse a body not sent as `application/json` (module docs).
fn check_json_content_type(req: &HttpRequest) -> Result<(), ApiError> {
    let refuse = |got: String, kind: &str| {
        ApiError::validation(
            vec![json!("header"), json!("Content-Type")],
            format!("the body must be sent as `Content-Type: application/json`, got {got}"),
            kind,
        )
    };
    let sent = req.headers().get(actix_web::http::header::CONTENT_TYPE);
    let Some(sent) = sent else { return Err(refuse("no Content-Type".into(), "missing")) };
    let shown = format!("`{}`", String::from_utf8_lossy(sent.as_bytes()));
    match req.mime_type() {
        Ok(Some(mime)) if mime.essence_str() == "application/json" => {
            match mime.get_param(actix_web::mime::CHARSET) {
                Some(charset) if !charset.as_str().eq_ignore_ascii_case("utf-8") => {
                    Err(refuse(shown, "value_error"))
                }
                _ => Ok(()),
            }
        }
        _ => Err(refuse(shown, "value_error")),
    }
}

/// Read the whole JSON body: refuse one not sent as `application/json` (422), one with a
/// coding other than gzip or zstd (422), and one over `limit` bytes, compressed or
/// decompressed (413, as soon as the limit is passed, before buffering it whole).
pub async fn read_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    check_json_content_type(req)?;
    let mut decoder = BodyDecoder::for_request(req, limit)?;
    let too_large = || {
        ApiError::new(
            Code::PayloadTooLarge,
            format!("The request body exceeds the limit of {limit} bytes."),
        )
        .with_detail(json!({"maxBytes": limit}))
    };
    let unreadable = |e: String| {
        ApiError::validation(
            vec![json!("body")],
            format!("the body could not be read: {e}"),
            "value_error",
        )
    };
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| unreadable(e.to_string()))?;
        decoder.push(&chunk).map_err(|e| match e {
            DecodeError::TooLarge => too_large(),
            DecodeError::Corrupt(e) => unreadable(e),
        })?;
    }
    decoder.finish().map_err(|e| match e {
        DecodeError::TooLarge => too_large(),
        DecodeError::Corrupt(e) => unreadable(e),
    })
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
    // Most bodies are valid: parse them plainly (tracking the path costs a fifth of a 2000-row
    // bulkAdd's CPU) and parse again with the path only to say where a refused one went wrong.
    // Both accept exactly the same documents: `from_slice` also refuses trailing characters.
    if let Ok(parsed) = serde_json::from_slice(bytes) {
        return Ok(parsed);
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let parsed = serde_path_to_error::deserialize(&mut *de).map_err(|err| {
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
    })?;
    // One document: anything but whitespace after it means the body is not JSON.
    de.end().map_err(|_| {
        ApiError::validation(
            vec![json!("body")],
            "the body must be one JSON document, with nothing after it",
            "json_invalid",
        )
    })?;
    Ok(parsed)
}

/// [`integer`] for an optional field (`#[serde(default)]`): absent is `None`, and `null` is
/// refused like any other value that is not an integer.
pub fn some_integer<'de, D: Deserializer<'de>>(de: D) -> Result<Option<u64>, D::Error> {
    integer(de).map(Some)
}

/// The largest integer a body field takes: the OpenAPI document gives the `u64` fields
/// `format: int64`, so a larger one is outside the documented range and refused (422) before
/// the write goes any further, as a negative one is.
pub const MAX_BODY_INTEGER: u64 = i64::MAX as u64;

/// Deserialize an integer of 0 to [`MAX_BODY_INTEGER`] from any integral JSON number: `1187`,
/// `1187.0` and `1.187e3` are one integer to JSON Schema (and so to the OpenAPI document), so
/// they are to the server. For `#[serde(deserialize_with = "integer")]` on `u64` body fields.
pub fn integer<'de, D: Deserializer<'de>>(de: D) -> Result<u64, D::Error> {
    struct Integer;

    impl Visitor<'_> for Integer {
        type Value = u64;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "a non-negative integer of at most {MAX_BODY_INTEGER}")
        }

        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<u64, E> {
            if n <= MAX_BODY_INTEGER {
                Ok(n)
            } else {
                Err(E::invalid_value(Unexpected::Unsigned(n), &self))
            }
        }

        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<u64, E> {
            u64::try_from(n).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
        }

        fn visit_f64<E: serde::de::Error>(self, x: f64) -> Result<u64, E> {
            // 2^63: the first integral float beyond `MAX_BODY_INTEGER` (which no `f64` holds
            // exactly; the float below 2^63 is 2^63 - 1024).
            const END: f64 = 9_223_372_036_854_775_808.0;
            if x.fract() != 0.0 {
                Err(E::invalid_type(Unexpected::Float(x), &self))
            } else if (0.0..END).contains(&x) {
                Ok(x as u64)
            } else {
                Err(E::invalid_value(Unexpected::Float(x), &self))
            }
        }
    }

    de.deserialize_u64(Integer)
}

/// A validation problem at `loc` under the body.
pub fn body_problem(loc: &[Value], msg: impl Into<String>, kind: &str) -> ApiError {
    let mut full = vec![json!("body")];
    full.extend_from_slice(loc);
    ApiError::validation(full, msg, kind)
}

#[cfg(test)]
mod tests {
    use super::query_pairs;
    use actix_web::test::TestRequest;

    fn pairs(uri: &str) -> Vec<(String, String)> {
        let req = TestRequest::with_uri(uri).to_http_request();
        query_pairs(&req).into_iter().map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
    }

    #[test]
    fn pairs_come_decoded_and_in_order() {
        assert_eq!(
            pairs("/x?limit=5&fields=1%2C2&note=a+b&limit=7"),
            [("limit", "5"), ("fields", "1,2"), ("note", "a b"), ("limit", "7")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
    }

    #[test]
    fn a_bad_escape_or_an_empty_query_is_kept_not_refused() {
        assert_eq!(
            pairs("/x?cursor=%zz&flag"),
            [("cursor".to_owned(), "%zz".to_owned()), ("flag".to_owned(), String::new())]
        );
        assert!(pairs("/x").is_empty());
        assert!(pairs("/x?").is_empty());
    }
}
