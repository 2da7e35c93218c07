//! What `GET /admin/v1/metrics` exports: the server's own request counters (counts by route
//! and status, a latency histogram), and [`exposition`], which renders them with the log's and
//! the domain's figures into Prometheus text.
//!
//! Recording a request touches sharded maps and atomics only, never a global lock. Rendering
//! reads one snapshot of each source per scrape; the format itself is [`crate::prometheus`]'s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actors::Service;
use dashmap::DashMap;

use crate::prometheus::Exposition;

/// Upper bounds of the latency buckets, in seconds.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// Request counters.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: DashMap<(String, u16), u64>,
    buckets: [AtomicU64; 11],
    count: AtomicU64,
    sum_micros: AtomicU64,
    /// Webhook deliveries.
    pub webhooks: crate::webhooks::DeliveryMetrics,
    /// Microseconds streamed backups waited for their CPU budget while requests were served.
    pub backup_paced_micros: AtomicU64,
    /// Microseconds background checkpoints waited for their CPU budget likewise.
    pub checkpoint_paced_micros: AtomicU64,
}

impl Metrics {
    /// Record one request.
    pub fn observe(&self, route: &str, status: u16, latency: Duration) {
        *self.requests.entry((route.to_owned(), status)).or_default() += 1;
        let secs = latency.as_secs_f64();
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(latency.as_micros() as u64, Ordering::Relaxed);
    }

    /// Requests served so far: background work watches it move to know whether the server
    /// is busy (see `crate::priority`).
    pub fn served(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Requests by route and status, sorted.
    pub fn requests(&self) -> Vec<((String, u16), u64)> {
        let mut all: Vec<_> = self.requests.iter().map(|e| (e.key().clone(), *e.value())).collect();
        all.sort();
        all
    }

    /// Cumulative bucket counts, total count and total seconds.
    pub fn latency(&self) -> (Vec<u64>, u64, f64) {
        (
            self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect(),
            self.count.load(Ordering::Relaxed),
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

/// Every metric of a scrape, as Prometheus text: the requests this server counted, the log's
/// group commits, LSNs and space, and the sizes of the domain and its side stores.
///
/// A cluster node that does not serve from its own state (a follower) has no domain figures;
/// a cluster node adds its view of the group.
pub fn exposition(
    metrics: &Metrics,
    service: Option<&Service>,
    cluster: Option<&actors::replica::ClusterDomain>,
) -> String {
    let mut e = Exposition::new();

    let requests = metrics.requests();
    let statuses: Vec<String> = requests.iter().map(|((_, s), _)| s.to_string()).collect();
    let labels: Vec<[(&str, &str); 2]> = requests
        .iter()
        .zip(&statuses)
        .map(|(((route, _), _), status)| [("route", route.as_str()), ("status", status.as_str())])
        .collect();
    e.counters(
        "sheetd_http_requests_total",
        "HTTP requests served, by route pattern and status.",
        labels.iter().zip(&requests).map(|(l, (_, n))| (&l[..], *n as f64)),
    );
    let (buckets, count, sum) = metrics.latency();
    e.histogram(
        "sheetd_http_request_duration_seconds",
        "Time from a request's arrival to its response.",
        LATENCY_BUCKETS,
        &buckets,
        count,
        sum,
    );

    if let Some(service) = service {
        domain(&mut e, service, metrics);
    }
    if let Some(cluster) = cluster {
        cluster_gauges(&mut e, &cluster.status());
    }
    // A cluster node's archive is its committed log's, on a follower too.
    let archived = match cluster {
        Some(cluster) => cluster.archive_status(),
        None => service.and_then(Service::archive_status),
    };
    if let Some(status) = archived {
        archive(&mut e, &status);
    }
    e.finish()
}

/// The log's and the domain's figures.
fn domain(e: &mut Exposition, service: &Service, metrics: &Metrics) {
    let counts = service.counts();
    let wal = service.log_stats();
    let sides = service.side_store_sizes();
    webhooks(e, service, &metrics.webhooks);
    e.counter(
        "sheetd_backup_paced_seconds_total",
        "Seconds streamed backups waited for their CPU budget (--background-cpu-percent) while \
         requests were being served.",
        metrics.backup_paced_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
    e.counter(
        "sheetd_checkpoint_paced_seconds_total",
        "Seconds background checkpoints waited for their CPU budget (--background-cpu-percent) \
         while requests were being served.",
        metrics.checkpoint_paced_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
    e.histogram(
        "sheetd_wal_flush_duration_seconds",
        "Time of one group commit of the log (write, flush and fsync).",
        actors::FLUSH_LATENCY_BUCKETS_SECONDS,
        &wal.flush_latency_buckets,
        wal.flushes,
        wal.flush_seconds_total,
    );
    e.counter("sheetd_wal_flushes_total", "Group commits of the log.", wal.flushes as f64);
    e.counter(
        "sheetd_wal_records_flushed_total",
        "Records made durable by group commits (divide by flushes for the mean batch size).",
        wal.records_flushed as f64,
    );
    e.gauge(
        "sheetd_wal_flush_batch_size_max",
        "Most records made durable by one group commit.",
        wal.batch_size_max as f64,
    );
    e.gauge("sheetd_wal_last_lsn", "Highest LSN assigned.", wal.last_lsn as f64);
    e.gauge("sheetd_wal_durable_lsn", "Highest LSN known durable.", wal.durable_lsn as f64);
    e.gauge(
        "sheetd_wal_checkpoint_lsn",
        "LSN of the current checkpoint.",
        wal.checkpoint_lsn as f64,
    );
    e.counter(
        "sheetd_wal_checkpoints_total",
        "Checkpoints written (snapshot file written, log truncated) since the process started.",
        wal.checkpoints as f64,
    );
    e.counter(
        "sheetd_wal_checkpoint_seconds_total",
        "Time spent writing those checkpoints, in seconds.",
        wal.checkpoint_seconds_total,
    );
    e.gauge(
        "sheetd_wal_records_since_checkpoint",
        "Records after the checkpoint: what a restart would replay.",
        wal.records_since_checkpoint as f64,
    );
    e.gauge(
        "sheetd_wal_bytes_since_checkpoint",
        "Payload bytes after the checkpoint.",
        wal.bytes_since_checkpoint as f64,
    );
    e.gauge(
        "sheetd_wal_retained_bytes",
        "Stored bytes of the log records kept behind the checkpoint for the change feed.",
        wal.retained_bytes as f64,
    );
    e.gauge(
        "sheetd_storage_writable",
        "1 while the data dir takes writes; 0 while they get 503 storage_unavailable.",
        f64::from(u8::from(wal.writable)),
    );
    e.gauge(
        "sheetd_disk_free_bytes",
        "Free bytes on the data dir's file system at the last measurement.",
        wal.free_bytes as f64,
    );
    e.gauge(
        "sheetd_disk_min_free_bytes",
        "The free-space floor below which writes are refused (0: none).",
        wal.min_free_bytes as f64,
    );
    e.gauge(
        "sheetd_wal_disk_bytes",
        "Bytes the log store uses on disk.",
        wal.log_bytes_on_disk as f64,
    );

    e.gauge("sheetd_users", "Users.", counts.users as f64);
    e.gauge("sheetd_projects", "Projects.", counts.projects as f64);
    e.gauge("sheetd_sheets", "Sheets.", counts.sheets as f64);
    e.gauge("sheetd_rows", "Rows in every sheet.", counts.rows as f64);
    e.gauge("sheetd_attachments", "Attachments of live rows.", counts.attachments as f64);
    e.gauge("sheetd_keys", "API keys (any state).", counts.keys as f64);
    e.gauge(
        "sheetd_idempotency_records",
        "Idempotency keys held (completed within the replay window, or in progress).",
        sides.idempotency as f64,
    );
    e.gauge("sheetd_events", "Internal events held in the outbox.", sides.events as f64);
}

/// The log archive's figures (`--archive-dir`), a single node's or a cluster node's.
fn archive(e: &mut Exposition, a: &actors::archive::ArchiveStatus) {
    e.gauge(
        "sheetd_archive_position_lsn",
        "Every record up to this LSN is in a sealed segment of the log archive.",
        a.position as f64,
    );
    e.gauge(
        "sheetd_archive_lag_records",
        "Durable log records the archive has not sealed yet.",
        a.lag_records as f64,
    );
    e.gauge(
        "sheetd_archive_failing",
        "1 while the archive cannot write (its last error is in /admin/v1/health), else 0.",
        f64::from(u8::from(a.last_error.is_some())),
    );
    e.counter(
        "sheetd_archive_errors_total",
        "Failed attempts to write the archive since the process started.",
        a.errors as f64,
    );
    e.counter(
        "sheetd_archive_gaps_total",
        "Ranges of records the archive lost because the log dropped them first.",
        a.gaps.len() as f64,
    );
    e.counter(
        "sheetd_archive_segments_total",
        "Archive segments sealed since the process started.",
        a.segments_sealed as f64,
    );
    e.counter(
        "sheetd_archive_bytes_total",
        "Bytes of archive segments sealed since the process started.",
        a.bytes_sealed as f64,
    );
}

/// A cluster node's view of its group.
fn cluster_gauges(e: &mut Exposition, status: &actors::replica::Status) {
    e.gauge("sheetd_cluster_node_id", "This node's id.", status.node_id as f64);
    e.gauge("sheetd_cluster_term", "The current Raft term.", status.term as f64);
    e.gauge(
        "sheetd_cluster_is_leader",
        "1 while this node is the leader.",
        f64::from(u8::from(status.role == "leader")),
    );
    e.gauge(
        "sheetd_cluster_leader_known",
        "1 while this node knows a leader.",
        f64::from(u8::from(status.leader.is_some())),
    );
    e.gauge(
        "sheetd_cluster_commit_index",
        "The highest Raft index this node knows committed.",
        status.commit_index.map_or(0.0, |i| i as f64),
    );
    e.gauge(
        "sheetd_cluster_applied_index",
        "The highest Raft index applied on this node.",
        status.applied_index.map_or(0.0, |i| i as f64),
    );
    e.counter(
        "sheetd_cluster_leader_changes_total",
        "Leaders this node came to know of since it started.",
        status.leader_changes as f64,
    );
    e.counter(
        "sheetd_cluster_elections_total",
        "Newer terms this node saw since it started: each is an election in the group.",
        status.term_changes as f64,
    );
    e.counter(
        "sheetd_cluster_snapshots_built_total",
        "Raft snapshots this node built from its own state since it started.",
        status.snapshots.built as f64,
    );
    e.counter(
        "sheetd_cluster_snapshots_sent_total",
        "Raft snapshots this node sent to a peer that installed them since it started.",
        status.snapshots.sent as f64,
    );
    e.counter(
        "sheetd_cluster_snapshots_installed_total",
        "Raft snapshots this node installed from a leader since it started.",
        status.snapshots.installed as f64,
    );
    e.gauge(
        "sheetd_cluster_snapshot_index",
        "The last Raft index this node's snapshot covers.",
        status.snapshot_index.map_or(0.0, |i| i as f64),
    );
    e.counter(
        "sheetd_cluster_forwarded_requests_total",
        "Requests this node forwarded to the leader since it started.",
        status.forwarded as f64,
    );
    // Known on the leader only: what it replicated to each peer and when it last heard back.
    let ids: Vec<String> = status.members.iter().map(|m| m.id.to_string()).collect();
    let labels: Vec<[(&str, &str); 1]> = ids.iter().map(|id| [("peer", id.as_str())]).collect();
    let commit = status.commit_index.unwrap_or(0);
    let peers = || status.members.iter().zip(&labels).filter(|(m, _)| m.id != status.node_id);
    e.gauges(
        "sheetd_cluster_replication_lag_entries",
        "Committed entries a peer has yet to receive (on the leader).",
        peers().filter_map(|(m, peer)| Some((&peer[..], commit.saturating_sub(m.matched?) as f64))),
    );
    e.gauges(
        "sheetd_cluster_replication_lag_seconds",
        "Seconds since the leader last heard from a peer.",
        peers().filter_map(|(m, peer)| Some((&peer[..], m.last_heard_ms? as f64 / 1000.0))),
    );
}

/// Webhooks by status, and what the delivery thread did since the process started.
fn webhooks(e: &mut Exposition, service: &Service, counters: &crate::webhooks::DeliveryMetrics) {
    let all = service.webhooks().ids();
    let active = all.iter().filter(|(_, active)| *active).count();
    e.gauges(
        "sheetd_webhooks",
        "Webhooks held, by status.",
        [
            (&[("status", "active")][..], active as f64),
            (&[("status", "disabled")][..], (all.len() - active) as f64),
        ],
    );
    e.counter(
        "sheetd_webhook_deliveries_total",
        "Webhook messages acknowledged by their receiver (a 2xx).",
        counters.delivered.load(Ordering::Relaxed) as f64,
    );
    e.counter(
        "sheetd_webhook_changes_delivered_total",
        "Changes in those messages.",
        counters.changes_delivered.load(Ordering::Relaxed) as f64,
    );
    e.counter(
        "sheetd_webhook_failures_total",
        "Webhook delivery attempts that failed (a non-2xx, a timeout, a refused connection).",
        counters.failed.load(Ordering::Relaxed) as f64,
    );
    e.counter(
        "sheetd_webhook_paced_seconds_total",
        "Seconds webhook deliveries waited for their CPU budget (--webhook-cpu-percent) while \
         requests were being served.",
        counters.paced_micros.load(Ordering::Relaxed) as f64 / 1e6,
    );
}
