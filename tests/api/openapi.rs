//! The OpenAPI document at `/api/v1/openapi.json` and the Swagger UI at `/api/v1/docs`: the
//! document says what the spec says (operations, parameters, envelopes, headers, security),
//! the live responses have the documented fields, and the reference page loads nothing from
//! outside this server. Full schema conformance under fuzzing is `.ci/schemathesis.sh`.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::common::*;

/// The spec's endpoint table and the extensions' operations (getRow, bulkUpsertRows,
/// listChanges, exportRows, the webhooks): operation id, method, path (relative to
/// `{base_url}`).
const OPERATIONS: [(&str, &str, &str); 21] = [
    ("getMe", "get", "/me"),
    ("listSheets", "get", "/sheets"),
    ("getSheet", "get", "/sheets/{sheet_id}"),
    ("listColumns", "get", "/sheets/{sheet_id}/columns"),
    ("listRows", "get", "/sheets/{sheet_id}/rows"),
    ("getRow", "get", "/sheets/{sheet_id}/rows/{row_id}"),
    ("listReports", "get", "/reports"),
    ("getReport", "get", "/reports/{report_id}"),
    ("runReport", "post", "/reports/{report_id}/run"),
    ("bulkAddRows", "post", "/sheets/{sheet_id}/rows:bulkAdd"),
    ("bulkUpdateRows", "post", "/sheets/{sheet_id}/rows:bulkUpdate"),
    ("bulkUpsertRows", "post", "/sheets/{sheet_id}/rows:bulkUpsert"),
    ("patchRow", "patch", "/sheets/{sheet_id}/rows/{row_id}"),
    ("deleteRow", "delete", "/sheets/{sheet_id}/rows/{row_id}"),
    ("listChanges", "get", "/sheets/{sheet_id}/changes"),
    ("exportRows", "get", "/sheets/{sheet_id}/export"),
    ("createWebhook", "post", "/webhooks"),
    ("listWebhooks", "get", "/webhooks"),
    ("getWebhook", "get", "/webhooks/{webhook_id}"),
    ("deleteWebhook", "delete", "/webhooks/{webhook_id}"),
    ("enableWebhook", "post", "/webhooks/{webhook_id}:enable"),
];

const WRITES: [&str; 5] =
    ["bulkAddRows", "bulkUpdateRows", "bulkUpsertRows", "patchRow", "deleteRow"];

/// The reads with an `ETag` and 304 (docs/spec/extensions.md X2).
const CONDITIONAL_READS: [&str; 4] = ["getRow", "getSheet", "listColumns", "listRows"];

/// The writes that take `If-Match` and may answer 412 (docs/spec/extensions.md X2).
const PRECONDITIONED: [&str; 2] = ["patchRow", "deleteRow"];

/// Fetch the document without a key.
async fn document(s: &TestServer) -> Value {
    let (status, doc, headers) = s.call("GET", "/openapi.json", None, None).await;
    assert_eq!(status, 200, "{doc}");
    assert_eq!(headers.get("content-type").unwrap(), "application/json");
    doc
}

/// Every operation of the document as `(operationId, method, path, operation)`.
fn operations(doc: &Value) -> Vec<(String, String, String, Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"].as_str().unwrap_or_default().to_owned();
            ops.push((id, method.clone(), path.clone(), op.clone()));
        }
    }
    ops
}

/// Follow a `$ref` within the document.
fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v["$ref"].as_str() {
        Some(r) => {
            let pointer = r.strip_prefix('#').expect("a local $ref");
            resolve(doc, doc.pointer(pointer).unwrap_or_else(|| panic!("dangling $ref {r}")))
        }
        None => v,
    }
}

/// The properties and required names of an object schema, `allOf` parts merged.
fn object_shape(doc: &Value, schema: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let schema = resolve(doc, schema);
    let (mut props, mut required) = (BTreeSet::new(), BTreeSet::new());
    if let Some(parts) = schema["allOf"].as_array() {
        for part in parts {
            let (p, r) = object_shape(doc, part);
            props.extend(p);
            required.extend(r);
        }
    }
    if let Some(p) = schema["properties"].as_object() {
        props.extend(p.keys().cloned());
    }
    if let Some(r) = schema["required"].as_array() {
        required.extend(r.iter().map(|n| n.as_str().unwrap().to_owned()));
    }
    (props, required)
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[actix_rt::test]
async fn openapi_document_is_3_1_and_lists_exactly_its_operations() {
    let s = TestServer::start().await;
    let doc = document(&s).await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1."), "{}", doc["openapi"]);
    assert_eq!(doc["info"]["version"], "1.0.0");
    assert_eq!(
        doc["servers"],
        json!([{"url": "/api/v1", "description": doc["servers"][0]["description"]}])
    );

    let found: BTreeSet<(String, String, String)> =
        operations(&doc).into_iter().map(|(id, m, p, _)| (id, m, p)).collect();
    let expected: BTreeSet<(String, String, String)> = OPERATIONS
        .iter()
        .map(|(id, m, p)| (id.to_string(), m.to_string(), p.to_string()))
        .collect();
    assert_eq!(found, expected);

    for (id, _, path, op) in operations(&doc) {
        // Path parameters: exactly the names in the template, integer, required.
        let in_template: BTreeSet<String> = path
            .split('{')
            .skip(1)
            .map(|rest| rest.split('}').next().unwrap().to_owned())
            .collect();
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        let in_path: BTreeSet<String> = params
            .iter()
            .filter(|p| p["in"] == "path")
            .map(|p| {
                assert_eq!(p["required"], true, "{id}: {p}");
                assert_eq!(p["schema"]["type"], "integer", "{id}: {p}");
                p["name"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(in_path, in_template, "{id}");
        assert!(in_path
            .iter()
            .all(|n| ["sheet_id", "row_id", "report_id", "webhook_id"].contains(&n.as_str())));
        // Writes take the optional Idempotency-Key header; nothing else does.
        let idem = params.iter().find(|p| p["in"] == "header" && p["name"] == "Idempotency-Key");
        assert_eq!(idem.is_some(), WRITES.contains(&id.as_str()), "{id}");
        if let Some(idem) = idem {
            assert_eq!(idem["required"], false);
            assert_eq!(idem["schema"]["maxLength"], 255);
        }
        // Conditional requests: If-None-Match on the reads with an ETag, If-Match on two writes.
        for (name, takers) in
            [("If-None-Match", &CONDITIONAL_READS[..]), ("If-Match", &PRECONDITIONED[..])]
        {
            let p = params.iter().find(|p| p["in"] == "header" && p["name"] == name);
            assert_eq!(p.is_some(), takers.contains(&id.as_str()), "{id} {name}");
            if let Some(p) = p {
                assert_eq!(
                    (&p["required"], &p["schema"]["type"]),
                    (&json!(false), &json!("string"))
                );
            }
        }
        // Paged operations document limit (and cursor).
        let query: BTreeSet<&str> = params
            .iter()
            .filter(|p| p["in"] == "query")
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        let expected_query: &[&str] = match id.as_str() {
            "listSheets" | "listReports" | "runReport" | "listWebhooks" => &["cursor", "limit"],
            // docs/spec/extensions.md X6: the leaner reads.
            "listRows" => &["cursor", "fields", "filter", "limit"],
            "getSheet" => &["limit"],
            // docs/spec/extensions.md X3 and X4.
            "listChanges" => &["cursor", "limit", "wait"],
            "exportRows" => &["fields", "filter", "format"],
            _ => &[],
        };
        assert_eq!(query, expected_query.iter().copied().collect(), "{id}");
    }
}

#[actix_rt::test]
async fn every_operation_documents_its_error_statuses_with_the_envelope_and_headers() {
    let s = TestServer::start().await;
    let doc = document(&s).await;

    let (props, required) =
        object_shape(&doc, &json!({"$ref": "#/components/schemas/ErrorEnvelope"}));
    assert_eq!(props, names(&["detail", "errorCode", "message", "requestId"]));
    assert_eq!(required, names(&["errorCode", "message", "requestId"]));
    let codes = doc["components"]["schemas"]["ErrorEnvelope"]["properties"]["errorCode"]
        ["description"]
        .as_str()
        .unwrap();
    assert!(codes.contains("`precondition_failed`"), "{codes}");
    assert!(codes.contains("`cursor_expired`"), "{codes}");
    let scheme = &doc["components"]["securitySchemes"]["bearerAuth"];
    assert_eq!(
        (scheme["type"].as_str(), scheme["scheme"].as_str()),
        (Some("http"), Some("bearer"))
    );
    assert_eq!(doc["security"], json!([{"bearerAuth": []}]));

    for (id, method, path, op) in operations(&doc) {
        // The reads a cluster node may answer from its own state take `Sheetd-Consistency`.
        let consistency = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == "Sheetd-Consistency" && p["in"] == "header");
        let local = method == "get" && !path.starts_with("/webhooks");
        assert_eq!(consistency, local, "{id}: Sheetd-Consistency");
        let responses = op["responses"].as_object().unwrap();
        let statuses: BTreeSet<&str> = responses.keys().map(String::as_str).collect();
        // 503: `cluster_unavailable` on a cluster node, `storage_unavailable` on a write.
        let mut expected: BTreeSet<&str> = ["401", "429", "500", "503"].into();
        expected.insert(match id.as_str() {
            "deleteRow" | "deleteWebhook" => "204",
            "createWebhook" => "201",
            _ => "200",
        });
        if !["getMe", "listSheets", "listReports", "listWebhooks"].contains(&id.as_str()) {
            expected.insert("404");
        }
        // Every operation: a bad body, query or cursor, or (the reads a cluster node may answer
        // locally, getMe among them) a `Sheetd-Consistency` value it does not know.
        expected.insert("422");
        if WRITES.contains(&id.as_str()) {
            expected.extend(["403", "409"]);
            if id != "deleteRow" {
                expected.insert("413");
            }
        }
        if id == "runReport" {
            expected.extend(["402", "413"]);
        }
        if CONDITIONAL_READS.contains(&id.as_str()) {
            expected.insert("304");
        }
        if PRECONDITIONED.contains(&id.as_str()) {
            expected.insert("412");
        }
        if ["listChanges", "createWebhook", "enableWebhook"].contains(&id.as_str()) {
            expected.insert("410");
        }
        if id == "createWebhook" {
            expected.insert("413");
        }
        assert_eq!(statuses, expected, "{id}");
        if id == "exportRows" {
            let headers = &responses["200"]["headers"];
            assert!(headers.get("Sheet-Changes-Cursor").is_some(), "{headers}");
            assert_eq!(headers["X-Request-Id"]["required"], true);
        }

        for (status, response) in responses {
            let response = resolve(&doc, response);
            let headers = &response["headers"];
            for h in [
                "X-Request-Id",
                "X-RateLimit-Limit",
                "X-RateLimit-Remaining",
                "X-RateLimit-Reset",
                "RateLimit",
                "RateLimit-Policy",
            ] {
                assert_eq!(headers[h]["required"], true, "{id} {status} header {h}");
            }
            let retry = ["429", "503"].contains(&status.as_str());
            assert_eq!(headers.get("Retry-After").is_some(), retry, "{id} {status}");
            if WRITES.contains(&id.as_str()) && ["200", "204", "412"].contains(&status.as_str()) {
                assert!(headers.get("Idempotent-Replayed").is_some(), "{id} {status}");
            }
            let etag = CONDITIONAL_READS.contains(&id.as_str())
                && ["200", "304"].contains(&status.as_str());
            assert_eq!(headers.get("ETag").is_some(), etag, "{id} {status}");
            if etag {
                assert_eq!(headers["ETag"]["required"], true, "{id} {status}");
            }
            if status == "304" {
                assert!(response.get("content").is_none(), "{id}: a 304 has no body");
            }
            if status == "412" {
                let schema = &response["content"]["application/json"]["schema"];
                let detail = &resolve(&doc, schema)["properties"]["detail"];
                let (_, required) = object_shape(&doc, detail);
                assert_eq!(required, names(&["current", "currentVersion"]), "{id}");
            }
            if status.starts_with('4') || status.starts_with('5') {
                let schema = &response["content"]["application/json"]["schema"];
                let (props, required) = object_shape(&doc, schema);
                assert!(props.is_superset(&names(&["errorCode", "message", "requestId"])));
                assert!(required.is_superset(&names(&["errorCode", "message", "requestId"])));
            }
        }
    }
}

#[actix_rt::test]
async fn schemas_are_camel_case_with_the_spec_required_fields() {
    let s = TestServer::start().await;
    let doc = document(&s).await;
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    // Field names are camelCase, except the two `detail` shapes the spec gives in snake_case.
    for (name, schema) in schemas {
        let (props, _) = object_shape(&doc, schema);
        for p in props {
            let allowed = ["column_id", "retry_after_seconds"].contains(&p.as_str());
            assert!(!p.contains('_') || allowed, "{name}.{p} is not camelCase");
        }
    }
    let shape = |name: &str| object_shape(&doc, &schemas[name]);
    let required = |name: &str| shape(name).1;

    assert_eq!(
        required("MeResponseV1"),
        names(&["keyId", "ownerId", "rateLimit", "requestId", "scopes"])
    );
    assert_eq!(required("RateLimit"), names(&["limit", "remaining", "reset"]));
    assert_eq!(required("SheetV1"), names(&["columnCount", "id", "name", "projectId", "rowCount"]));
    assert!(required("SheetV1WithChildren").is_superset(&names(&["columns", "rows", "requestId"])));
    assert_eq!(required("ColumnV1"), names(&["id", "name", "position", "sheetId", "type"]));
    assert_eq!(required("RowV1"), names(&["cells", "id", "sheetId", "updatedBy", "version"]));
    assert_eq!(required("ReportSummaryV1"), names(&["id", "name", "projectId", "type"]));
    assert_eq!(
        required("ReportRun"),
        names(&[
            "columns",
            "mode",
            "reportId",
            "reportName",
            "rows",
            "scannedRows",
            "sourcesOmittedForAccess",
            "totalMatched"
        ])
    );
    assert_eq!(required("ReportRunEnvelopeV1"), names(&["data", "requestId"]));
    assert_eq!(
        required("BulkWriteResponse"),
        names(&["failedCount", "requestId", "results", "succeededCount"])
    );
    assert_eq!(required("BulkResultItem"), names(&["index", "status"]));
    assert_eq!(required("RowUpdateItem"), names(&["id", "version"]));
    assert_eq!(required("BulkUpsertRequest"), names(&["keyColumn", "rows"]));
    assert_eq!(schemas["BulkUpsertRequest"]["properties"]["keyColumn"]["type"], "string");
    let action = &schemas["BulkResultItem"]["properties"]["action"];
    assert_eq!(action["enum"], json!(["created", "updated", "unchanged"]), "{action}");
    // Required as api-v1 has it; a request with `If-Match` may leave it out (extensions X2), which
    // no schema can say.
    assert_eq!(required("RowPatch"), names(&["version"]));

    // Nullable and optional where the spec says so.
    let column = &schemas["ColumnV1"]["properties"];
    assert_eq!(column["options"]["type"], json!(["array", "null"]));
    assert_eq!(schemas["RowV1"]["properties"]["cells"]["additionalProperties"], true);
    assert_eq!(schemas["RowV1"]["properties"]["version"]["minimum"], 1);
    for list in
        ["ListView_SheetV1", "ListView_ColumnV1", "ListView_RowV1", "ListView_ReportSummaryV1"]
    {
        assert_eq!(required(list), names(&["data", "requestId"]), "{list}");
        assert_eq!(schemas[list]["properties"]["nextCursor"]["type"], json!(["string", "null"]));
    }
    for (name, field) in
        [("BulkAddRequest", "rows"), ("BulkUpdateRequest", "rows"), ("BulkUpsertRequest", "rows")]
    {
        let rows = &schemas[name]["properties"][field];
        assert_eq!((rows["minItems"].as_u64(), rows["maxItems"].as_u64()), (Some(1), Some(2000)));
        assert_eq!(schemas[name]["additionalProperties"], false, "unknown fields are refused");
    }
    assert_eq!(schemas["RowPatch"]["properties"]["version"]["minimum"], 1);
    assert_eq!(schemas["RowPatch"]["properties"]["baseCells"]["type"], json!(["object", "null"]));
    assert_eq!(schemas["ScopeGrant"]["properties"]["scopeId"]["type"], json!(["integer", "null"]));
    assert_eq!(
        schemas["ValidationProblem"]["required"],
        json!(["loc", "msg", "type"]),
        "the 422 detail item"
    );
}

/// The 200 schema of an operation.
fn ok_schema<'a>(doc: &'a Value, id: &str) -> &'a Value {
    let (_, method, path) = OPERATIONS.iter().find(|(i, _, _)| *i == id).unwrap();
    &doc["paths"][*path][*method]["responses"]["200"]["content"]["application/json"]["schema"]
}

/// Live bodies carry every required field and no undocumented one.
fn assert_matches_shape(doc: &Value, schema: &Value, body: &Value, what: &str) {
    let (props, required) = object_shape(doc, schema);
    let keys: BTreeSet<String> = body.as_object().unwrap().keys().cloned().collect();
    assert!(
        keys.is_subset(&props),
        "{what}: undocumented fields in {keys:?} (documented {props:?})"
    );
    assert!(keys.is_superset(&required), "{what}: missing required fields of {required:?}");
}

#[actix_rt::test]
async fn live_responses_have_the_documented_fields() {
    let s = TestServer::start().await;
    let doc = document(&s).await;
    for (id, path) in [
        ("getMe", "/me"),
        ("listSheets", "/sheets"),
        ("getSheet", "/sheets/10"),
        ("listColumns", "/sheets/10/columns"),
        ("listRows", "/sheets/10/rows"),
        ("getRow", "/sheets/10/rows/1003"),
        ("listReports", "/reports"),
        ("getReport", "/reports/7"),
    ] {
        let (status, body, _) = s.get(path, ADA_WRITE).await;
        assert_eq!(status, 200, "{id}: {body}");
        assert_matches_shape(&doc, ok_schema(&doc, id), &body, id);
    }
    let (status, run, _) = s.call("POST", "/reports/8/run", Some(ADA_WRITE), None).await;
    assert_eq!(status, 200, "{run}");
    assert_matches_shape(&doc, ok_schema(&doc, "runReport"), &run, "runReport");
    assert_matches_shape(
        &doc,
        &doc["components"]["schemas"]["ReportRun"],
        &run["data"],
        "ReportRun",
    );

    let (status, bulk, _) = s
        .post(
            "/sheets/10/rows:bulkAdd",
            ADA_WRITE,
            &json!({"rows": [{"cells": {"100": "x"}}, {"cells": {"999": 1}}]}),
        )
        .await;
    assert_eq!(status, 200, "{bulk}");
    assert_matches_shape(&doc, ok_schema(&doc, "bulkAddRows"), &bulk, "bulkAddRows");
    let items = &doc["components"]["schemas"]["BulkResultItem"];
    for item in bulk["results"].as_array().unwrap() {
        assert_matches_shape(&doc, items, item, "BulkResultItem");
    }
    let (status, upserted, _) = s
        .post(
            "/sheets/10/rows:bulkUpsert",
            ADA_WRITE,
            &json!({"keyColumn": "100", "rows": [
                {"cells": {"100": "x", "102": 1}}, {"cells": {"100": "x"}}, {"cells": {}}
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{upserted}");
    assert_matches_shape(&doc, ok_schema(&doc, "bulkUpsertRows"), &upserted, "bulkUpsertRows");
    for item in upserted["results"].as_array().unwrap() {
        assert_matches_shape(&doc, items, item, "BulkResultItem");
    }
    let cell_problem = &doc["components"]["schemas"]["CellProblem"];
    assert_matches_shape(
        &doc,
        cell_problem,
        &upserted["results"][2]["error"]["detail"],
        "CellProblem",
    );
    let (status, patched, _) = s
        .call(
            "PATCH",
            "/sheets/10/rows/1003",
            Some(ADA_WRITE),
            Some(&json!({"version": 1, "cells": {"100": "y"}})),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert_matches_shape(&doc, ok_schema(&doc, "patchRow"), &patched, "patchRow");
    let error = s
        .call("PATCH", "/sheets/10/rows/1003", Some(ADA_WRITE), Some(&json!({"version": 1})))
        .await;
    assert_error(&error, 409, "version_conflict");
    let detail = &doc["components"]["schemas"]["VersionConflictDetail"];
    assert_matches_shape(&doc, detail, &error.1["detail"], "VersionConflictDetail");
    let url = format!("{}/sheets/10/rows/1003", s.base);
    let body = json!({"cells": {"100": "z"}}).to_string().into_bytes();
    let refused =
        s.raw("PATCH", &url, Some(ADA_WRITE), &[("If-Match", "\"1003.1\"")], Some(body)).await;
    assert_error(&refused, 412, "precondition_failed");
    let envelope = &doc["components"]["schemas"]["PreconditionErrorEnvelope"];
    assert_matches_shape(&doc, envelope, &refused.1, "PreconditionErrorEnvelope");
    assert_matches_shape(&doc, detail, &refused.1["detail"], "VersionConflictDetail");
}

/// The `src` and `href` attribute values of an HTML page.
fn referenced_urls(html: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for attr in ["src=\"", "href=\""] {
        for part in html.split(attr).skip(1) {
            urls.push(part.split('"').next().unwrap().to_owned());
        }
    }
    urls
}

#[actix_rt::test]
async fn docs_page_and_everything_it_loads_are_served_locally_without_a_key() {
    let s = TestServer::start().await;
    let origin = s.base.trim_end_matches("/api/v1").to_owned();
    for page in ["/docs", "/docs/"] {
        let (status, html, headers) = s.call("GET", page, None, None).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(headers.get("content-type").unwrap(), "text/html; charset=utf-8");
        assert!(headers.get("x-request-id").is_some());
        let html = html.as_str().unwrap().to_owned();
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "an absolute URL in {html}"
        );
        let urls = referenced_urls(&html);
        assert!(urls.iter().any(|u| u.ends_with("swagger-ui-bundle.js")), "{urls:?}");
        assert!(urls.iter().any(|u| u.ends_with("swagger-ui.css")), "{urls:?}");
        assert!(urls.iter().any(|u| u.ends_with("swagger-initializer.js")), "{urls:?}");
        for url in &urls {
            assert!(url.starts_with('/') && !url.starts_with("//"), "not a local path: {url}");
            let (status, body, headers) =
                send("GET", &format!("{origin}{url}"), None, &[], None).await;
            assert_eq!(status, 200, "{url}");
            assert!(!body.is_null(), "{url} is empty");
            let media_type = headers.get("content-type").unwrap().to_str().unwrap();
            let expected = match url.rsplit('.').next().unwrap() {
                "js" => "text/javascript",
                "css" => "text/css",
                "png" => "image/png",
                other => panic!("unexpected asset type {other}"),
            };
            assert!(media_type.starts_with(expected), "{url}: {media_type}");
        }
    }
    // The initializer points Swagger UI at this server's document and at nothing outside.
    let (_, init, _) = s.call("GET", "/docs/swagger-initializer.js", None, None).await;
    let init = init.as_str().unwrap();
    assert!(init.contains("url: \"/api/v1/openapi.json\""), "{init}");
    assert!(init.contains("validatorUrl: null"), "no outside validator badge");
    assert!(!init.contains("http://") && !init.contains("https://"), "{init}");

    let missing = s.call("GET", "/docs/swagger-ui.css.map", None, None).await;
    assert_error(&missing, 404, "not_found");
}

#[actix_rt::test]
async fn docs_are_public_but_rate_limited_and_unknown_routes_stay_404_envelopes() {
    let s = TestServer::start_with(fixture(), |a| a.rate_limit_per_minute = 3).await;
    for _ in 0..3 {
        let (status, _, headers) = s.call("GET", "/openapi.json", None, None).await;
        assert_eq!(status, 200);
        assert!(headers.get("x-ratelimit-remaining").is_some());
    }
    let limited = s.call("GET", "/docs", None, None).await;
    assert_error(&limited, 429, "rate_limit_exceeded");
    assert!(limited.2.get("retry-after").is_some());
    // A keyed caller has its own window: the anonymous IP's is not its concern.
    let (status, _, _) = s.call("GET", "/openapi.json", Some(ADA_READ), None).await;
    assert_eq!(status, 200);
    let unknown = s.call("GET", "/openapi.yaml", Some(ADA_READ), None).await;
    assert_error(&unknown, 404, "not_found");
    let wrong_method = s.call("POST", "/openapi.json", Some(ADA_READ), None).await;
    assert_error(&wrong_method, 404, "not_found");
}

#[actix_rt::test]
async fn the_document_says_what_the_server_does_at_the_edges() {
    let s = TestServer::start().await;
    let doc = document(&s).await;
    for (id, _, _, op) in operations(&doc) {
        assert!(op.get("parameters").is_none_or(Value::is_array), "{id}");
        for p in op["parameters"].as_array().cloned().unwrap_or_default() {
            match (p["in"].as_str(), p["name"].as_str()) {
                // A larger limit is clamped, not refused: no maximum, and the clamp described.
                (Some("query"), Some("limit")) => {
                    assert_eq!(p["schema"]["type"], "integer", "{id}");
                    assert_eq!(p["schema"]["minimum"], 1, "{id}");
                    assert!(p["schema"].get("maximum").is_none(), "{id}: {p}");
                    // int64 would bound it too: a limit beyond 64 bits is clamped as well.
                    assert!(p["schema"].get("format").is_none(), "{id}: {p}");
                    assert_eq!(p["schema"]["default"], 100, "{id}");
                    assert!(p["description"].as_str().unwrap().contains("clamped to 500"), "{id}");
                }
                // An empty cursor is refused, and the schema says so.
                (Some("query"), Some("cursor")) => {
                    assert_eq!(p["schema"]["minLength"], 1, "{id}: {p}");
                }
                _ => {}
            }
        }
    }
    // ... and the server agrees on both.
    for limit in ["501", "9223372036854775808", "99999999999999999999999"] {
        let (status, page, _) = s.get(&format!("/sheets/11/rows?limit={limit}"), ADA_READ).await;
        assert_eq!((status, page["data"].as_array().unwrap().len()), (200, 1), "{limit}");
    }
    assert_error(&s.get("/sheets/11/rows?cursor=", ADA_READ).await, 422, "validation_failed");
    // `column_id` of a refused cell: an id, or the key as sent.
    let column_id = &doc["components"]["schemas"]["CellProblem"]["properties"]["column_id"];
    let types: Vec<&Value> =
        column_id["anyOf"].as_array().unwrap().iter().map(|t| &t["type"]).collect();
    assert_eq!(types, [&json!("integer"), &json!("string")], "{column_id}");
    // Body integers are JSON Schema integers, which the server takes in any integral spelling.
    let patch = &doc["components"]["schemas"]["RowPatch"]["properties"]["version"];
    assert_eq!((&patch["type"], &patch["minimum"]), (&json!("integer"), &json!(1)), "{patch}");
}

/// A value the document itself gives a parameter: its example, else its default, else the
/// first of its values.
fn documented_value(p: &Value) -> Option<String> {
    let schema = &p["schema"];
    let value = [&p["example"], &schema["example"], &schema["default"], &schema["enum"][0]]
        .into_iter()
        .find(|v| !v.is_null())?;
    Some(value.as_str().map_or_else(|| value.to_string(), str::to_owned))
}

#[actix_rt::test]
async fn a_parameter_is_required_in_the_document_exactly_when_the_server_refuses_a_request_without_it(
) {
    let s = TestServer::start().await;
    let doc = document(&s).await;
    let origin = s.base.trim_end_matches("/api/v1").to_owned();
    let server = doc["servers"][0]["url"].as_str().unwrap();
    let mut checked = 0;
    for (id, method, path, op) in operations(&doc) {
        let params = op["parameters"].as_array().cloned().unwrap_or_default();
        // The path's ids are the documented examples, which name objects of the fixture; the
        // body, when there is one, is the documented example of the request schema.
        let mut url_path = path.clone();
        for p in params.iter().filter(|p| p["in"] == "path") {
            let name = p["name"].as_str().unwrap();
            let value = documented_value(p).unwrap_or_else(|| panic!("{id}: no example of {p}"));
            url_path = url_path.replace(&format!("{{{name}}}"), &value);
        }
        let body = op["requestBody"]["content"]["application/json"]["schema"]
            .as_object()
            .map(|schema| resolve(&doc, &Value::Object(schema.clone()))["example"].clone())
            .inspect(|example| assert!(!example.is_null(), "{id}: no request body example"))
            .map(|example| example.to_string().into_bytes());
        let others: Vec<&Value> =
            params.iter().filter(|p| p["in"] == "query" || p["in"] == "header").collect();
        for left_out in &others {
            let (place, name) =
                (left_out["in"].as_str().unwrap(), left_out["name"].as_str().unwrap());
            // Every other parameter the document requires, with a value it documents.
            let (mut query, mut headers) = (Vec::new(), Vec::new());
            for p in others.iter().filter(|p| p["required"] == true && p["name"] != name) {
                let value = documented_value(p)
                    .unwrap_or_else(|| panic!("{id}: a required parameter with no value: {p}"));
                match p["in"].as_str() {
                    Some("query") => query.push(format!("{}={value}", p["name"].as_str().unwrap())),
                    _ => headers.push((p["name"].as_str().unwrap().to_owned(), value)),
                }
            }
            let mut url = format!("{origin}{server}{url_path}");
            if !query.is_empty() {
                url = format!("{url}?{}", query.join("&"));
            }
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            let (status, reply, _) =
                send(&method.to_uppercase(), &url, Some(ADA_WRITE), &headers, body.clone()).await;
            let refused_for_it = status == 422
                && reply["detail"]
                    .as_array()
                    .is_some_and(|d| d.iter().any(|d| d["loc"] == json!([place, name])));
            let required = left_out["required"] == true;
            assert_eq!(
                refused_for_it, required,
                "{id} without {place} `{name}` (documented required: {required}): {status} {reply}"
            );
            if !required {
                // Not refused for anything else either: the request did reach the operation.
                assert_ne!(status, 422, "{id} without {place} `{name}`: {reply}");
            }
            checked += 1;
        }
    }
    // listRows alone has five such parameters.
    assert!(checked > 20, "{checked} parameters checked");
}

/// The delivery is described as an OpenAPI 3.1 webhook: its signed headers and its body.
#[actix_rt::test]
async fn the_delivery_is_documented_as_an_openapi_webhook() {
    let s = TestServer::start().await;
    let doc = document(&s).await;
    let post = &doc["webhooks"]["sheetChanges"]["post"];
    let headers: BTreeSet<String> = post["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in"] == "header" && p["required"] == true)
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        headers,
        names(&["User-Agent", "webhook-id", "webhook-signature", "webhook-timestamp"])
    );
    assert_eq!(post["security"], json!([]), "a receiver is not called with a key");
    let body = &post["requestBody"]["content"]["application/json"]["schema"];
    let (props, required) = object_shape(&doc, body);
    assert_eq!(props, names(&["data", "nextCursor", "sheetId", "type", "webhookId"]));
    assert_eq!(required, props);
    let change = resolve(
        &doc,
        &doc["components"]["schemas"]["WebhookMessage"]["properties"]["data"]["items"],
    );
    assert!(change["properties"].get("seq").is_some(), "{change}");
    let (props, required) = object_shape(&doc, &json!({"$ref": "#/components/schemas/Webhook"}));
    assert_eq!(
        props,
        names(&[
            "consecutiveFailures",
            "createdAt",
            "cursor",
            "description",
            "disabledReason",
            "id",
            "lastDelivery",
            "pendingChanges",
            "sheetId",
            "status",
            "url",
        ])
    );
    assert!(required.is_superset(&names(&["id", "sheetId", "url", "status", "cursor"])));
    let created = &doc["components"]["schemas"]["WebhookCreated"];
    assert!(created.to_string().contains("secret"), "{created}");
}
