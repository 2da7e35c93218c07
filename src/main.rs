//! The `sheetd` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

use clap::Parser;
use sheetd::config::{Cli, Command};
use sheetd::server::{self, Options};

/// jemalloc, not the system allocator: it gives back what a load freed (see Cargo.toml).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The log filter when `RUST_LOG` is unset. actix-http's connection dispatcher logs at ERROR
/// every request its own parser refuses (a 64 KB URI, too many headers, a control character in
/// a header, a conflicting `Content-Length` and `Transfer-Encoding`) before sheetd sees it. Those
/// are the client's faults, answered with a bare 400/431, and a filter cannot lower an event's
/// level, so that target is off by default; sheetd's own errors keep their level.
const DEFAULT_LOG_FILTER: &str = "info,actix_http::h1::dispatcher=off";

/// `default_level` applies when `RUST_LOG` is unset, beside [`DEFAULT_LOG_FILTER`]'s rule.
fn init_logging(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| DEFAULT_LOG_FILTER.replacen("info", default_level, 1).into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // A log line that cannot be written (stderr on a full disk) is dropped. By default the
        // subscriber reports that with `eprintln!`, which panics when stderr fails too, and
        // the panic took down the actor whose event it was.
        .log_internal_errors(false)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            init_logging(args.log_json, "info");
            let opts = Options { args, clock: Default::default(), print_secrets: true };
            let result = actix_rt::System::new().block_on(async move {
                let running = server::start(opts).await?;
                server::wait_for_signal().await;
                tracing::info!("stopping: draining in-flight requests");
                server::stop(running).await
            });
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sheetd: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check { data_dir } => {
            init_logging(false, "info");
            sheetd::cli::check(&data_dir)
        }
        Command::Key(cmd) => {
            init_logging(false, "info");
            sheetd::cli::key(cmd)
        }
        Command::Bench(args) => {
            // The own server's per-request info lines would bury the table.
            init_logging(false, "warn");
            sheetd::bench::main(*args)
        }
    }
}
