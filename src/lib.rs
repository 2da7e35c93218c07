//! sheetd: the HTTP server and CLI over the [`actors`] domain.
//!
//! # Layout
//!
//! - [`config`]: command line and environment.
//! - [`apps`]: the public and admin applications: routes behind middleware.
//! - [`server`]: start-up (recovery, seeding), the two listeners, graceful stop.
//! - [`cluster`]: a cluster node's settings, its shared cursor key, its life as a leader.
//! - [`local_cluster`]: `sheetd cluster up`, N nodes on this machine for trying a cluster.
//! - [`forward`]: a cluster node's requests sent on to the leader, and those it runs for others.
//! - [`state`]: what every handler reaches ([`state::AppState`]).
//! - [`middleware`]: request ids, rate limiting, panics, the error envelope, request logs.
//! - [`auth`]: bearer keys, the admin token, and the one authorization function.
//! - [`error`]: the one API error type and its code table.
//! - [`input`]: path, query and body parsing into the contract's 422 bodies.
//! - [`compression`]: compressed responses and compressed request bodies.
//! - [`cursor`]: the one cursor codec.
//! - [`idempotency`]: `Idempotency-Key` on row writes.
//! - [`conditional`]: `ETag`, `If-None-Match` (304) and `If-Match` (412).
//! - [`rate_limit`]: the rolling-minute limiter.
//! - [`routes`]: one file per resource, and the admin side.
//! - [`routing`]: resources and read routes as both APIs build them, and the 404 of no route.
//! - [`response`]: the successful answers of handlers.
//! - [`views`]: response bodies, the public API's and the admin API's.
//! - [`openapi`]: the OpenAPI 3.1 document derived from the handlers and views.
//! - [`api_doc`]: what the operations share in it: parameters, error envelopes and responses.
//! - [`schema`]: the schemas of the views' free-JSON and fixed-string fields.
//! - [`docs`]: the document and its interactive reference, served under `/api/v1`.
//! - [`metrics`]: request counters, and everything the admin metrics endpoint exports.
//! - [`prometheus`]: the text format the admin metrics endpoint speaks.
//! - [`maintenance`]: background checkpoints and side-store housekeeping.
//! - [`webhooks`]: webhook deliveries (X8): address checks, signatures, the delivery thread.
//! - [`logging`]: the log's filter and format, and the server's writer thread.
//! - [`cli`]: the offline operator commands (`sheetd key ...`, `sheetd check`).
//! - [`backup`]: `sheetd backup`, `sheetd backup verify` and `sheetd restore`, and the admin
//!   endpoint's stream of a backup.
//!
//! The load tester behind `sheetd bench` is a crate of its own (`sheetd-bench`); this library
//! does not use it; the binary gives it a way to start this server in-process.

pub mod api_doc;
pub mod apps;
pub mod auth;
pub mod backup;
pub mod cli;
pub mod cluster;
pub mod compression;
pub mod conditional;
pub mod config;
pub mod cursor;
pub mod docs;
pub mod error;
pub mod forward;
pub mod forwarded;
pub mod idempotency;
pub mod input;
pub mod local_cluster;
pub mod logging;
pub mod maintenance;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod priority;
pub mod prometheus;
pub mod rate_limit;
pub mod response;
pub mod routes;
pub mod routing;
pub mod schema;
pub mod server;
pub mod state;
pub mod views;
pub mod webhooks;
