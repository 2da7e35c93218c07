//! End-to-end tests through the real HTTP server and a real data dir: one test binary, a
//! module per area (one binary links once).

mod admin;
mod archive;
mod backup;
mod bench;
mod changes;
mod cluster;
mod common;
mod compression;
mod conditional;
mod crash;
mod faults;
mod limits;
mod openapi;
mod reads;
mod reports;
mod row_queries;
mod snapshots;
mod startup;
mod upsert;
mod webhooks;
mod writes;
