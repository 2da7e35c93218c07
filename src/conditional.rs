//! Conditional requests (docs/spec/extensions.md X2): the `ETag` of the reads, `If-None-Match`
//! answered with 304 on them, and `If-Match` on patchRow and deleteRow turned into the sheet
//! actor's [`IfMatch`]. The format of every tag is made and read here only.
//!
//! # Validators
//!
//! - A row (getRow): `"<rowId>.<version>"`, strong. Row ids are never reused and every write of a
//!   row adds 1 to its version (docs/spec/decisions.md §4), so the pair names one content; it is
//!   also what `If-Match` is compared with.
//! - A sheet read (getSheet, listColumns, listRows): `"<sheetId>.<lsn>.<query>"`, strong. `lsn`
//!   is the LSN of the sheet's published snapshot (the last durable record applied to the
//!   sheet), and `query` a short hash of the operation and its normalized query (the clamped
//!   `limit` and the cursor's position), so two pages or two page sizes never share a tag.
//!   Everything these reads show comes from that snapshot, except getSheet's `name` and
//!   `projectId`, which come from the directory. Those never change once a sheet exists: no
//!   endpoint renames or moves a sheet, and an import (`POST /admin/v1/import`, `--seed`)
//!   naming an existing sheet id is refused whole. So they need no part in the tag; an
//!   operation that renames or moves a sheet would have to add the directory's version here.
//!
//! A sheet's LSN moves with every record applied to it, never with another sheet's writes. It
//! may move without a visible change (an idempotent refusal stored with no row changed, or a
//! restart that resumes from a checkpoint's LSN): that only costs a client one full response.
//! One LSN never names two contents of a sheet: a snapshot is published only once its record
//! is durable, and a log heal reuses only LSNs above the durable one.
//!
//! # Comparison (RFC 9110 §13.1)
//!
//! `If-None-Match` uses the weak comparison (`W/"x"` matches `"x"`) and `*` matches any current
//! representation. `If-Match` uses the strong comparison: a weak tag never matches. Items of
//! either header that are not entity-tags are ignored; an `If-Match` left with none matches
//! nothing, so a header the server cannot read never lets a write through.

use std::fmt::Write as _;

use actix_web::http::header::{
    self, EntityTag, Header, IfMatch as IfMatchHeader, IfNoneMatch, TryIntoHeaderValue,
};
use actix_web::{HttpRequest, HttpResponse};
use actors::model::{Row, RowId};
use actors::sheet::{IfMatch, SheetSnapshot};
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::input::Paging;

/// The validator of a row: `"<rowId>.<version>"`.
pub fn row_tag(row: &Row) -> EntityTag {
    EntityTag::new_strong(format!("{}.{}", row.id, row.version()))
}

/// The reads whose validator is a sheet's snapshot.
#[derive(Clone, Copy, Debug)]
#[repr(u8)]
pub enum SheetRead {
    /// getSheet.
    GetSheet = 1,
    /// listColumns.
    ListColumns = 2,
    /// listRows.
    ListRows = 3,
}

/// The validator of a sheet read: `"<sheetId>.<lsn>.<query>"` (module docs).
pub fn sheet_tag(
    read: SheetRead,
    snapshot: &SheetSnapshot,
    page: Option<&Paging>,
    binding: u64,
) -> EntityTag {
    let mut hash = Sha256::new();
    hash.update([read as u8]);
    // listRows' `fields` and `filter` (see `cursor::query_binding`); 0 without them, so the
    // tags of other reads and of plain pages are what they were.
    if binding != 0 {
        hash.update(binding.to_be_bytes());
    }
    if let Some(page) = page {
        hash.update((page.limit as u64).to_be_bytes());
        match page.after {
            Some(after) => {
                hash.update([1]);
                hash.update(after.to_be_bytes());
            }
            None => hash.update([0]),
        }
    }
    // Written into one string: every read of a sheet makes a tag.
    let mut tag = String::with_capacity(48);
    let _ = write!(tag, "{}.{}.", snapshot.state.id, snapshot.lsn);
    for b in &hash.finalize()[..6] {
        let _ = write!(tag, "{b:02x}");
    }
    EntityTag::new_strong(tag)
}

/// Whether the request's `If-None-Match` matches `tag` (weak comparison, `*` matches).
pub fn none_match(req: &HttpRequest, tag: &EntityTag) -> bool {
    if !req.headers().contains_key(header::IF_NONE_MATCH) {
        return false;
    }
    match IfNoneMatch::parse(req) {
        Ok(IfNoneMatch::Any) => true,
        Ok(IfNoneMatch::Items(items)) => items.iter().any(|t| t.weak_eq(tag)),
        Err(_) => false,
    }
}

/// Answer a read whose current validator is `tag`: 304 with no body when the request's
/// `If-None-Match` matches it (`render` is not called), else what `render` makes. Either way
/// with `ETag`; the request middleware adds the request id and rate-limit headers to both.
pub fn respond(
    req: &HttpRequest,
    tag: EntityTag,
    render: impl FnOnce() -> Result<HttpResponse, ApiError>,
) -> Result<HttpResponse, ApiError> {
    let mut res =
        if none_match(req, &tag) { HttpResponse::NotModified().finish() } else { render()? };
    let value = header::ETag(tag).try_into_value().map_err(ApiError::internal)?;
    res.headers_mut().insert(header::ETAG, value);
    Ok(res)
}

/// The version a row tag names, if it is a tag of row `row_id`.
fn version_of(tag: &EntityTag, row_id: RowId) -> Option<u64> {
    let (id, version) = tag.tag().split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(id) || !digits(version) || id.parse::<RowId>().ok()? != row_id {
        return None;
    }
    version.parse().ok()
}

/// The request's `If-Match` as a precondition on row `row_id`, `None` without the header.
/// Weak tags, tags of other rows and items that are not entity-tags name no version.
pub fn if_match(req: &HttpRequest, row_id: RowId) -> Option<IfMatch> {
    if !req.headers().contains_key(header::IF_MATCH) {
        return None;
    }
    Some(match IfMatchHeader::parse(req) {
        Ok(IfMatchHeader::Any) => IfMatch::Any,
        Ok(IfMatchHeader::Items(items)) => IfMatch::Versions(
            items.iter().filter(|t| !t.weak).filter_map(|t| version_of(t, row_id)).collect(),
        ),
        Err(_) => IfMatch::Versions(Vec::new()),
    })
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;
    use actors::sheet::SheetState;

    use super::*;

    fn req(name: &str, values: &[&str]) -> HttpRequest {
        let mut r = TestRequest::default();
        for v in values {
            r = r.append_header((name, *v));
        }
        r.to_http_request()
    }

    #[test]
    fn if_match_keeps_only_strong_tags_of_the_row() {
        let versions = |values: &[&str]| if_match(&req("if-match", values), 1003);
        assert_eq!(if_match(&TestRequest::default().to_http_request(), 1003), None);
        assert_eq!(versions(&["*"]), Some(IfMatch::Any));
        assert_eq!(versions(&["\"1003.2\""]), Some(IfMatch::Versions(vec![2])));
        assert_eq!(
            versions(&["\"1003.2\", W/\"1003.3\", \"1004.4\", \"1003.x\", 1003.5", "\"1003.6\""]),
            Some(IfMatch::Versions(vec![2, 6]))
        );
        assert_eq!(versions(&["\"+1003.2\""]), Some(IfMatch::Versions(vec![])));
        assert_eq!(versions(&["garbage"]), Some(IfMatch::Versions(vec![])));
        assert_eq!(versions(&[""]), Some(IfMatch::Versions(vec![])));
    }

    /// The tags' text is what clients hold between requests: a change of it costs every cached
    /// client a full response. The expected hashes were computed outside Rust from the scheme in
    /// the module docs (SHA-256 of the operation, the binding, the limit and the position).
    #[test]
    fn sheet_tags_keep_their_text() {
        let snapshot =
            SheetSnapshot { state: SheetState::new(10, 0, Vec::new(), Vec::new()), lsn: 7 };
        let page = |limit, after| Paging { limit, after };
        let tag = |read, page: Option<&Paging>, binding| {
            sheet_tag(read, &snapshot, page, binding).tag().to_owned()
        };
        assert_eq!(tag(SheetRead::ListRows, Some(&page(100, None)), 0), "10.7.3c51ef5dd4ee");
        assert_eq!(tag(SheetRead::ListRows, Some(&page(100, Some(1005))), 0), "10.7.646759c04edb");
        assert_eq!(tag(SheetRead::ListColumns, None, 0), "10.7.dbc1b4c900ff");
        assert_eq!(
            tag(SheetRead::ListRows, Some(&page(50, None)), 0xdead_beef),
            "10.7.628a77a16e78"
        );
        assert!(!sheet_tag(SheetRead::GetSheet, &snapshot, None, 0).weak);
    }

    #[test]
    fn if_none_match_uses_the_weak_comparison() {
        let tag = EntityTag::new_strong("10.7.abc".into());
        let hit = |values: &[&str]| none_match(&req("if-none-match", values), &tag);
        assert!(hit(&["\"10.7.abc\""]));
        assert!(hit(&["W/\"10.7.abc\""]));
        assert!(hit(&["*"]));
        assert!(hit(&["\"x\", \"10.7.abc\""]));
        assert!(hit(&["\"x\"", "\"10.7.abc\""]));
        assert!(!hit(&["\"10.7.ab\""]));
        assert!(!hit(&["10.7.abc"]));
        assert!(!none_match(&TestRequest::default().to_http_request(), &tag));
    }
}
