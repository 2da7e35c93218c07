//! The fixture format (`--seed FILE`, `POST /admin/v1/import`) and its validation against the
//! current directory.
//!
//! [`prepare`] turns a fixture into an [`ImportBatch`] or refuses it whole with a sentence naming
//! the offending object (`rows[3] (id 1003): ...`). Nothing is applied until the whole fixture
//! is known to be good. Cells follow [`crate::coerce`] and keys follow [`super::keys`], the same
//! rules as writes and keys made through the API.
//!
//! It sits below the directory actor, which runs [`prepare`] in mailbox order against its
//! current state, and above the directory's state: it reads that state, never the actor.
//!
//! Rules beyond the format itself: ids must not clash with each other or with existing objects;
//! columns and rows belong to sheets of the same fixture; row ids must be above every row id the
//! service has issued (ids are never reused); a row's parent is a row of the same sheet and the
//! parent links form no cycle.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::keys::{self, GrantSpec};
use super::state::DirectoryState;
use crate::coerce::{apply_writes, coerce_cells, parse_instant};
use crate::error::{Error, Result};
use crate::model::*;
use crate::record::{ImportBatch, SheetImport};

/// A fixture as sent. Every section is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fixture {
    /// Row caps per plan.
    #[serde(default)]
    pub plans: Option<FixturePlans>,
    /// Users to add; ids must be new (not twice in the fixture, not in the directory).
    #[serde(default)]
    pub users: Vec<FixtureUser>,
    /// Projects to add, each owned by a user of the fixture or the directory.
    #[serde(default)]
    pub projects: Vec<FixtureProject>,
    /// Folders to add, each in a project of the fixture or the directory.
    #[serde(default)]
    pub folders: Vec<FixtureFolder>,
    /// Sheets to add; a `folderId` must name a folder of the same project.
    #[serde(default)]
    pub sheets: Vec<FixtureSheet>,
    /// Columns of the fixture's own sheets.
    #[serde(default)]
    pub columns: Vec<FixtureColumn>,
    /// Rows of the fixture's own sheets, cell-coerced as API writes are.
    #[serde(default)]
    pub rows: Vec<FixtureRow>,
    /// Shares on a project, folder or sheet (never `account`), for users that exist.
    #[serde(default)]
    pub shares: Vec<FixtureShare>,
    /// Reports to add; a definition is saved unchecked and compiled when the report runs.
    #[serde(default)]
    pub reports: Vec<FixtureReport>,
    /// API keys; each needs at least one grant, and one without `secret` gets a generated one.
    #[serde(default)]
    pub keys: Vec<FixtureKey>,
}

/// `plans` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixturePlans {
    /// The free plan's caps.
    pub free: Option<FixturePlan>,
    /// The paid plan's caps.
    pub paid: Option<FixturePlan>,
}

/// One plan's caps.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixturePlan {
    /// The plan's row cap per sheet (bulk adds beyond it fail with `capacity_exceeded`).
    pub max_rows_per_sheet: u64,
}

/// An entry of `users`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureUser {
    /// Chosen by the fixture; taken by no user yet.
    pub id: UserId,
    /// Display name; the public API never shows it.
    pub name: String,
    /// Plan (default `free`).
    #[serde(default)]
    pub plan: Option<Plan>,
}

/// An entry of `projects`: its owner holds `owner` on it and everything in it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureProject {
    /// Chosen by the fixture; taken by no project yet.
    pub id: ProjectId,
    /// Display name; the public API never shows it.
    pub name: String,
    /// A user of the fixture or the directory.
    pub owner_id: UserId,
}

/// An entry of `folders`: shares on it reach its sheets.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureFolder {
    /// Chosen by the fixture; taken by no folder yet.
    pub id: FolderId,
    /// A project of the fixture or the directory.
    pub project_id: ProjectId,
    /// Display name; the public API never shows folders.
    pub name: String,
}

/// An entry of `sheets`; its columns and rows come in `columns` and `rows`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureSheet {
    /// Chosen by the fixture; taken by no sheet yet.
    pub id: SheetId,
    /// A project of the fixture or the directory.
    pub project_id: ProjectId,
    /// Folder, if any.
    #[serde(default)]
    pub folder_id: Option<FolderId>,
    /// Shown as the sheet's `name`.
    pub name: String,
}

/// An entry of `columns`, for a sheet of the same fixture.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureColumn {
    /// Chosen by the fixture, once in it; rows key their cells by it.
    pub id: ColumnId,
    /// A sheet of the same fixture.
    pub sheet_id: SheetId,
    /// Shown as the column's `name`; report definitions name columns by it.
    pub name: String,
    /// One of the nine column types; it decides how the rows' cells are coerced.
    #[serde(rename = "type")]
    pub ty: ColumnType,
    /// Position (default: order of appearance).
    #[serde(default)]
    pub position: Option<i64>,
    /// Shown as the column's `primary` (default false).
    #[serde(default)]
    pub primary: bool,
    /// Options (option-bearing types only).
    #[serde(default)]
    pub options: Option<Vec<String>>,
}

/// An entry of `rows`, for a sheet of the same fixture.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureRow {
    /// At least the service's next row id: row ids are never reused.
    pub id: RowId,
    /// A sheet of the same fixture.
    pub sheet_id: SheetId,
    /// A row of the same sheet (no cycles); deleting the parent deletes this row too.
    #[serde(default)]
    pub parent_id: Option<RowId>,
    /// Raw cells by column id.
    #[serde(default)]
    pub cells: Map<String, Value>,
    /// Only counted (stats, freed by a delete); no content is stored.
    #[serde(default)]
    pub attachments: Vec<FixtureAttachment>,
}

/// An attachment: its name and size, nothing more.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureAttachment {
    /// File name.
    pub name: String,
    /// Size in bytes, counted in the stats' `attachmentBytes`.
    pub bytes: u64,
}

/// An entry of `shares`: a role on a project, folder or sheet that flows down.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureShare {
    /// A user of the fixture or the directory.
    pub user_id: UserId,
    /// `project`, `folder` or `sheet`.
    pub scope_type: ScopeType,
    /// The id of the project, folder or sheet.
    pub scope_id: u64,
    /// `viewer`, `editor`, `admin` or `owner`.
    pub role: Role,
}

/// An entry of `reports`; who may see it follows its project.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureReport {
    /// Chosen by the fixture; taken by no report yet.
    pub id: ReportId,
    /// A project of the fixture or the directory.
    pub project_id: ProjectId,
    /// The user who saved it.
    pub owner_id: UserId,
    /// Shown as the report's `name`.
    pub name: String,
    /// Definition (saved as is; checked when run).
    #[serde(default)]
    pub definition: Value,
}

/// An entry of `keys`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FixtureKey {
    /// Id (default: the next free one).
    #[serde(default)]
    pub id: Option<KeyId>,
    /// A user of the fixture or the directory: the key acts with that user's access.
    pub owner_id: UserId,
    /// A label for people, not a credential.
    pub name: String,
    /// The secret; generated (and reported once) when absent.
    #[serde(default)]
    pub secret: Option<String>,
    /// At least one; each on an object that exists.
    pub grants: Vec<GrantSpec>,
    /// Expiry (RFC 3339); default one year from now.
    #[serde(default)]
    pub expires_at: Option<String>,
}

/// A key secret generated by an import, to be shown exactly once.
#[derive(Clone, Debug)]
pub struct IssuedSecret {
    /// The key's id, as given or assigned.
    pub key_id: KeyId,
    pub name: String,
    pub owner_id: UserId,
    /// The whole secret, to be shown once: only its hash is kept.
    pub secret: String,
}

fn unique<T: Copy + Eq + std::hash::Hash + std::fmt::Display>(
    kind: &str,
    ids: impl IntoIterator<Item = T>,
    existing: impl Fn(T) -> bool,
) -> Result<()> {
    let mut seen = HashSet::new();
    for (i, id) in ids.into_iter().enumerate() {
        if !seen.insert(id) {
            return Err(Error::invalid(format!(
                "{kind}[{i}] (id {id}): the id appears twice in the fixture"
            )));
        }
        if existing(id) {
            return Err(Error::invalid(format!(
                "{kind}[{i}] (id {id}): an object with this id already exists"
            )));
        }
    }
    Ok(())
}

/// Validate a fixture against the current directory and turn it into an import batch.
/// `next_row_id` is the id the service would issue next; fixture rows must be at or above it.
pub fn prepare(
    fx: Fixture,
    current: &DirectoryState,
    next_row_id: RowId,
    now: Millis,
) -> Result<(ImportBatch, Vec<IssuedSecret>)> {
    unique("users", fx.users.iter().map(|u| u.id), |id| current.users.contains_key(&id))?;
    unique("projects", fx.projects.iter().map(|p| p.id), |id| current.projects.contains_key(&id))?;
    unique("folders", fx.folders.iter().map(|f| f.id), |id| current.folders.contains_key(&id))?;
    unique("sheets", fx.sheets.iter().map(|s| s.id), |id| current.sheets.contains_key(&id))?;
    unique("columns", fx.columns.iter().map(|c| c.id), |_| false)?;
    unique("rows", fx.rows.iter().map(|r| r.id), |_| false)?;
    unique("reports", fx.reports.iter().map(|r| r.id), |id| current.reports.contains_key(&id))?;
    unique("keys", fx.keys.iter().filter_map(|k| k.id), |id| current.keys.contains_key(&id))?;

    // Build the state the fixture would produce, so references can be checked in one place.
    let mut next = current.clone();
    let mut batch = ImportBatch::default();
    if let Some(plans) = &fx.plans {
        let mut caps = current.caps;
        if let Some(p) = &plans.free {
            caps.free_max_rows = p.max_rows_per_sheet;
        }
        if let Some(p) = &plans.paid {
            caps.paid_max_rows = p.max_rows_per_sheet;
        }
        batch.plan_caps = Some(caps);
    }
    batch.users = fx
        .users
        .into_iter()
        .map(|u| User { id: u.id, name: u.name, plan: u.plan.unwrap_or(Plan::Free) })
        .collect();
    for u in &batch.users {
        next.users.insert(u.id, u.clone());
    }
    for (i, p) in fx.projects.into_iter().enumerate() {
        if !next.users.contains_key(&p.owner_id) {
            return Err(Error::invalid(format!(
                "projects[{i}] (id {}): owner {} does not exist",
                p.id, p.owner_id
            )));
        }
        let p = Project { id: p.id, name: p.name, owner_id: p.owner_id };
        next.projects.insert(p.id, p.clone());
        batch.projects.push(p);
    }
    for (i, f) in fx.folders.into_iter().enumerate() {
        if !next.projects.contains_key(&f.project_id) {
            return Err(Error::invalid(format!(
                "folders[{i}] (id {}): project {} does not exist",
                f.id, f.project_id
            )));
        }
        let f = Folder { id: f.id, project_id: f.project_id, name: f.name };
        next.folders.insert(f.id, f.clone());
        batch.folders.push(f);
    }
    let mut sheets: BTreeMap<SheetId, SheetImport> = BTreeMap::new();
    let mut sheet_order = Vec::new();
    for (i, s) in fx.sheets.into_iter().enumerate() {
        if !next.projects.contains_key(&s.project_id) {
            return Err(Error::invalid(format!(
                "sheets[{i}] (id {}): project {} does not exist",
                s.id, s.project_id
            )));
        }
        if let Some(folder) = s.folder_id {
            match next.folders.get(&folder) {
                Some(f) if f.project_id == s.project_id => {}
                Some(_) => {
                    return Err(Error::invalid(format!(
                        "sheets[{i}] (id {}): folder {folder} is in another project",
                        s.id
                    )))
                }
                None => {
                    return Err(Error::invalid(format!(
                        "sheets[{i}] (id {}): folder {folder} does not exist",
                        s.id
                    )))
                }
            }
        }
        let meta = SheetMeta {
            id: s.id,
            project_id: s.project_id,
            folder_id: s.folder_id,
            name: s.name,
            created_at: now,
        };
        next.sheets.insert(meta.id, meta.clone());
        sheet_order.push(meta.id);
        sheets.insert(meta.id, SheetImport { meta, columns: Vec::new(), rows: Vec::new() });
    }
    for (i, c) in fx.columns.into_iter().enumerate() {
        let Some(sheet) = sheets.get_mut(&c.sheet_id) else {
            return Err(Error::invalid(format!(
                "columns[{i}] (id {}): sheet {} is not a sheet of this fixture",
                c.id, c.sheet_id
            )));
        };
        let options = match (c.ty.has_options(), c.options) {
            (true, opts) => Some(opts.unwrap_or_default()),
            (false, Some(_)) => {
                return Err(Error::invalid(format!(
                    "columns[{i}] (id {}): a {} column takes no options",
                    c.id,
                    c.ty.as_str()
                )))
            }
            (false, None) => None,
        };
        let position = c.position.unwrap_or(sheet.columns.len() as i64);
        sheet.columns.push(Column {
            id: c.id,
            sheet_id: c.sheet_id,
            name: c.name,
            ty: c.ty,
            position,
            options,
            primary: c.primary,
        });
    }
    let row_sheet: HashMap<RowId, SheetId> = fx.rows.iter().map(|r| (r.id, r.sheet_id)).collect();
    for (i, r) in fx.rows.iter().enumerate() {
        let what = format!("rows[{i}] (id {})", r.id);
        if r.id < next_row_id {
            return Err(Error::invalid(format!(
                "{what}: row ids must be at least {next_row_id} (ids are never reused)"
            )));
        }
        if !sheets.contains_key(&r.sheet_id) {
            return Err(Error::invalid(format!(
                "{what}: sheet {} is not a sheet of this fixture",
                r.sheet_id
            )));
        }
        if let Some(parent) = r.parent_id {
            if row_sheet.get(&parent) != Some(&r.sheet_id) {
                return Err(Error::invalid(format!(
                    "{what}: parent {parent} is not a row of sheet {}",
                    r.sheet_id
                )));
            }
        }
    }
    // Parent links must end at a root: walk each chain, at most as long as the row count.
    let parents: HashMap<RowId, RowId> =
        fx.rows.iter().filter_map(|r| r.parent_id.map(|p| (r.id, p))).collect();
    for (i, r) in fx.rows.iter().enumerate() {
        let (mut at, mut steps) = (r.id, 0);
        while let Some(&p) = parents.get(&at) {
            at = p;
            steps += 1;
            if steps > parents.len() {
                return Err(Error::invalid(format!(
                    "rows[{i}] (id {}): its parent links form a cycle",
                    r.id
                )));
            }
        }
    }
    for (i, r) in fx.rows.into_iter().enumerate() {
        let sheet = sheets.get_mut(&r.sheet_id).expect("checked above");
        let columns: BTreeMap<ColumnId, Column> =
            sheet.columns.iter().map(|c| (c.id, c.clone())).collect();
        let writes = coerce_cells(&columns, &r.cells)
            .map_err(|e| Error::invalid(format!("rows[{i}] (id {}): {e}", r.id)))?;
        let cells = apply_writes(BTreeMap::new(), writes);
        let mut row = Row::new(r.id, r.sheet_id, cells, SOURCE_IMPORT, now);
        row.set_parent_id(r.parent_id);
        row.set_attachments(
            r.attachments
                .into_iter()
                .map(|a| Attachment { name: a.name, bytes: a.bytes })
                .collect(),
        );
        sheet.rows.push(row);
    }
    for (i, s) in fx.shares.into_iter().enumerate() {
        let what = format!("shares[{i}]");
        if !next.users.contains_key(&s.user_id) {
            return Err(Error::invalid(format!("{what}: user {} does not exist", s.user_id)));
        }
        let exists = match s.scope_type {
            ScopeType::Account => {
                return Err(Error::invalid(format!(
                    "{what}: shares are on a project, folder or sheet"
                )))
            }
            ScopeType::Project => next.projects.contains_key(&s.scope_id),
            ScopeType::Folder => next.folders.contains_key(&s.scope_id),
            ScopeType::Sheet => next.sheets.contains_key(&s.scope_id),
        };
        if !exists {
            return Err(Error::invalid(
                format!("{what}: no {:?} with id {}", s.scope_type, s.scope_id).to_lowercase(),
            ));
        }
        batch.shares.push(Share {
            user_id: s.user_id,
            scope_type: s.scope_type,
            scope_id: s.scope_id,
            role: s.role,
        });
    }
    for (i, r) in fx.reports.into_iter().enumerate() {
        let what = format!("reports[{i}] (id {})", r.id);
        if !next.projects.contains_key(&r.project_id) {
            return Err(Error::invalid(format!("{what}: project {} does not exist", r.project_id)));
        }
        if !next.users.contains_key(&r.owner_id) {
            return Err(Error::invalid(format!("{what}: owner {} does not exist", r.owner_id)));
        }
        batch.reports.push(Report {
            id: r.id,
            project_id: r.project_id,
            owner_id: r.owner_id,
            name: r.name,
            definition: Json(r.definition),
        });
    }
    let mut issued = Vec::new();
    let mut next_key =
        next.next_key_id().max(fx.keys.iter().filter_map(|k| k.id).max().map_or(1, |m| m + 1));
    let mut hashes: BTreeSet<[u8; 32]> = BTreeSet::new();
    for (i, k) in fx.keys.into_iter().enumerate() {
        let id = k.id.unwrap_or_else(|| {
            next_key += 1;
            next_key - 1
        });
        let what = format!("keys[{i}] (id {id})");
        if !next.users.contains_key(&k.owner_id) {
            return Err(Error::invalid(format!("{what}: owner {} does not exist", k.owner_id)));
        }
        let grants = k
            .grants
            .iter()
            .enumerate()
            .map(|(j, g)| keys::check_grant(&next, *g, &format!("{what} grants[{j}]")))
            .collect::<Result<Vec<_>>>()?;
        if grants.is_empty() {
            return Err(Error::invalid(format!("{what}: a key needs at least one grant")));
        }
        let expires_at = match k.expires_at.as_deref() {
            None => Some(keys::default_expiry(now)),
            Some(text) => Some(parse_instant(text).map_err(|_| {
                Error::invalid(format!("{what}: expiresAt is not an RFC 3339 time"))
            })?),
        };
        let secret = match k.secret {
            Some(s) if keys::is_valid_secret(&s) => s,
            Some(_) => {
                return Err(Error::invalid(format!(
                    "{what}: secret must be `svc_live_` followed by at least 32 characters of [A-Za-z0-9]"
                )))
            }
            None => {
                let s = keys::generate_secret();
                issued.push(IssuedSecret { key_id: id, name: k.name.clone(), owner_id: k.owner_id, secret: s.clone() });
                s
            }
        };
        let key = keys::new_key(id, k.owner_id, k.name, &secret, grants, now, expires_at);
        if !hashes.insert(key.secret_hash) || current.key_by_hash(&key.secret_hash).is_some() {
            return Err(Error::invalid(format!(
                "{what}: this secret is already used by another key"
            )));
        }
        batch.keys.push(key);
    }
    batch.sheets = sheet_order.into_iter().filter_map(|id| sheets.remove(&id)).collect();
    Ok((batch, issued))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SECRET: &str = "svc_live_FixtureTestKey000000000000000000001";
    const NOW: Millis = 1_000_000;

    /// A small workspace touching every section: ada owns project 1 (folder 5, sheets 10 and
    /// 11), bob views folder 5; sheet 10 has a row subtree 100 → 101.
    fn good() -> Value {
        json!({
            "plans": {"free": {"maxRowsPerSheet": 7}},
            "users": [{"id": 1, "name": "ada", "plan": "paid"}, {"id": 2, "name": "bob"}],
            "projects": [{"id": 1, "name": "Ops", "ownerId": 1}],
            "folders": [{"id": 5, "projectId": 1, "name": "Q3"}],
            "sheets": [{"id": 10, "projectId": 1, "folderId": 5, "name": "Tasks"},
                       {"id": 11, "projectId": 1, "name": "Stock"}],
            "columns": [{"id": 1, "sheetId": 10, "name": "Task", "type": "text"},
                        {"id": 2, "sheetId": 10, "name": "Seen", "type": "datetime"},
                        {"id": 3, "sheetId": 11, "name": "Status", "type": "dropdown",
                         "options": ["Open"]}],
            "rows": [{"id": 100, "sheetId": 10, "cells": {"1": "root", "2": "2026-01-02T03:04:05+01:00"}},
                     {"id": 101, "sheetId": 10, "parentId": 100, "cells": {"1": "child"},
                      "attachments": [{"name": "a.pdf", "bytes": 3}]},
                     {"id": 110, "sheetId": 11, "cells": {"3": "Open"}}],
            "shares": [{"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "viewer"}],
            "reports": [{"id": 7, "projectId": 1, "ownerId": 1, "name": "All",
                         "definition": {"type": "row", "sources": [10]}}],
            "keys": [{"id": 3, "ownerId": 1, "name": "given", "secret": SECRET,
                      "grants": [{"verb": "write", "scopeType": "project", "scopeId": 1}],
                      "expiresAt": "2030-01-01T00:00:00Z"},
                     {"ownerId": 2, "name": "generated",
                      "grants": [{"verb": "read", "scopeType": "account"}]}]
        })
    }

    fn fixture(v: Value) -> Fixture {
        serde_json::from_value(v).expect("a fixture of the format")
    }

    fn prepare_on(current: &DirectoryState, v: Value) -> Result<(ImportBatch, Vec<IssuedSecret>)> {
        prepare(fixture(v), current, 1, NOW)
    }

    /// The sentence a fixture is refused with.
    fn refusal(v: Value) -> String {
        match prepare_on(&DirectoryState::default(), v) {
            Err(Error::Invalid { message, .. }) => message,
            Err(other) => panic!("refused as {other:?}, not as invalid input"),
            Ok(_) => panic!("accepted"),
        }
    }

    /// `good()` with `section` replaced.
    fn with(section: &str, value: Value) -> Value {
        let mut v = good();
        v[section] = value;
        v
    }

    #[test]
    fn a_good_fixture_becomes_one_batch() {
        let (batch, issued) = prepare_on(&DirectoryState::default(), good()).unwrap();
        assert_eq!(batch.plan_caps.map(|c| c.free_max_rows), Some(7));
        assert_eq!((batch.users.len(), batch.projects.len(), batch.folders.len()), (2, 1, 1));
        assert_eq!(batch.users[1].plan, Plan::Free, "the default plan");
        let sheets: Vec<(SheetId, usize, usize)> =
            batch.sheets.iter().map(|s| (s.meta.id, s.columns.len(), s.rows.len())).collect();
        assert_eq!(sheets, [(10, 2, 2), (11, 1, 1)]);
        let positions: Vec<i64> = batch.sheets[0].columns.iter().map(|c| c.position).collect();
        assert_eq!(positions, [0, 1], "order of appearance");
        let root = &batch.sheets[0].rows[0];
        assert_eq!(root.cell(2), Some(json!("2026-01-02T02:04:05Z")), "cells are coerced");
        assert_eq!(batch.sheets[0].rows[1].parent_id(), Some(100));
        assert_eq!((batch.shares.len(), batch.reports.len()), (1, 1));

        let keys: Vec<(KeyId, &str)> = batch.keys.iter().map(|k| (k.id, k.name.as_str())).collect();
        assert_eq!(keys, [(3, "given"), (4, "generated")], "a missing id is the next free one");
        assert_eq!(batch.keys[0].secret_hash, keys::hash_secret(SECRET));
        assert_eq!(batch.keys[0].expires_at, parse_instant("2030-01-01T00:00:00Z").ok());
        assert_eq!(batch.keys[1].expires_at, Some(keys::default_expiry(NOW)));
        assert_eq!(issued.len(), 1, "only the key without a secret gets one");
        assert_eq!((issued[0].key_id, issued[0].name.as_str()), (4, "generated"));
        assert!(keys::is_valid_secret(&issued[0].secret));
        assert_eq!(batch.keys[1].secret_hash, keys::hash_secret(&issued[0].secret));
    }

    #[test]
    fn ids_clash_within_the_fixture_or_with_what_exists() {
        let twice = with("users", json!([{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]));
        assert_eq!(refusal(twice), "users[1] (id 1): the id appears twice in the fixture");

        let mut current = DirectoryState::default();
        current.apply_import(&prepare_on(&DirectoryState::default(), good()).unwrap().0);
        let again = json!({"projects": [{"id": 2, "name": "New", "ownerId": 1},
                                         {"id": 1, "name": "Old", "ownerId": 1}]});
        let Err(Error::Invalid { message, .. }) = prepare_on(&current, again) else {
            panic!("an existing id was accepted")
        };
        assert_eq!(message, "projects[1] (id 1): an object with this id already exists");
    }

    #[test]
    fn each_broken_reference_is_refused_naming_the_object() {
        let cases = [
            (
                with("projects", json!([{"id": 1, "name": "Ops", "ownerId": 9}])),
                "projects[0] (id 1): owner 9 does not exist",
            ),
            (
                with("folders", json!([{"id": 5, "projectId": 9, "name": "Q3"}])),
                "folders[0] (id 5): project 9 does not exist",
            ),
            (
                with("sheets", json!([{"id": 10, "projectId": 1, "folderId": 6, "name": "T"}])),
                "sheets[0] (id 10): folder 6 does not exist",
            ),
            (
                with("columns", json!([{"id": 1, "sheetId": 12, "name": "T", "type": "text"}])),
                "columns[0] (id 1): sheet 12 is not a sheet of this fixture",
            ),
            (
                with(
                    "columns",
                    json!([{"id": 1, "sheetId": 10, "name": "T", "type": "text", "options": []}]),
                ),
                "columns[0] (id 1): a text column takes no options",
            ),
            (
                with("rows", json!([{"id": 100, "sheetId": 12}])),
                "rows[0] (id 100): sheet 12 is not a sheet of this fixture",
            ),
            (
                with("rows", json!([{"id": 100, "sheetId": 10}, {"id": 110, "sheetId": 11, "parentId": 100}])),
                "rows[1] (id 110): parent 100 is not a row of sheet 11",
            ),
            (
                with("shares", json!([{"userId": 2, "scopeType": "sheet", "scopeId": 99, "role": "editor"}])),
                "shares[0]: no sheet with id 99",
            ),
            (
                with("shares", json!([{"userId": 2, "scopeType": "account", "scopeId": 1, "role": "editor"}])),
                "shares[0]: shares are on a project, folder or sheet",
            ),
            (
                with("reports", json!([{"id": 7, "projectId": 1, "ownerId": 9, "name": "R"}])),
                "reports[0] (id 7): owner 9 does not exist",
            ),
            (
                with("keys", json!([{"ownerId": 9, "name": "k", "grants": []}])),
                "keys[0] (id 1): owner 9 does not exist",
            ),
            (
                with("keys", json!([{"ownerId": 1, "name": "k", "grants": []}])),
                "keys[0] (id 1): a key needs at least one grant",
            ),
            (
                with(
                    "keys",
                    json!([{"ownerId": 1, "name": "k", "secret": "svc_live_short",
                            "grants": [{"verb": "read", "scopeType": "account"}]}]),
                ),
                "keys[0] (id 1): secret must be `svc_live_` followed by at least 32 characters of [A-Za-z0-9]",
            ),
            (
                with(
                    "keys",
                    json!([{"ownerId": 1, "name": "a", "secret": SECRET,
                            "grants": [{"verb": "read", "scopeType": "account"}]},
                           {"ownerId": 1, "name": "b", "secret": SECRET,
                            "grants": [{"verb": "read", "scopeType": "account"}]}]),
                ),
                "keys[1] (id 2): this secret is already used by another key",
            ),
        ];
        for (fixture, expected) in cases {
            assert_eq!(refusal(fixture), expected);
        }
        let bad_cell =
            refusal(with("rows", json!([{"id": 100, "sheetId": 11, "cells": {"3": "Gone"}}])));
        assert!(bad_cell.starts_with("rows[0] (id 100): "), "{bad_cell}");
        let reused = with("rows", json!([{"id": 100, "sheetId": 10}]));
        let Err(Error::Invalid { message, .. }) =
            prepare(fixture(reused), &DirectoryState::default(), 101, NOW)
        else {
            panic!("a row id below the next one was accepted")
        };
        assert_eq!(
            message,
            "rows[0] (id 100): row ids must be at least 101 (ids are never reused)"
        );
    }

    #[test]
    fn key_grants_must_name_objects_that_exist_and_expiries_follow_the_cell_rules() {
        let missing = with(
            "keys",
            json!([{"ownerId": 1, "name": "k",
                    "grants": [{"verb": "read", "scopeType": "folder", "scopeId": 6}]}]),
        );
        let Err(Error::Invalid { message, detail }) =
            prepare_on(&DirectoryState::default(), missing)
        else {
            panic!("a grant on a missing folder was accepted")
        };
        assert_eq!(message, "keys[0] (id 1) grants[0]: no folder with id 6");
        assert_eq!(detail, Some(json!({"scopeId": 6, "reason": "no such object"})));
        for expires in ["2030-01-01 00:00:00Z", "2030-01-01T23:59:60Z", "tomorrow"] {
            let key = with(
                "keys",
                json!([{"ownerId": 1, "name": "k", "expiresAt": expires,
                        "grants": [{"verb": "read", "scopeType": "account"}]}]),
            );
            assert_eq!(refusal(key), "keys[0] (id 1): expiresAt is not an RFC 3339 time");
        }
    }

    #[test]
    fn parent_links_that_loop_are_refused() {
        let cycle = with(
            "rows",
            json!([{"id": 100, "sheetId": 10},
                   {"id": 101, "sheetId": 10, "parentId": 103},
                   {"id": 102, "sheetId": 10, "parentId": 101},
                   {"id": 103, "sheetId": 10, "parentId": 102}]),
        );
        assert_eq!(refusal(cycle), "rows[1] (id 101): its parent links form a cycle");
        let own_parent = with("rows", json!([{"id": 100, "sheetId": 10, "parentId": 100}]));
        assert_eq!(refusal(own_parent), "rows[0] (id 100): its parent links form a cycle");
        let chain = with(
            "rows",
            json!([{"id": 102, "sheetId": 10, "parentId": 101},
                   {"id": 101, "sheetId": 10, "parentId": 100},
                   {"id": 100, "sheetId": 10}]),
        );
        assert!(prepare_on(&DirectoryState::default(), chain).is_ok(), "a long chain is no loop");
    }
}
