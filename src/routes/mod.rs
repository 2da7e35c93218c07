//! The public API's routes under `/api/v1`, one file per resource (the OpenAPI document and
//! its reference are [`crate::docs`]'s, which stands above the document and so above these
//! handlers), and the admin API's routes ([`admin`]). Every `GET` route also answers `HEAD`
//! ([`crate::routing::read`]); any other unknown method is the 404 envelope
//! (docs/spec/decisions.md §9).

pub mod admin;
pub mod changes;
pub mod export;
pub mod me;
pub mod reports;
pub mod rows;
pub mod sheets;
pub mod webhooks;

use actix_web::web;

use crate::routing::{no_route, read, resource};

/// Register every route of the public API.
pub fn configure(cfg: &mut web::ServiceConfig) {
    // actix tries resources in the order they are registered, and a path with a `{segment}`
    // costs one regex run (regex-lite's pike VM) each: with five dynamic routes tried before
    // patchRow's, regex-lite took 5.5 % of the server's CPU in a profile of patches at 64
    // connections. So the static paths (a string compare) come first, then the dynamic ones by
    // how hot they are: single-row reads and writes, pages, bulk writes, then the rest.
    cfg.service(resource("/me").route(read().to(me::get_me)))
        .service(resource("/sheets").route(read().to(sheets::list_sheets)))
        .service(resource("/reports").route(read().to(reports::list_reports)))
        .service(
            resource("/sheets/{sheet_id}/rows/{row_id}")
                .route(read().to(rows::get_row))
                .route(web::patch().to(rows::patch_row))
                .route(web::delete().to(rows::delete_row)),
        )
        .service(resource("/sheets/{sheet_id}/rows").route(read().to(rows::list_rows)))
        .service(
            resource("/sheets/{sheet_id}/rows:bulkAdd").route(web::post().to(rows::bulk_add_rows)),
        )
        .service(
            resource("/sheets/{sheet_id}/rows:bulkUpdate")
                .route(web::post().to(rows::bulk_update_rows)),
        )
        .service(
            resource("/sheets/{sheet_id}/rows:bulkUpsert")
                .route(web::post().to(rows::bulk_upsert_rows)),
        )
        .service(resource("/sheets/{sheet_id}").route(read().to(sheets::get_sheet)))
        .service(resource("/sheets/{sheet_id}/columns").route(read().to(sheets::list_columns)))
        .service(resource("/sheets/{sheet_id}/changes").route(read().to(changes::list_changes)))
        .service(resource("/sheets/{sheet_id}/export").route(read().to(export::export_rows)))
        .service(resource("/reports/{report_id}").route(read().to(reports::get_report)))
        .service(resource("/reports/{report_id}/run").route(web::post().to(reports::run_report)))
        .service(
            resource("/webhooks")
                .route(read().to(webhooks::list_webhooks))
                .route(web::post().to(webhooks::create_webhook)),
        )
        // Before `/webhooks/{webhook_id}`, whose segment would also match `5:enable`.
        .service(
            resource("/webhooks/{webhook_id}:enable")
                .route(web::post().to(webhooks::enable_webhook)),
        )
        .service(
            resource("/webhooks/{webhook_id}")
                .route(read().to(webhooks::get_webhook))
                .route(web::delete().to(webhooks::delete_webhook)),
        )
        .default_service(web::to(no_route));
}
