//! The `sheetd` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

use clap::Parser;
use sheetd::config::{Cli, Command};
use sheetd::server::{self, Options};

fn init_logging(json: bool, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_level.into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
