//! Backups from the operator's side: `sheetd backup` (of a running server through its admin
//! API, or of a stopped data dir), `sheetd backup verify`, `sheetd restore`, and the stream
//! behind `GET /admin/v1/backup`. The file and its consistency are [`actors::backup`]'s.
//!
//! A backup is written to `FILE.tmp` and renamed to `FILE` only once complete (and, when it
//! came over the network, checked end to end), so a failed or interrupted backup never leaves
//! a file named `FILE`. Progress goes to stderr about once a second; the manifest's summary to
//! stdout at the end. The admin token is sent, never printed or logged.

use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use actix_web::web::Bytes;
use actors::backup::{self, Manifest, PointInTime, Progress, Until};
use anyhow::{bail, Context};
use futures_util::StreamExt;

use crate::cli::{fail, offline};
use crate::config::{BackupArgs, BackupCommand, RestoreArgs};

/// The files beside the log a backup carries: the cursor key.
pub const CURSOR_KEY_FILE: &str = "cursor.key";

/// Prints progress to stderr at most once a second.
struct Reporter {
    what: &'static str,
    started: Instant,
    last: Instant,
    rows: Option<u64>,
}

impl Reporter {
    fn new(what: &'static str) -> Reporter {
        let now = Instant::now();
        Reporter { what, started: now, last: now, rows: None }
    }

    fn tick(&mut self, p: Progress) {
        if self.last.elapsed() >= Duration::from_secs(1) {
            self.last = Instant::now();
            let rows = self.rows.map(|r| format!(", a state of {r} rows")).unwrap_or_default();
            let records =
                if p.records > 0 { format!(", {} log records", p.records) } else { String::new() };
            eprintln!(
                "{}: {:.1} MB{records}{rows} after {:.0?}",
                self.what,
                p.bytes as f64 / 1e6,
                self.started.elapsed()
            );
        }
    }
}

fn print_manifest(m: &Manifest) {
    let c = &m.counts;
    println!("position: LSN {} (checkpoint at LSN {})", m.position, m.checkpoint_lsn);
    println!("created: {}", m.created_at);
    println!(
        "data: {} users, {} projects, {} sheets, {} rows, {} attachments, {} keys, {} reports, \
         {} idempotency keys, {} events",
        c.users,
        c.projects,
        c.sheets,
        c.rows,
        c.attachments,
        c.keys,
        c.reports,
        c.idempotency_keys,
        c.events
    );
    println!("records: {} after the checkpoint, {} retained", m.records, m.retained_records);
    println!("digest: {}", m.digest);
}

/// `FILE.tmp` beside `FILE`.
fn tmp_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    out.with_file_name(name)
}

/// Runs `write` into `FILE.tmp`, then renames it to `FILE` durably; removes it on failure.
fn write_then_rename(
    out: &Path,
    write: impl FnOnce(&Path) -> anyhow::Result<Manifest>,
) -> anyhow::Result<Manifest> {
    let tmp = tmp_path(out);
    let written = write(&tmp).and_then(|manifest| {
        std::fs::rename(&tmp, out)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
        let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(parent).and_then(|d| d.sync_all()).context("fsync the directory")?;
        Ok(manifest)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn create(path: &Path) -> anyhow::Result<BufWriter<std::fs::File>> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok(BufWriter::with_capacity(1 << 20, file))
}

fn sync(file: BufWriter<std::fs::File>, path: &Path) -> anyhow::Result<()> {
    let file = file.into_inner().map_err(|e| e.into_error())?;
    file.sync_all().with_context(|| format!("cannot fsync {}", path.display()))
}

/// `sheetd backup ...`.
pub fn backup(args: BackupArgs) -> ExitCode {
    if let Some(BackupCommand::Verify { file }) = args.command {
        return verify(&file);
    }
    let out = args.out.expect("clap requires --out");
    let result = match (args.admin_url, args.data_dir) {
        (Some(url), _) => match args.admin_token {
            Some(token) => write_then_rename(&out, |tmp| online(&url, &token, tmp)),
            None => Err(anyhow::anyhow!("--admin-url needs --admin-token (or SHEETD_ADMIN_TOKEN)")),
        },
        (None, Some(dir)) => write_then_rename(&out, |tmp| offline_backup(&dir, tmp)),
        (None, None) => Err(anyhow::anyhow!("name --admin-url or --data-dir")),
    };
    match result {
        Ok(manifest) => {
            println!("backup written to {}", out.display());
            print_manifest(&manifest);
            ExitCode::SUCCESS
        }
        Err(e) => fail("backup", e),
    }
}

/// Streams the backup from a running server into `tmp`, checking it as it arrives: a transfer
/// cut short or damaged on the way must not become a file named like a good backup. The check
/// ([`backup::verify`]) reads the same bytes the file gets, on a thread of its own, so it runs
/// while the server is still sending instead of as a second pass over the file afterwards.
fn online(url: &str, token: &str, tmp: &Path) -> anyhow::Result<Manifest> {
    // The command runs beside the server it backs up more often than not: its threads (this
    // one, the check's and the HTTP client's, which inherit it) take what the writers leave.
    crate::priority::lower_to_background("backup");
    let url = format!("{}/admin/v1/backup", url.trim_end_matches('/'));
    // A bounded queue: the check keeps up or the transfer waits for it, in constant memory.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Bytes>(64);
    let checking = std::thread::Builder::new()
        .name("backup-check".to_owned())
        .spawn(move || backup::verify(Received { rx, chunk: Bytes::new() }, &mut |_| {}))
        .context("cannot start the check's thread")?;
    let received = actix_rt::System::new().block_on(async {
        let client = awc::Client::builder().disable_timeout().finish();
        let mut response = client
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach {url}: {e}"))?;
        if !response.status().is_success() {
            let body = response.body().limit(64 * 1024).await.unwrap_or_default();
            let message = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_owned))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
            bail!("{url} answered {}: {message}", response.status());
        }
        let mut file = create(tmp)?;
        let (mut reporter, mut bytes) = (Reporter::new("backup"), 0u64);
        while let Some(chunk) = response.next().await {
            let chunk =
                chunk.map_err(|e| anyhow::anyhow!("the transfer from {url} broke off: {e}"))?;
            file.write_all(&chunk).with_context(|| format!("cannot write {}", tmp.display()))?;
            bytes += chunk.len() as u64;
            reporter.tick(Progress { bytes, records: 0 });
            if tx.send(chunk).is_err() {
                // The check stopped at damage: its error says which.
                break;
            }
        }
        drop(tx);
        sync(file, tmp)
    });
    let checked = checking.join().map_err(|_| anyhow::anyhow!("the check's thread panicked"));
    received?;
    Ok(checked?.context("the backup received does not check")?.manifest)
}

/// The bytes of a backup as they are received, for the check.
struct Received {
    rx: std::sync::mpsc::Receiver<Bytes>,
    chunk: Bytes,
}

impl std::io::Read for Received {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.recv() {
                Ok(chunk) => self.chunk = chunk,
                // The transfer ended (or broke off: the receiving side reports that).
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.chunk.len());
        out[..n].copy_from_slice(&self.chunk.split_to(n));
        Ok(n)
    }
}

/// Backs up a data dir no server holds: recovers it as `sheetd key` does and takes the same
/// copies a running server takes.
fn offline_backup(data_dir: &Path, tmp: &Path) -> anyhow::Result<Manifest> {
    let files = side_files(data_dir)?;
    let tmp = tmp.to_owned();
    offline(data_dir, false, |service| async move {
        let copies = service.backup().await?;
        let mut reporter = Reporter::new("backup");
        reporter.rows = Some(copies.rows());
        let written = actix_web::rt::task::spawn_blocking(move || {
            let mut file = create(&tmp)?;
            let manifest = backup::write(copies, &files, &mut file, &mut |p| reporter.tick(p))?;
            sync(file, &tmp)?;
            Ok::<_, anyhow::Error>(manifest)
        });
        written.await.context("the backup's thread stopped")?
    })
}

/// The files beside the log a backup of `data_dir` carries.
fn side_files(data_dir: &Path) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let path = data_dir.join(CURSOR_KEY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(vec![(CURSOR_KEY_FILE.to_owned(), bytes)]),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// Reads all of the backup at `path` and checks it (see [`backup::verify`]).
fn check(path: &Path) -> anyhow::Result<Manifest> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reporter = Reporter::new("verify");
    let verified =
        backup::verify(BufReader::with_capacity(1 << 20, file), &mut |p| reporter.tick(p))?;
    Ok(verified.manifest)
}

/// `sheetd backup verify FILE`.
fn verify(file: &Path) -> ExitCode {
    match check(file) {
        Ok(manifest) => {
            print_manifest(&manifest);
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e) => fail("backup verify", e.context(format!("{} does not check", file.display()))),
    }
}

/// `sheetd restore --from FILE [--archive-dir DIR [--until T | --until-position N]]
/// --data-dir D`.
pub fn restore(args: RestoreArgs) -> ExitCode {
    let until = match (&args.until, args.until_position) {
        (Some(text), _) => match actors::coerce::parse_instant(text) {
            Ok(at) => Until::Time(at),
            Err(why) => {
                let e = anyhow::anyhow!("--until `{text}` is not an RFC 3339 time: {why}");
                return fail("restore", e.context("nothing was restored"));
            }
        },
        (None, Some(lsn)) => Until::Position(lsn),
        (None, None) => Until::End,
    };
    let point = args.archive_dir.as_deref().map(|dir| PointInTime { archive_dir: dir, until });
    let mut reporter = Reporter::new("restore");
    match backup::restore_to(&args.from, &args.data_dir, point, &mut |p| reporter.tick(p)) {
        Ok(restored) => {
            println!("restored {} into {}", args.from.display(), args.data_dir.display());
            print_manifest(&restored.manifest);
            if point.is_some() {
                let at = restored.position_at.and_then(actors::model::timestamp);
                println!(
                    "rolled forward: to LSN {}{} with {} archived records from {} segments",
                    restored.position,
                    at.map(|t| format!(" (a record of {t})")).unwrap_or_default(),
                    restored.archived_records,
                    restored.segments
                );
                println!("restored digest: {}", restored.digest);
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail("restore", anyhow::Error::new(e).context("nothing was restored")),
    }
}

/// A blocking writer feeding a streamed response in chunks; fails once the client is gone.
pub struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>,
    buf: Vec<u8>,
    /// The writing thread's CPU budget while requests are served, their count, and where
    /// the time it waited goes.
    pace: Option<Pace>,
}

/// See [`ChannelWriter::paced`].
struct Pace {
    budget: crate::priority::Budget,
    served: Box<dyn Fn() -> u64 + Send>,
    waited: Box<dyn Fn(Duration) + Send>,
}

/// Bytes sent to the response at a time.
const CHUNK: usize = 256 * 1024;

impl ChannelWriter {
    /// A writer into `tx`.
    pub fn new(tx: tokio::sync::mpsc::Sender<std::io::Result<Bytes>>) -> ChannelWriter {
        ChannelWriter { tx, buf: Vec::with_capacity(CHUNK), pace: None }
    }

    /// Paces the writing thread, chunk by chunk, to `budget` (see [`crate::priority`]):
    /// `served` counts the requests served so far; `waited` is told each wait.
    pub fn paced(
        mut self,
        budget: crate::priority::Budget,
        served: impl Fn() -> u64 + Send + 'static,
        waited: impl Fn(Duration) + Send + 'static,
    ) -> ChannelWriter {
        self.pace = Some(Pace { budget, served: Box::new(served), waited: Box::new(waited) });
        self
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if let Some(pace) = &mut self.pace {
            let waited = pace.budget.pace_blocking(&*pace.served);
            if !waited.is_zero() {
                (pace.waited)(waited);
            }
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| std::io::ErrorKind::BrokenPipe.into())
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
