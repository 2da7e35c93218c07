//! The server's command-line configuration: `sheetd serve`'s flags (every one also an
//! environment variable `SHEETD_<NAME>`), the offline `sheetd key` commands and the flags of
//! `sheetd backup` and `sheetd restore`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Subcommand;

/// `sheetd key create|revoke|list`: offline key management (the admin API does the same on a
/// running server).
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create a key and print its secret once.
    Create {
        /// The data dir to add the key to (no server may hold it).
        #[arg(long, env = "SHEETD_DATA_DIR", default_value = "./sheetd-data")]
        data_dir: PathBuf,
        /// The user whose access the key carries.
        #[arg(long)]
        owner: u64,
        /// A name to recognise the key by.
        #[arg(long)]
        name: String,
        /// A grant `VERB:SCOPE_TYPE:ID` (`write:project:1`) or `VERB:account`; repeatable.
        #[arg(long = "grant", required = true)]
        grants: Vec<String>,
        /// Expiry as RFC 3339 (`2027-01-31T00:00:00Z`); default one year from now.
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// Revoke a key (immediate and irreversible).
    Revoke {
        /// The data dir holding the key (no server may hold it).
        #[arg(long, env = "SHEETD_DATA_DIR", default_value = "./sheetd-data")]
        data_dir: PathBuf,
        /// The id of the key to revoke, as `sheetd key list` shows it.
        #[arg(long)]
        id: u64,
    },
    /// List keys (never their secrets).
    List {
        /// The data dir whose keys to list (no server may hold it).
        #[arg(long, env = "SHEETD_DATA_DIR", default_value = "./sheetd-data")]
        data_dir: PathBuf,
        /// Only this owner's keys.
        #[arg(long)]
        owner: Option<u64>,
    },
}

/// `sheetd backup`: of a running server (`--admin-url`) or of a stopped data dir
/// (`--data-dir`); `sheetd backup verify FILE` checks one.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BackupArgs {
    /// `verify FILE`.
    #[command(subcommand)]
    pub command: Option<BackupCommand>,
    /// The admin API of a running server to back up (`http://127.0.0.1:8081`).
    #[arg(long, conflicts_with = "data_dir", required_unless_present = "data_dir")]
    pub admin_url: Option<String>,
    /// The admin token (with `--admin-url`).
    #[arg(long, env = "SHEETD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// A data dir no server holds open, to back up.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The backup file to write (as `FILE.tmp`, renamed once complete and checked).
    #[arg(long, required = true)]
    pub out: Option<PathBuf>,
}

/// `sheetd restore`.
#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup file.
    #[arg(long)]
    pub from: PathBuf,
    /// The data dir to create (absent or empty).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// A log archive (`sheetd serve --archive-dir`) to roll the backup forward with; alone,
    /// as far as it goes.
    #[arg(long)]
    pub archive_dir: Option<PathBuf>,
    /// Roll forward up to this time (RFC 3339): stop before the first archived record after it.
    #[arg(long, requires = "archive_dir", conflicts_with = "until_position")]
    pub until: Option<String>,
    /// Roll forward up to this log position (LSN).
    #[arg(long, requires = "archive_dir")]
    pub until_position: Option<u64>,
}

/// `sheetd backup verify`.
#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Check a backup without restoring it: every block, the manifest, and the digest of the
    /// state it rebuilds. Prints the manifest.
    Verify {
        /// The backup file.
        file: PathBuf,
    },
}

/// `sheetd serve` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Public API address (served under /api/v1).
    #[arg(long, env = "SHEETD_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// Admin API address (served under /admin/v1, behind the admin token).
    #[arg(long, env = "SHEETD_ADMIN_ADDR", default_value = "127.0.0.1:8081")]
    pub admin_addr: SocketAddr,
    /// Where the log, checkpoints and demo keys live.
    #[arg(long, env = "SHEETD_DATA_DIR", default_value = "./sheetd-data")]
    pub data_dir: PathBuf,
    /// Load this fixture into an empty data dir.
    #[arg(long, env = "SHEETD_SEED")]
    pub seed: Option<PathBuf>,
    /// Start an empty data dir empty (no demo workspace).
    #[arg(long, env = "SHEETD_NO_DEMO")]
    pub no_demo: bool,
    /// The admin bearer token; generated and printed once when not set.
    #[arg(long, env = "SHEETD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Requests per rolling minute per API key (or per client IP without a usable key).
    #[arg(long, env = "SHEETD_RATE_LIMIT_PER_MINUTE", default_value_t = 600)]
    pub rate_limit_per_minute: u64,
    /// Largest request body; larger ones get 413.
    #[arg(long, env = "SHEETD_MAX_BODY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "SHEETD_LOG_JSON")]
    pub log_json: bool,
    /// Most sources a report definition may list; a run of a report listing more gets 413
    /// `report_cap_exceeded`.
    #[arg(long, env = "SHEETD_REPORT_MAX_SOURCES", default_value_t = 50)]
    pub report_max_sources: usize,
    /// Most rows one report run may scan across its readable sources; more gets 413
    /// `report_cap_exceeded`.
    #[arg(long, env = "SHEETD_REPORT_MAX_SCANNED_ROWS", default_value_t = 1_000_000)]
    pub report_max_scanned_rows: u64,
    /// Memory, in MiB, the report runner may keep in columns for scanning (the cells of the
    /// columns reports read, per sheet, as typed vectors) across all sheets; the least recently
    /// used sheets are dropped beyond it. 0 turns it off: every run parses the rows it reads.
    #[arg(long, env = "SHEETD_REPORT_COLUMN_CACHE_MB", default_value_t = 256)]
    pub report_column_cache_mb: usize,
    /// Checkpoint once this many log bytes (or half the last checkpoint's size, if more) were
    /// written since the last checkpoint (0: never by size). Bounds the log's size and the
    /// replay at the next start; the half keeps a large state's rewrites in proportion.
    #[arg(long, env = "SHEETD_CHECKPOINT_EVERY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub checkpoint_every_bytes: u64,
    /// Checkpoint once this many log records were written since the last checkpoint (0: never
    /// by count). A start replays each record after the checkpoint, and small records (patches)
    /// cost it more per byte than the checkpoint does, so the count bounds the start after a
    /// crash where the size rule alone would let it grow. On a cluster node: a Raft snapshot
    /// every this many entries, with half as many kept in the log behind it.
    #[arg(long, env = "SHEETD_CHECKPOINT_EVERY_RECORDS", default_value_t = 150_000)]
    pub checkpoint_every_records: u64,
    /// Checkpoint this many seconds after the last one when anything was written since (0: never
    /// by time). Bounds the replay of a quiet server.
    #[arg(long, env = "SHEETD_CHECKPOINT_EVERY_SECS", default_value_t = 300)]
    pub checkpoint_every_secs: u64,
    /// Row writes get 503 `storage_unavailable` while the data dir's file system has fewer free
    /// bytes than this, so checkpoints and the next start always have room (0: no floor).
    /// Default: the smaller of 256 MiB and 5 % of the file system.
    #[arg(long, env = "SHEETD_MIN_FREE_DISK_BYTES")]
    pub min_free_disk_bytes: Option<u64>,
    /// Days each sheet keeps its changes for the change feed at least (a cursor older than
    /// every retained change gets 410 `cursor_expired`).
    #[arg(long, env = "SHEETD_CHANGES_RETENTION_DAYS", default_value_t = 7)]
    pub changes_retention_days: u32,
    /// Changes each sheet keeps at least, however old.
    #[arg(long, env = "SHEETD_CHANGES_RETENTION_MIN", default_value_t = 100_000)]
    pub changes_retention_min: u64,
    /// Keep every durable log record in sealed segment files in this dir (the log archive), so
    /// `sheetd restore --archive-dir` can roll a backup forward to a point in time. On a
    /// cluster node: every committed entry of the group, whether the node leads or follows.
    #[arg(long, env = "SHEETD_ARCHIVE_DIR")]
    pub archive_dir: Option<PathBuf>,
    /// Seal an archive segment once its first record is this many milliseconds old: how far
    /// the archive trails the log.
    #[arg(long, env = "SHEETD_ARCHIVE_SEAL_MS", default_value_t = 5_000)]
    pub archive_seal_ms: u64,
    /// Seal an archive segment once its records reach this many bytes.
    #[arg(long, env = "SHEETD_ARCHIVE_SEGMENT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub archive_segment_bytes: usize,
    /// A checkpoint keeps at most this many log records the archive has not taken (while its
    /// dir is full or failing); past that the oldest are dropped and the archive reports a gap.
    #[arg(long, env = "SHEETD_ARCHIVE_HOLD_RECORDS", default_value_t = 1_000_000)]
    pub archive_hold_records: u64,
    /// Let webhooks reach loopback, private, link-local and other non-public addresses
    /// (off: such a URL is refused at creation and at every connection). For receivers on a
    /// trusted network, and tests.
    #[arg(long, env = "SHEETD_WEBHOOK_ALLOW_PRIVATE")]
    pub webhook_allow_private: bool,
    /// Disable a webhook (`failing`) after this many seconds of failed deliveries without one
    /// success.
    #[arg(long, env = "SHEETD_WEBHOOK_DISABLE_AFTER_SECS", default_value_t = 259_200)]
    pub webhook_disable_after_secs: u64,
    /// CA certificates (PEM) trusted for `https` webhook receivers besides the Mozilla roots:
    /// for receivers whose certificates an internal CA issues.
    #[arg(long, env = "SHEETD_WEBHOOK_CA_FILE")]
    pub webhook_ca_file: Option<PathBuf>,
    /// While the server is serving requests, a background checkpoint or a backup it streams
    /// (`GET /admin/v1/backup`, `sheetd backup --admin-url`) uses at most this share of one
    /// core (percent, 1 to 100); with no request for 100 ms, all it can get. At 10 % a
    /// checkpoint of 1,100,000 rows took 7 s under a full write load (3 s at 20 %), and the
    /// writers' p99 meanwhile was about a millisecond lower (docs/performance.md).
    #[arg(long, env = "SHEETD_BACKGROUND_CPU_PERCENT", default_value_t = 10,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub background_cpu_percent: u8,
    /// While the server is serving requests, webhook deliveries use at most this share of one
    /// core (percent, 1 to 100); with no request for 100 ms, all they can get. Webhooks that
    /// fall behind under a heavy load catch up when it eases, in fuller messages.
    #[arg(long, env = "SHEETD_WEBHOOK_CPU_PERCENT", default_value_t = 5,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub webhook_cpu_percent: u8,
    /// Run as a member of a cluster: this node's id for life (a positive integer; a node
    /// whose data is lost joins again under a new id). With `--raft-addr`,
    /// `--initial-cluster` and `--cluster-secret-file`.
    #[arg(long, env = "SHEETD_NODE_ID", requires_all = ["raft_addr", "cluster_secret_file"])]
    pub node_id: Option<std::num::NonZeroU64>,
    /// Where this node listens for its peers (node-to-node traffic only).
    #[arg(long, env = "SHEETD_RAFT_ADDR", requires = "node_id")]
    pub raft_addr: Option<SocketAddr>,
    /// The voters of a new cluster: `1=HOST:PORT,2=HOST:PORT,3=HOST:PORT` (their raft
    /// addresses). Every listed node started on an empty data dir forms the cluster; a data dir
    /// that already belongs to one ignores it.
    #[arg(long, env = "SHEETD_INITIAL_CLUSTER", requires = "node_id", conflicts_with = "join")]
    pub initial_cluster: Option<String>,
    /// Join a running cluster: start on an empty data dir and wait until the leader adds this
    /// node (`POST /admin/v1/cluster/nodes`); until then its public API answers
    /// `503 cluster_unavailable`.
    #[arg(long, env = "SHEETD_JOIN", requires = "node_id")]
    pub join: bool,
    /// A file holding the secret every node of the cluster shares (at least 32 bytes): it
    /// authenticates node-to-node traffic and keys the cursors, so a cursor works on any node.
    #[arg(long, env = "SHEETD_CLUSTER_SECRET_FILE", requires = "node_id")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Run the cluster link over mutual TLS: a dir with the cluster's CA (`ca.crt`), this
    /// node's certificate signed by it (`node.crt`, naming the host of `--raft-addr`: an IP or
    /// DNS SAN) and its key (`node.key`), all PEM. Nodes then talk only to peers whose
    /// certificate the CA signed. Without it the link is plain TCP: a trusted network only.
    #[arg(long, env = "SHEETD_CLUSTER_TLS_DIR", requires = "node_id")]
    pub cluster_tls_dir: Option<PathBuf>,
    /// A cluster node answers a read sent with `Sheetd-Consistency: local` from its own
    /// applied state while that state is at most this old (`5s`, `800ms`; measured from the
    /// last time it heard from a leader): older, it sends the read to the leader instead.
    #[arg(long, env = "SHEETD_MAX_LOCAL_STALENESS", default_value = "5s",
          value_parser = parse_staleness)]
    pub max_local_staleness: std::time::Duration,
}

/// `--max-local-staleness`: whole milliseconds (`800ms`) or seconds (`5s`, or a bare number),
/// at most an hour.
pub fn parse_staleness(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit_ms) = if let Some(ms) = text.strip_suffix("ms") {
        (ms, 1)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1000)
    };
    let amount: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a duration such as `5s` or `800ms`"))?;
    let ms = amount.saturating_mul(unit_ms);
    if ms > 3_600_000 {
        return Err(format!("`{text}` is longer than an hour"));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// `--initial-cluster`: `ID=HOST:PORT` pairs, comma-separated, each id once.
///
/// # Errors
/// A sentence naming the first malformed pair.
pub fn parse_initial_cluster(text: &str) -> Result<Vec<(u64, SocketAddr)>, String> {
    let mut members: Vec<(u64, SocketAddr)> = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{pair}` in --initial-cluster is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| format!("`{id}` in --initial-cluster is not a positive node id"))?;
        let addr: SocketAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{addr}` in --initial-cluster is not HOST:PORT"))?;
        if members.iter().any(|(i, _)| *i == id) {
            return Err(format!("node {id} is listed twice in --initial-cluster"));
        }
        members.push((id, addr));
    }
    if members.is_empty() {
        return Err("--initial-cluster lists no node".into());
    }
    Ok(members)
}

impl ServeArgs {
    /// Parse `sheetd serve` flags (without the program and subcommand names), for callers that
    /// start a server in-process from the flags an operator would give it (`sheetd bench`'s own
    /// server). Unset flags take their environment variable or default, as on the command line.
    ///
    /// # Errors
    ///
    /// The flags do not parse.
    pub fn parse_flags<I, T>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ServeArgs,
        }
        let all = std::iter::once(std::ffi::OsString::from("serve"))
            .chain(flags.into_iter().map(Into::into));
        Ok(<Wrapper as clap::Parser>::try_parse_from(all)?.args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_flags_parse_without_the_command_line() {
        let a =
            ServeArgs::parse_flags(["--addr", "127.0.0.1:0", "--no-demo", "--admin-token", "t"])
                .unwrap();
        assert_eq!(a.addr, "127.0.0.1:0".parse().unwrap());
        assert!(a.no_demo);
        assert_eq!(a.admin_token.as_deref(), Some("t"));
        assert!(ServeArgs::parse_flags(["--no-such-flag"]).is_err());
    }

    #[test]
    fn a_staleness_is_seconds_or_milliseconds_up_to_an_hour() {
        use std::time::Duration;
        assert_eq!(parse_staleness("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_staleness("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_staleness(" 800ms "), Ok(Duration::from_millis(800)));
        assert_eq!(parse_staleness("0s"), Ok(Duration::ZERO));
        for bad in ["", "s", "5m", "-1s", "1.5s", "3601s", "99999999999999999999s"] {
            assert!(parse_staleness(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_initial_cluster_is_id_and_address_pairs_each_id_once() {
        let parsed = parse_initial_cluster("1=127.0.0.1:9101, 2=127.0.0.2:9102").unwrap();
        assert_eq!(
            parsed,
            vec![(1, "127.0.0.1:9101".parse().unwrap()), (2, "127.0.0.2:9102".parse().unwrap())]
        );
        for (bad, says) in [
            ("", "lists no node"),
            ("1", "is not ID=HOST:PORT"),
            ("0=127.0.0.1:1", "not a positive node id"),
            ("x=127.0.0.1:1", "not a positive node id"),
            ("1=nowhere", "is not HOST:PORT"),
            ("1=127.0.0.1:1,1=127.0.0.1:2", "listed twice"),
        ] {
            let e = parse_initial_cluster(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let a = ServeArgs::parse_flags(["--node-id", "2"]);
        assert!(a.is_err(), "a node id needs a raft address and a secret");
    }
}
