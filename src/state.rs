//! [`AppState`]: what every handler, middleware and background task of a running server
//! reaches. It holds the domain and the request-side services around it; it names no module
//! that uses it, so the routes, the middleware, idempotency and maintenance all stand above it,
//! and [`crate::server`] builds it at start-up.

use actors::Service;

use crate::cursor::CursorCodec;
use crate::metrics::Metrics;
use crate::rate_limit::RateLimiter;

/// What every handler can reach.
pub struct AppState {
    /// The domain.
    pub service: Service,
    /// The cursor codec.
    pub cursors: CursorCodec,
    /// The rate limiter.
    pub limiter: RateLimiter,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Request metrics.
    pub metrics: Metrics,
    /// Caps of one report run (`--report-max-sources`, `--report-max-scanned-rows`).
    pub report_caps: actors::report::Caps,
    /// Turns `true` when the server begins to stop: long-polls and change streams end at
    /// once instead of holding the graceful stop for up to their full wait.
    pub stopping: tokio::sync::watch::Sender<bool>,
}
