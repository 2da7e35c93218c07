//! [`AppState`]: what every handler, middleware and background task of a running server
//! reaches. It holds the domain and the request-side services around it; it names no module
//! that uses it, so the routes, the middleware, idempotency and maintenance all stand above it,
//! and [`crate::server`] builds it at start-up.

use std::sync::OnceLock;

use actors::error::ClusterOutcome;
use actors::reads::Reads;
use actors::replica::ClusterDomain;
use actors::Service;

use crate::cursor::CursorCodec;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::rate_limit::RateLimiter;

/// How long a cluster leader whose lease lapsed waits for a quorum to confirm it before it
/// answers `503 cluster_unavailable`: a few heartbeats.
const LEADERSHIP_CONFIRM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What every handler can reach.
pub struct AppState {
    /// The domain: set at start on a single node; on a cluster node, when it first leads
    /// (until then its public API answers `503 cluster_unavailable`).
    service: OnceLock<Service>,
    /// This node's part of its cluster, when it runs in one.
    pub cluster: Option<ClusterDomain>,
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
    /// How webhooks are checked and given up on.
    pub webhooks: crate::webhooks::WebhookSettings,
    /// The share of one core (percent) a background checkpoint or a streamed backup may use
    /// while requests are served.
    pub background_cpu_percent: u8,
    /// How old a cluster node's state may be to answer a local read
    /// (`--max-local-staleness`).
    pub max_local_staleness: std::time::Duration,
}

impl AppState {
    /// The state of a server whose domain is `service` (if it has one yet) and whose other
    /// parts are `parts`.
    pub fn new(service: Option<Service>, cluster: Option<ClusterDomain>, parts: Parts) -> Self {
        let slot = OnceLock::new();
        if let Some(service) = service {
            let _ = slot.set(service);
        }
        AppState {
            service: slot,
            cluster,
            cursors: parts.cursors,
            limiter: parts.limiter,
            max_body_bytes: parts.max_body_bytes,
            metrics: parts.metrics,
            report_caps: parts.report_caps,
            stopping: parts.stopping,
            webhooks: parts.webhooks,
            background_cpu_percent: parts.background_cpu_percent,
            max_local_staleness: parts.max_local_staleness,
        }
    }

    /// What the middleware answers a public request from, with the Raft index it reflects
    /// when it is a local read; `None` when this node does not answer it (it is forwarded).
    ///
    /// A local read (`local`) on a cluster node is answered without contacting the leader: by
    /// a leader a quorum acknowledged within `--max-local-staleness`, from its actors; by a
    /// follower whose applied state is at most that old, from that state. Anything else is
    /// answered only by a leader a quorum confirms ([`AppState::confirmed_service`]).
    pub async fn answer_from(&self, local: bool) -> Option<(Reads<'_>, Option<u64>)> {
        if let (true, Some(cluster)) = (local, &self.cluster) {
            if cluster.leads_within(self.max_local_staleness) {
                if let Some(service) = self.service.get() {
                    return Some((Reads::Own(service), cluster.applied_index()));
                }
            }
            if let Some(reads) = cluster.local_reads(self.max_local_staleness) {
                let applied = reads.view().applied().checked_sub(1);
                return Some((Reads::Local(reads), applied));
            }
        }
        self.confirmed_service().await.map(|service| (Reads::Own(service), None))
    }

    /// What a read handler reads from: for a local read (`Caller::local`) a follower's
    /// applied state while it is fresh enough, else this node's domain (or the 503 of a node
    /// that does not serve, such as a follower whose state grew too old since the request came
    /// in). A long poll or a change stream asks again at every turn, so a follower cut off
    /// meanwhile stops answering.
    pub fn reads_of(&self, local: bool) -> Result<Reads<'_>, ApiError> {
        if local {
            let cluster = self.cluster.as_ref();
            if let Some(reads) = cluster.and_then(|c| c.local_reads(self.max_local_staleness)) {
                return Ok(Reads::Local(reads));
            }
        }
        self.service().map(Reads::Own)
    }

    /// The domain, or the `503 cluster_unavailable` of a cluster node that does not serve
    /// from its own state now.
    pub fn service(&self) -> Result<&Service, ApiError> {
        self.try_service().ok_or_else(|| self.not_serving())
    }

    /// The domain, if this node serves from it now (a cluster node: while it leads in the
    /// term its actors started in, see `actors::replica::LeaderGuard`).
    pub fn try_service(&self) -> Option<&Service> {
        if self.cluster.as_ref().is_some_and(|c| !c.serving()) {
            return None;
        }
        self.service.get()
    }

    /// The domain, if this node serves from it now and (a cluster node) a quorum still takes
    /// it as leader: what every public request is answered from. See
    /// `actors::replica::ClusterDomain::confirm_serving`.
    pub async fn confirmed_service(&self) -> Option<&Service> {
        if let Some(cluster) = &self.cluster {
            if !cluster.confirm_serving(LEADERSHIP_CONFIRM_TIMEOUT).await {
                return None;
            }
        }
        self.service.get()
    }

    /// Makes `service` this node's domain (a cluster node that starts leading); `false` when
    /// it had one already.
    pub fn set_service(&self, service: Service) -> bool {
        self.service.set(service).is_ok()
    }

    /// The answer of a cluster node that does not serve from its own state now.
    pub fn not_serving(&self) -> ApiError {
        if self.cluster.as_ref().is_some_and(|c| c.removed()) {
            return crate::error::cluster_unavailable(
                ClusterOutcome::NotApplied,
                None,
                "This node was removed from its cluster; send requests to another node.",
            )
            .with_detail_field("reason", "removed");
        }
        let leader = self.cluster.as_ref().and_then(|c| c.status().leader);
        crate::error::cluster_unavailable(
            ClusterOutcome::NotApplied,
            leader,
            "This node does not serve the API now and cannot pass the request on: no leader is \
             known, or the request was forwarded to it already. Retry.",
        )
    }
}

/// The parts of an [`AppState`] beside the domain.
pub struct Parts {
    /// The cursor codec.
    pub cursors: CursorCodec,
    /// The rate limiter.
    pub limiter: RateLimiter,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Request metrics.
    pub metrics: Metrics,
    /// Caps of one report run.
    pub report_caps: actors::report::Caps,
    /// See [`AppState::stopping`].
    pub stopping: tokio::sync::watch::Sender<bool>,
    /// See [`AppState::webhooks`].
    pub webhooks: crate::webhooks::WebhookSettings,
    /// See [`AppState::background_cpu_percent`].
    pub background_cpu_percent: u8,
    /// See [`AppState::max_local_staleness`].
    pub max_local_staleness: std::time::Duration,
}
