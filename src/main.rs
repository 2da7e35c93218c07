//! The `sheetd` binary: parse the command line, set up logging, dispatch.

use std::process::ExitCode;

use clap::Parser;
use sheetd::config::{Cli, Command};
use sheetd::server::{self, Options};

fn init_logging(json: bool) {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
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
            init_logging(args.log_json);
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
            init_logging(false);
            match actors::Service::verify(&data_dir) {
                Ok((report, counts)) => {
                    println!(
                        "log: checkpoint at {:?}, {} records replayed ({} bytes), last LSN {}",
                        report.checkpoint_lsn,
                        report.records_replayed,
                        report.bytes_replayed,
                        report.last_lsn
                    );
                    println!(
                        "data: {} users, {} projects, {} sheets, {} rows, {} attachments ({} bytes), {} keys, {} reports",
                        counts.users,
                        counts.projects,
                        counts.sheets,
                        counts.rows,
                        counts.attachments,
                        counts.attachment_bytes,
                        counts.keys,
                        counts.reports
                    );
                    if report.torn_tail_dropped {
                        println!("damage: the last record is torn (an unacknowledged write cut off by a crash)");
                        return ExitCode::FAILURE;
                    }
                    println!("ok");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("sheetd check: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
