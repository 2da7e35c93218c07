//! OpenAPI schemas of what the views and request bodies hold as free JSON or plain strings,
//! which no derive can infer from the Rust type: cell maps (`cells`, `baseCells`), strings
//! with a fixed set of values (`verb`, `status`, `type`, ...), and the error of a failed bulk
//! item. Fields name them with `#[schema(schema_with = ...)]` or `value_type`; this module
//! names none of the modules that use it.

use serde_json::Value;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::ToSchema;

/// `cells`: raw cell values keyed by column id as a decimal string.
pub fn cells_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$")),
        ))
        .additional_properties(Some(AdditionalProperties::FreeForm(true)))
        .description(Some(
            "Cell values keyed by column id as a string. A value is null, a scalar, a list \
             (multi_select) or a wrapper `{value, format}` / `{formula, value}`, returned \
             verbatim as stored.",
        ))
        .into()
}

/// `baseCells`: like [`cells_schema`], or null.
pub fn nullable_cells_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[0-9]+$")),
        ))
        .additional_properties(Some(AdditionalProperties::FreeForm(true)))
        .description(Some(
            "An advisory snapshot of the cells as last read, used only to classify a version \
             conflict (`conflictingColumns`, `mergeableColumns`); never trusted for the write.",
        ))
        .into()
}

/// A string with a fixed set of values.
fn string_enum(values: &[&str]) -> Schema {
    ObjectBuilder::new().schema_type(Type::String).enum_values(Some(values.iter().copied())).into()
}

/// `verb` of a grant.
pub fn verb_schema() -> Schema {
    string_enum(&["read", "write"])
}

/// `scopeType` of a grant.
pub fn scope_type_schema() -> Schema {
    string_enum(&["account", "project", "folder", "sheet"])
}

/// `status` of a bulk result item.
pub fn bulk_status_schema() -> Schema {
    string_enum(&["succeeded", "failed"])
}

/// `type` of a change: `row.created`, `row.updated` or `row.deleted`.
pub fn change_type_schema() -> Schema {
    string_enum(&["row.created", "row.updated", "row.deleted"])
}

/// `status` of a webhook.
pub fn webhook_status_schema() -> Schema {
    string_enum(&["active", "disabled"])
}

/// `disabledReason` of a webhook: one of the reasons, or null while it is active.
pub fn webhook_disabled_reason_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .enum_values(Some([
            Value::String("failing".into()),
            Value::String("access_lost".into()),
            Value::String("cursor_expired".into()),
            Value::Null,
        ]))
        .into()
}

/// `type` of a webhook message.
pub fn webhook_message_type_schema() -> Schema {
    string_enum(&["sheet.changes"])
}

/// `action` of a bulkUpsert result item.
pub fn upsert_action_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["created", "updated", "unchanged"]))
        .description(Some(
            "bulkUpsertRows only, on a succeeded item: what the item did. `unchanged`: the \
             merge would change nothing, so nothing was written and `row` is the current row.",
        ))
        .into()
}

/// `mode` of a report run.
pub fn report_mode_schema() -> Schema {
    string_enum(&["flat", "aggregated"])
}

/// Any JSON value (`detail` of an envelope whose code has no fixed detail shape).
fn any_value(description: &str) -> Schema {
    ObjectBuilder::new().schema_type(SchemaType::AnyValue).description(Some(description)).into()
}

/// `detail` of an error envelope whose shape depends on its code.
pub fn detail_any() -> Schema {
    any_value("Depends on `errorCode`; null when the code carries none.")
}

/// The error of a failed bulk item: the error envelope without `requestId` (more properties
/// may be added).
#[derive(ToSchema)]
#[schema(rename_all = "camelCase")]
pub struct BulkItemError {
    /// `validation_failed`, `version_conflict`, `capacity_exceeded`, `not_found` or
    /// `forbidden`.
    pub error_code: String,
    /// A sentence naming the problem.
    pub message: String,
    /// As for the same code in a whole-request error.
    #[schema(schema_with = detail_any, required = false)]
    pub detail: Value,
}
