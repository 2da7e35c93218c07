//! What the crate's unit tests of a whole service share: its settings on a data dir, a
//! directory of one sheet, and single-row writes to it.

use std::path::Path;

use serde_json::json;

use crate::directory::Import;
use crate::sheet::BulkAdd;
use crate::{Service, ServiceConfig};

/// A service's settings on `dir`: one sheet thread, the default clock and retention.
pub(crate) fn config(dir: &Path) -> ServiceConfig {
    ServiceConfig {
        data_dir: dir.to_owned(),
        sheet_threads: 1,
        clock: Default::default(),
        min_free_bytes: None,
        retention: Default::default(),
        archive: None,
    }
}

/// Opens `config`'s data dir and imports user 1, project 1, sheet 10 and its number column
/// 100.
pub(crate) async fn open_with_one_sheet(config: ServiceConfig) -> Service {
    let (service, _) = Service::open(config).unwrap();
    let fixture = serde_json::from_value(json!({
        "users": [{"id": 1, "name": "ada", "plan": "paid"}],
        "projects": [{"id": 1, "name": "P", "ownerId": 1}],
        "sheets": [{"id": 10, "projectId": 1, "name": "A"}],
        "columns": [{"id": 100, "sheetId": 10, "name": "N", "type": "number", "position": 0}]
    }))
    .unwrap();
    service.directory_actor().send(Import(fixture)).await.unwrap().unwrap();
    service
}

/// Adds a row to sheet 10 whose column 100 holds `n`, durably.
pub(crate) async fn add(service: &Service, n: u64) {
    let cells = json!({"100": n}).as_object().unwrap().clone();
    let msg = BulkAdd { items: vec![cells], cap: 1000, idem: None };
    service.sheet(10).unwrap().send(msg).await.unwrap().result.unwrap();
}
