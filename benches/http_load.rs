//! The end-to-end HTTP load test as a `cargo bench` entry point: `sheetd bench` (the library
//! `sheetd_bench`) against its own in-process server on a temporary data dir, once with
//! durable bulk adds and once with cursor-walked page reads, at concurrency 1, 16 and 64.
//! Prints one table per workload.
//!
//! Run: `cargo bench --bench http_load` (add `-- --quick` for a short run). For other
//! workloads, a running server or JSON output, use `sheetd bench` itself.

use std::ffi::OsString;

use futures_util::future::LocalBoxFuture;
use sheetd::config::ServeArgs;
use sheetd::server::{self, Options};
use sheetd_bench::{self as bench, BenchArgs, Started};

/// The own server, started as the `sheetd` binary starts it for `sheetd bench`.
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

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (duration, warmup, rows) =
        if quick { ("1s", "500ms", "2000") } else { ("5s", "1s", "10000") };
    let mut failed = false;
    for workload in [
        ["--workload", "bulk-add", "--bulk-size", "1"],
        ["--workload", "read-page", "--page-size", "100"],
    ] {
        let flags = [
            &workload[..],
            &[
                "--concurrency",
                "1,16,64",
                "--duration",
                duration,
                "--warmup",
                warmup,
                "--rows",
                rows,
            ],
        ]
        .concat();
        let args = BenchArgs::parse_flags(flags).expect("valid flags");
        let report = actix_rt::System::new()
            .block_on(bench::execute(&args, Some(own_server)))
            .expect("bench runs");
        print!("{}", report.table());
        println!();
        failed |= !report.passed;
    }
    if failed {
        eprintln!("http_load: 5xx or transport errors; see the tables");
        std::process::exit(1);
    }
}
