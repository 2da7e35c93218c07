//! Starting and stopping the service: recover the data dir, seed it when empty, serve the
//! public API and the admin API, and on the way out drain, checkpoint and close the log.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;

use actix_web::{web, HttpServer};
use actors::directory::fixture::Fixture;
use actors::directory::keys;
use actors::directory::{Import, ImportReport};
use actors::shared::Clock;
use actors::{Service, ServiceConfig};
use anyhow::Context;
use rand::RngCore;

use crate::auth::AdminToken;
use crate::config::ServeArgs;
use crate::cursor::CursorCodec;
use crate::maintenance::{CheckpointPolicy, Maintenance};
use crate::metrics::Metrics;
use crate::rate_limit::RateLimiter;
use crate::state::AppState;

/// The embedded demo workspace.
pub const DEMO_FIXTURE: &str = include_str!("demo.json");

/// How to start: the serve flags plus what tests inject.
#[derive(Clone, Debug)]
pub struct Options {
    /// The flags.
    pub args: ServeArgs,
    /// The clock (tests move it forward).
    pub clock: Clock,
    /// Print generated secrets to stdout (the binary does; in-process tests do not).
    pub print_secrets: bool,
}

/// A running service.
pub struct Running {
    /// The public API's bound address.
    pub addr: SocketAddr,
    /// The admin API's bound address.
    pub admin_addr: SocketAddr,
    /// The domain.
    pub state: web::Data<AppState>,
    servers: [actix_web::dev::ServerHandle; 2],
    /// Background checkpoints and housekeeping; stopped before the final checkpoint.
    maintenance: Maintenance,
    /// Webhook deliveries; stopped before the final checkpoint, like maintenance.
    deliveries: crate::webhooks::Deliveries,
}

/// How long in-flight requests may run after a stop begins.
pub const SHUTDOWN_GRACE_SECS: u64 = 10;

/// The cursor key: 32 random bytes kept in the data dir, so cursors survive restarts.
fn cursor_key(data_dir: &Path) -> anyhow::Result<[u8; 32]> {
    let path = data_dir.join("cursor.key");
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(key) = <[u8; 32]>::try_from(bytes.as_slice()) {
            return Ok(key);
        }
        anyhow::bail!(
            "{} is damaged (expected 32 bytes); delete it to issue new cursors",
            path.display()
        );
    }
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    write_private(&path, &key)?;
    Ok(key)
}

/// Write a file readable by its owner only, durably.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// Parse a fixture, naming the place of a problem.
pub fn parse_fixture(text: &str, origin: &str) -> anyhow::Result<Fixture> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        anyhow::anyhow!("fixture {origin} is invalid at `{}`: {}", e.path(), e.inner())
    })
}

/// Load a fixture (the seed or the demo) into a freshly created data dir.
async fn seed(service: &Service, opts: &Options) -> anyhow::Result<()> {
    let (text, origin, demo) = match (&opts.args.seed, opts.args.no_demo) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read seed {}", path.display()))?;
            (text, path.display().to_string(), false)
        }
        (None, false) => (DEMO_FIXTURE.to_owned(), "(embedded demo)".to_owned(), true),
        (None, true) => return Ok(()),
    };
    let fixture = parse_fixture(&text, &origin)?;
    let ImportReport { counts, issued } = service
        .directory_actor()
        .send(Import(fixture))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .map_err(|e| anyhow::anyhow!("fixture {origin} was refused: {e}"))?;
    tracing::info!(fixture = %origin, ?counts, "seeded an empty data dir");
    if demo && !issued.is_empty() {
        let mut text = String::from("# sheetd demo keys: shown once. keyId ownerId name secret\n");
        for k in &issued {
            text.push_str(&format!("{} {} {} {}\n", k.key_id, k.owner_id, k.name, k.secret));
        }
        write_private(&opts.args.data_dir.join("demo-keys.txt"), text.as_bytes())?;
    }
    if opts.print_secrets && !issued.is_empty() {
        println!(
            "Generated API keys (shown once; demo keys are also in <data-dir>/demo-keys.txt):"
        );
        for k in &issued {
            println!("  key {} ({}, owner {}): {}", k.key_id, k.name, k.owner_id, k.secret);
        }
    }
    Ok(())
}

/// Recovers a single node's data dir and seeds it when it is new.
async fn open_alone(opts: &Options) -> anyhow::Result<Service> {
    let args = &opts.args;
    let config = service_config(opts);
    let archive = config.archive.clone();
    let (service, report) = Service::open(config)
        .with_context(|| format!("cannot open data dir {}", args.data_dir.display()))?;
    tracing::info!(
        checkpoint_lsn = report.checkpoint_lsn,
        records_replayed = report.records_replayed,
        bytes_replayed = report.bytes_replayed,
        last_lsn = report.last_lsn,
        torn_tail_dropped = report.torn_tail_dropped,
        stale_records_truncated = report.stale_records_truncated,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "recovery complete"
    );
    if let Some(archive) = archive {
        // Started before the seed, so the archive holds a new data dir's first records too.
        let dir = archive.dir.display().to_string();
        service.start_archive(archive).context("cannot start the log archive")?;
        tracing::info!(%dir, "log archive started");
    }
    let fresh = report.last_lsn == 0 && report.checkpoint_lsn.is_none();
    if fresh {
        seed(&service, opts).await?;
    } else if args.seed.is_some() {
        tracing::warn!("the data dir already holds data; --seed is ignored");
    }
    Ok(service)
}

/// The domain's settings from the flags.
fn service_config(opts: &Options) -> ServiceConfig {
    let args = &opts.args;
    ServiceConfig {
        data_dir: args.data_dir.clone(),
        sheet_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        clock: opts.clock.clone(),
        min_free_bytes: args.min_free_disk_bytes,
        retention: actors::sheet::Retention {
            days: args.changes_retention_days,
            min_changes: args.changes_retention_min,
        },
        archive: args.archive_dir.as_ref().map(|dir| actors::archive::ArchiveConfig {
            dir: dir.clone(),
            seal_after: std::time::Duration::from_millis(args.archive_seal_ms),
            segment_bytes: args.archive_segment_bytes.max(1),
            hold_records: args.archive_hold_records,
        }),
    }
}

/// Makes a single node's data dir the state of a cluster of one, when the node is started as
/// the only member of a new cluster (`actors::adopt`); refuses one started otherwise, whose
/// data a new or running cluster would ignore.
async fn adopt_if_single_node(
    node: &actors::replica::NodeConfig,
    retention: actors::sheet::Retention,
) -> anyhow::Result<()> {
    let alone = node
        .initial
        .as_ref()
        .filter(|members| members.len() == 1)
        .and_then(|members| members.get(&node.node_id).cloned());
    let (dir, id) = (node.dir.clone(), node.node_id);
    let Some(me) = alone else {
        let holds =
            tokio::task::spawn_blocking(move || actors::adopt::holds_single_node(&dir)).await??;
        if holds {
            anyhow::bail!(
                "{} holds a single node's data: start it with --initial-cluster naming only this \
                 node ({id}) to make it a cluster of one, then add the other nodes",
                node.dir.display()
            );
        }
        return Ok(());
    };
    let adopted = tokio::task::spawn_blocking(move || {
        actors::adopt::adopt_single_node(&dir, id, me, retention)
    })
    .await??;
    if let Some(adopted) = adopted {
        tracing::info!(
            position = adopted.position,
            "this node's single-node data is its cluster's state"
        );
    }
    Ok(())
}

/// Recover, seed when empty, and start both listeners. Runs inside an actix system.
pub async fn start(opts: Options) -> anyhow::Result<Running> {
    let args = &opts.args;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create data dir {}", args.data_dir.display()))?;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (service, cluster, cursors) = match crate::cluster::node_config(args)? {
        None => {
            let service = open_alone(&opts).await?;
            (Some(service), None, CursorCodec::new(cursor_key(&args.data_dir)?))
        }
        Some((node, key)) => {
            let cursors = CursorCodec::new(key);
            adopt_if_single_node(&node, service_config(&opts).retention).await?;
            let archive = service_config(&opts).archive;
            let clock = opts.clock.clone();
            let domain = actors::replica::ClusterDomain::start(node, clock, archive.as_ref())
                .await
                .with_context(|| {
                    format!("cannot start the cluster node in {}", args.data_dir.display())
                })?;
            if let Some(archive) = archive {
                let dir = archive.dir.display().to_string();
                domain.start_archive(archive).context("cannot start the log archive")?;
                tracing::info!(%dir, "log archive of the committed log started");
            }
            (None, Some(domain), cursors)
        }
    };
    let admin_token = match &args.admin_token {
        Some(t) => t.clone(),
        None => {
            let t = keys::generate_admin_token();
            if opts.print_secrets {
                println!("Admin token (shown once): {t}");
            }
            t
        }
    };
    let parts = crate::state::Parts {
        cursors,
        limiter: RateLimiter::new(args.rate_limit_per_minute),
        max_body_bytes: args.max_body_bytes,
        metrics: Metrics::default(),
        report_caps: actors::report::Caps {
            max_sources: args.report_max_sources,
            max_scanned_rows: args.report_max_scanned_rows,
            column_cache_bytes: args.report_column_cache_mb << 20,
        },
        stopping: tokio::sync::watch::channel(false).0,
        webhooks: crate::webhooks::WebhookSettings::from_args(args),
        background_cpu_percent: args.background_cpu_percent,
        max_local_staleness: args.max_local_staleness,
    };
    let state = web::Data::new(AppState::new(service, cluster, parts));
    if state.cluster.is_some() {
        let seeding = opts.clone();
        actix_rt::spawn(crate::cluster::lead_when_elected(
            state.clone(),
            // The archive is the node's (`ClusterDomain::start_archive`), not its actors'.
            ServiceConfig { archive: None, ..service_config(&opts) },
            move |service: Service| async move { seed(&service, &seeding).await },
        ));
    }
    let public =
        TcpListener::bind(args.addr).with_context(|| format!("cannot listen on {}", args.addr))?;
    let admin = TcpListener::bind(args.admin_addr)
        .with_context(|| format!("cannot listen on {}", args.admin_addr))?;
    let (addr, admin_addr) = (public.local_addr()?, admin.local_addr()?);
    let app_state = state.clone();
    let public =
        HttpServer::new(move || crate::apps::application(crate::apps::public(app_state.clone())))
            .workers(threads)
            .disable_signals()
            .shutdown_timeout(SHUTDOWN_GRACE_SECS)
            .listen(public)?
            .run();
    let admin_state = state.clone();
    let admin_token = web::Data::new(AdminToken::new(&admin_token));
    if let Some(cluster) = &state.cluster {
        crate::forwarded::serve_forwarded(cluster, state.clone(), admin_token.clone());
    }
    let admin = HttpServer::new(move || {
        crate::apps::application(crate::apps::admin(admin_state.clone(), admin_token.clone()))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(SHUTDOWN_GRACE_SECS)
    .listen(admin)?
    .run();
    let servers = [public.handle(), admin.handle()];
    actix_rt::spawn(public);
    actix_rt::spawn(admin);
    let maintenance = Maintenance::start(state.clone(), CheckpointPolicy::from_args(args));
    let deliveries = crate::webhooks::Deliveries::start(state.clone())
        .context("cannot start webhook deliveries")?;
    tracing::info!(%addr, %admin_addr, "serving");
    Ok(Running { addr, admin_addr, state, servers, maintenance, deliveries })
}

/// Stop serving (draining in-flight requests), checkpoint, and close the log.
pub async fn stop(running: Running) -> anyhow::Result<()> {
    running.state.stopping.send_replace(true);
    for server in &running.servers {
        server.stop(true).await;
    }
    // A background checkpoint must not race the final one, nor a delivery's record the log's
    // close.
    running.maintenance.stop().await;
    running.deliveries.stop().await;
    // A cluster node's log is the group's: nothing to checkpoint or close here.
    if let (Some(service), None) = (running.state.try_service(), &running.state.cluster) {
        // The archive takes what is durable before the log closes (its thread joins:
        // blocking).
        let archived = service.clone();
        let _ = actix_web::rt::task::spawn_blocking(move || archived.stop_archive()).await;
        let report = service.checkpoint().await.context("final checkpoint")?;
        tracing::info!(lsn = report.lsn, bytes = report.bytes, "final checkpoint written");
        service.close().context("closing the log")?;
    }
    if let Some(cluster) = &running.state.cluster {
        // The archive takes what is committed before the node stops (its thread joins).
        let archived = cluster.clone();
        let _ = actix_web::rt::task::spawn_blocking(move || archived.stop_archive()).await;
        cluster.shutdown().await.context("stopping the cluster node")?;
    }
    Ok(())
}

/// Resolve on SIGTERM or Ctrl-C.
pub async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
