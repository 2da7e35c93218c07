//! The `sheetd` binary: the command line and dispatch (the log is [`sheetd::logging`]'s). It is
//! where the server library and the load generator meet: `sheetd bench` is [`sheetd_bench`]
//! with this binary's server as its own server, and neither library knows the other.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use futures_util::future::LocalBoxFuture;
use sheetd::config::{BackupArgs, KeyCommand, RestoreArgs, ServeArgs};
use sheetd::server::{self, Options};
use sheetd_bench::{BenchArgs, Started};

/// sheetd: a durable, versioned JSON REST API over spreadsheet data.
#[derive(Debug, Parser)]
#[command(name = "sheetd", version, about)]
struct Cli {
    /// The subcommand; a bare `sheetd` prints the help instead.
    #[command(subcommand)]
    command: Command,
}

/// One subcommand per kind of run: serve, check a data dir, manage keys, back up and restore,
/// load-test.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service.
    Serve(Box<ServeArgs>),
    /// Verify a data dir that no server holds open: replay the log, print counts, exit non-zero
    /// on damage.
    Check {
        /// The data dir to check (no server may hold it).
        #[arg(long, env = "SHEETD_DATA_DIR", default_value = "./sheetd-data")]
        data_dir: PathBuf,
    },
    /// Manage API keys in a data dir that no server holds open.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Back up a running server (`--admin-url`) or a stopped data dir (`--data-dir`) into one
    /// checked file; `sheetd backup verify FILE` checks one.
    Backup(BackupArgs),
    /// Restore a backup into an empty or absent data dir, after checking all of it; with
    /// `--archive-dir`, rolled forward to `--until` a time or `--until-position` an LSN.
    Restore(RestoreArgs),
    /// Run a local cluster of N nodes on 127.0.0.1..N for trying it out.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Load-test a server: this binary's own, in-process on generated data, or a running one
    /// (`--url`). Prints a table per concurrency level; `--verify` reads back every
    /// acknowledged write.
    Bench(Box<BenchArgs>),
}

/// jemalloc, not the system allocator: it gives back what a load freed (see Cargo.toml).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `sheetd cluster ...`.
#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Start N `sheetd serve` processes as one cluster on this machine; Ctrl-C stops them.
    Up(sheetd::local_cluster::UpArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            sheetd::logging::init_server(args.log_json);
            let opts = Options { args: *args, clock: Default::default(), print_secrets: true };
            let system = actix_rt::System::new();
            let result = system.block_on(async move {
                let running = server::start(opts).await?;
                server::wait_for_signal().await;
                tracing::info!("stopping: draining in-flight requests");
                server::stop(running).await
            });
            // Every line logged before the last words below.
            sheetd::logging::flush();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sheetd: {e:#}");
                    // A start that failed after the actors began (the log archive's dir in use,
                    // a refused seed) leaves them on the runtime; dropping it would drop them
                    // outside it, which panics. The process ends here: nothing is left to run.
                    std::mem::forget(system);
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { data_dir } => {
            sheetd::logging::init(false, "info");
            sheetd::cli::check(&data_dir)
        }
        Command::Key(cmd) => {
            sheetd::logging::init(false, "info");
            sheetd::cli::key(cmd)
        }
        Command::Backup(args) => {
            sheetd::logging::init(false, "warn");
            sheetd::backup::backup(args)
        }
        Command::Restore(args) => {
            sheetd::logging::init(false, "warn");
            sheetd::backup::restore(args)
        }
        Command::Cluster(ClusterCommand::Up(args)) => {
            sheetd::logging::init(false, "warn");
            sheetd::local_cluster::up(args)
        }
        Command::Bench(args) => {
            // The own server's per-request info lines would bury the table.
            sheetd::logging::init(false, "warn");
            sheetd_bench::main(*args, own_server)
        }
    }
}

/// `sheetd bench`'s own server: `sheetd serve` with the flags the load generator chose, started
/// in this process so the run measures the very build it ships with.
fn own_server(flags: Vec<OsString>) -> LocalBoxFuture<'static, anyhow::Result<Started>> {
    Box::pin(async move {
        let args = ServeArgs::parse_flags(flags)?;
        let running =
            server::start(Options { args, clock: Default::default(), print_secrets: false })
                .await?;
        let (addr, admin_addr) = (running.addr, running.admin_addr);
        Ok(Started { addr, admin_addr, stop: Box::pin(server::stop(running)) })
    })
}
