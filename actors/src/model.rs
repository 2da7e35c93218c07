//! The domain's plain data: ids, users, projects, folders, sheets, columns, rows, shares,
//! reports and API keys.
//!
//! These types are what the log records and checkpoints carry (through `wal::codec`), so they
//! avoid serde features the binary codec cannot express (untagged enums, `skip_serializing_if`,
//! `flatten`). JSON cell values travel as [`Json`], which stores itself as a small binary tree in
//! binary formats. A [`Row`] is the one type that carries its API form: it keeps its cells only
//! inside its rendered RowV1 JSON, which holds none of its hidden fields (parent, attachments).
//! The HTTP layer maps every other type to its own views, so hidden fields (folder id, key
//! hashes) cannot leak by accident.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

mod row;

pub use row::{decimal_order, timestamp, Row, SortedCells, Source, SOURCE_API, SOURCE_IMPORT};

/// A user (an owner of projects and keys).
pub type UserId = u64;
/// A project: holds folders, sheets and reports.
pub type ProjectId = u64;
/// A folder inside a project.
pub type FolderId = u64;
/// A sheet; also names its [`crate::SheetActor`].
pub type SheetId = u64;
/// A column of one sheet.
pub type ColumnId = u64;
/// A row. Row ids are global and strictly increasing across the whole service.
pub type RowId = u64;
/// A saved report.
pub type ReportId = u64;
/// An API key (shown as `keyId`).
pub type KeyId = u64;
/// Milliseconds since the Unix epoch, UTC.
pub type Millis = i64;

/// A JSON value. In human-readable formats it is plain JSON; in the log's binary codec, which
/// cannot carry `serde_json::Value` as is (that needs `deserialize_any`), it is a small tree of
/// tagged nodes: decoding builds the value directly, with no JSON text to write on every write
/// or parse at every start. Bytes of codec format 1 held the value's JSON text; they still
/// decode (`wal::codec::decoding_version`).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Json(pub serde_json::Value);

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            self.0.serialize(s)
        } else {
            NodeRef(&self.0).serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            serde_json::Value::deserialize(d).map(Json)
        } else if wal::codec::decoding_version() < 2 {
            let text = String::deserialize(d)?;
            serde_json::from_str(&text).map(Json).map_err(serde::de::Error::custom)
        } else {
            Node::deserialize(d).map(|n| Json(n.into_value()))
        }
    }
}

/// The binary form of a JSON value, one variant per kind (the variant order is the format).
#[derive(Deserialize)]
enum Node {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Node {
    fn into_value(self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(b),
            Node::I64(n) => Value::from(n),
            Node::U64(n) => Value::from(n),
            // Only finite numbers are ever stored; anything else reads back as null.
            Node::F64(x) => serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number),
            Node::Str(s) => Value::String(s),
            Node::Array(items) => Value::Array(items.into_iter().map(|j| j.0).collect()),
            Node::Object(fields) => {
                Value::Object(fields.into_iter().map(|(k, j)| (k, j.0)).collect())
            }
        }
    }
}

/// A borrowed value written as a [`Node`], without copying it.
struct NodeRef<'a>(&'a serde_json::Value);

impl Serialize for NodeRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde_json::Value;
        match self.0 {
            Value::Null => s.serialize_unit_variant("Node", 0, "Null"),
            Value::Bool(b) => s.serialize_newtype_variant("Node", 1, "Bool", b),
            Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => s.serialize_newtype_variant("Node", 2, "I64", &i),
                (None, Some(u)) => s.serialize_newtype_variant("Node", 3, "U64", &u),
                _ => s.serialize_newtype_variant("Node", 4, "F64", &n.as_f64().unwrap_or(0.0)),
            },
            Value::String(text) => s.serialize_newtype_variant("Node", 5, "Str", text),
            Value::Array(items) => s.serialize_newtype_variant("Node", 6, "Array", &Items(items)),
            Value::Object(fields) => {
                s.serialize_newtype_variant("Node", 7, "Object", &Fields(fields))
            }
        }
    }
}

/// An array's items as a sequence of [`NodeRef`]s.
struct Items<'a>(&'a [serde_json::Value]);

impl Serialize for Items<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(NodeRef))
    }
}

/// An object's fields as a sequence of `(name, NodeRef)` pairs, in the map's order.
struct Fields<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl Serialize for Fields<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().map(|(k, v)| (k.as_str(), NodeRef(v))))
    }
}

/// A user's billing plan; it sets the per-sheet row cap and whether reports may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Plan {
    /// The default plan: 5,000 rows per sheet, no report runs.
    Free,
    /// 500,000 rows per sheet, reports run.
    Paid,
}

/// Roles, lowest to highest. A user's role on a target is the highest role reaching it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// May read.
    Viewer,
    /// May read and write rows.
    Editor,
    /// Administers the object (no extra API power in v1).
    Admin,
    /// Owns the project and everything in it.
    Owner,
}

/// The kind of object a grant or share is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeType {
    /// Every object the owner can reach (grants only, with no scope id).
    Account,
    /// A project and everything in it.
    Project,
    /// A folder and its sheets.
    Folder,
    /// One sheet.
    Sheet,
}

impl ScopeType {
    /// The scope type as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeType::Account => "account",
            ScopeType::Project => "project",
            ScopeType::Folder => "folder",
            ScopeType::Sheet => "sheet",
        }
    }
}

/// What a key grant allows: `read` is viewer level, `write` is editor level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verb {
    /// Viewer level.
    Read,
    /// Editor level (includes read).
    Write,
}

impl Verb {
    /// The verb as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Read => "read",
            Verb::Write => "write",
        }
    }

    /// The role ceiling this verb gives a key.
    pub fn ceiling(self) -> Role {
        match self {
            Verb::Read => Role::Viewer,
            Verb::Write => Role::Editor,
        }
    }
}

/// One grant of an API key: a verb on a scope object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Grant {
    /// `read` or `write`.
    pub verb: Verb,
    /// The kind of object covered.
    pub scope_type: ScopeType,
    /// The object's id; `None` exactly when `scope_type` is `Account`.
    pub scope_id: Option<u64>,
}

/// A user: owns projects, keys and reports, and receives shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct User {
    /// Caller-chosen id.
    pub id: UserId,
    /// Display name (never exposed by the public API).
    pub name: String,
    /// The user's plan.
    pub plan: Plan,
}

/// A project: its owner holds `owner` on it and everything inside.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Project {
    /// Caller-chosen id.
    pub id: ProjectId,
    /// Display name (never exposed by the public API).
    pub name: String,
    /// The owning user.
    pub owner_id: UserId,
}

/// A folder of a project.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Folder {
    /// Caller-chosen id.
    pub id: FolderId,
    /// The project holding it.
    pub project_id: ProjectId,
    /// Display name (never exposed: the public API shows no folders).
    pub name: String,
}

/// A sheet's identity and place in the tree. Its columns and rows belong to its actor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SheetMeta {
    /// Caller-chosen id.
    pub id: SheetId,
    /// The project holding it.
    pub project_id: ProjectId,
    /// The folder holding it, if any (never exposed).
    pub folder_id: Option<FolderId>,
    /// Display name, shown as the sheet's `name`.
    pub name: String,
    /// When it was created.
    pub created_at: Millis,
}

/// A share: a role for a user on a project, folder or sheet; it flows down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Share {
    /// The user given the role.
    pub user_id: UserId,
    /// Project, folder or sheet (never account).
    pub scope_type: ScopeType,
    /// The object's id.
    pub scope_id: u64,
    /// The role given.
    pub role: Role,
}

/// A saved report. The definition is never exposed; it is compiled when the report runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Caller-chosen id.
    pub id: ReportId,
    /// The project it belongs to; visibility follows the project.
    pub project_id: ProjectId,
    /// The user who saved it; their plan decides whether it may run.
    pub owner_id: UserId,
    /// Display name, shown as the report's `name` and a run's `reportName`.
    pub name: String,
    /// The definition as saved (possibly invalid: that fails at run time, not at save time).
    pub definition: Json,
}

impl Report {
    /// The public `type` of the report: `row` or `summary` as the definition says, else `row`.
    pub fn kind(&self) -> &str {
        match self.definition.0.get("type").and_then(|t| t.as_str()) {
            Some("summary") => "summary",
            _ => "row",
        }
    }
}

/// Whether an API key works: the one rule authentication and the key listings share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// It authenticates.
    Active,
    /// Revoked, for good.
    Revoked,
    /// Past its expiry.
    Expired,
}

impl KeyState {
    /// The state as the admin side spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Revoked => "revoked",
            KeyState::Expired => "expired",
        }
    }
}

/// An API key. Only a SHA-256 hash of the secret is kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApiKey {
    /// Key id (shown as `keyId`).
    pub id: KeyId,
    /// The user whose access the key carries.
    pub owner_id: UserId,
    /// Name chosen at creation.
    pub name: String,
    /// The short visible prefix of the secret (`svc_live_` plus a few characters).
    pub prefix: String,
    /// SHA-256 of the whole secret.
    pub secret_hash: [u8; 32],
    /// The key's grants.
    pub grants: Vec<Grant>,
    /// Creation time.
    pub created_at: Millis,
    /// Expiry; `None` means it never expires.
    pub expires_at: Option<Millis>,
    /// Revoked keys never work again.
    pub revoked: bool,
}

/// The nine column types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    /// Free text, at most 4000 characters.
    Text,
    /// A finite number.
    Number,
    /// A boolean.
    Checkbox,
    /// `YYYY-MM-DD`.
    Date,
    /// RFC 3339, stored normalized to UTC.
    Datetime,
    /// `local@domain`.
    Contact,
    /// One of the column's options.
    Dropdown,
    /// A list of distinct options.
    MultiSelect,
    /// One of the column's options (a symbol set).
    Symbol,
}

impl ColumnType {
    /// The type's name as the API spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ColumnType::Text => "text",
            ColumnType::Number => "number",
            ColumnType::Checkbox => "checkbox",
            ColumnType::Date => "date",
            ColumnType::Datetime => "datetime",
            ColumnType::Contact => "contact",
            ColumnType::Dropdown => "dropdown",
            ColumnType::MultiSelect => "multi_select",
            ColumnType::Symbol => "symbol",
        }
    }

    /// Whether the type carries `options`.
    pub fn has_options(self) -> bool {
        matches!(self, ColumnType::Dropdown | ColumnType::MultiSelect | ColumnType::Symbol)
    }
}

/// A column of a sheet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Column {
    /// Caller-chosen id.
    pub id: ColumnId,
    /// The sheet it belongs to.
    pub sheet_id: SheetId,
    /// Name (reports match columns by name).
    pub name: String,
    /// Type; decides cell coercion.
    pub ty: ColumnType,
    /// Columns are listed by position.
    pub position: i64,
    /// Option keys, for option-bearing types only.
    pub options: Option<Vec<String>>,
    /// Whether this is the sheet's primary column (shown as `primary`).
    pub primary: bool,
}

/// A file attached to a row; only its size is tracked, for the counters a delete frees.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// File name.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
}

impl ApiKey {
    /// The key's state at `now`; only an [`KeyState::Active`] key authenticates.
    pub fn state(&self, now: Millis) -> KeyState {
        if self.revoked {
            KeyState::Revoked
        } else if self.expires_at.is_some_and(|t| t <= now) {
            KeyState::Expired
        } else {
            KeyState::Active
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wal::codec;

    use super::Json;

    #[test]
    fn json_values_round_trip_through_the_codec_and_format_1_text_still_decodes() {
        let values = [
            json!(null),
            json!(true),
            json!(-7),
            json!(u64::MAX),
            json!(1.5),
            json!("text ✓ with \"quotes\""),
            json!(["a", 2, null, [false]]),
            json!({"value": 2.5, "format": "0.0", "nested": {"k": [1, {"x": "y"}]}}),
        ];
        for value in values {
            let bytes = codec::encode(&Json(value.clone())).unwrap();
            assert_eq!(codec::decode::<Json>(&bytes).unwrap(), Json(value.clone()), "{value}");
            // Format 1 stored a cell as its JSON text.
            let mut old = codec::encode(&value.to_string()).unwrap();
            old[0] = 1;
            assert_eq!(codec::decode::<Json>(&old).unwrap(), Json(value.clone()), "{value}");
        }
    }
}
