//! `sheetd bench` through real servers: every workload's report, `--verify` against writes
//! changed behind the run's back, open-loop latency that includes queueing, 429s that are
//! counted rather than fatal, the `--html` page (parsed, and rendered by headless Chromium) and
//! `bench compare` through the built binary. Runs are a few hundred requests or two seconds; no
//! assertion is on a duration beyond a stall the test itself injects.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};
use sheetd_bench::{self as bench, data, verify::Expected, BenchArgs, Target};

use crate::common::*;

fn flags(list: &[&str]) -> BenchArgs {
    BenchArgs::parse_flags(list).expect("valid flags")
}

/// The report as the `--json` document.
fn json_of(report: &bench::Report) -> Value {
    serde_json::to_value(report).unwrap()
}

/// Structure and relations every level of a report must show.
fn assert_sane_level(l: &Value, what: &str) {
    let n = |k: &str| l[k].as_f64().unwrap_or_else(|| panic!("{what}: {k} in {l}"));
    assert!(n("requests") > 0.0, "{what}: {l}");
    assert!(n("elapsedSeconds") > 0.0, "{what}: {l}");
    assert!(n("requestsPerSecond") > 0.0, "{what}: {l}");
    let ms = &l["latencyMs"];
    let p = |k: &str| ms[k].as_f64().unwrap_or_else(|| panic!("{what}: latencyMs.{k} in {l}"));
    assert!(p("min") > 0.0, "{what}: {ms}");
    assert!(p("min") <= p("p50"), "{what}: {ms}");
    assert!(p("p50") <= p("p90") && p("p90") <= p("p99"), "{what}: {ms}");
    assert!(p("p99") <= p("p999") && p("p999") <= p("max"), "{what}: {ms}");
    assert!(l["errors"].is_array() && l["ops"].is_array(), "{what}: {l}");
}

/// The own server's workspace is one the server seeds from, and every cell the generator
/// writes is valid for its column.
#[test]
fn the_generated_fixture_parses_and_every_cell_coerces() {
    let key = data::own_key();
    let fx = data::fixture(2, 12, &key);
    let parsed = sheetd::server::parse_fixture(&fx.to_string(), "test").unwrap();
    assert_eq!(parsed.sheets.len(), 2);
    assert_eq!(parsed.columns.len(), 24);
    let columns: Vec<data::ColumnInfo> = fx["columns"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["sheetId"] == 1)
        .map(|c| data::ColumnInfo {
            id: c["id"].as_u64().unwrap(),
            ty: c["type"].as_str().unwrap().to_owned(),
            options: serde_json::from_value(c["options"].clone()).unwrap_or_default(),
        })
        .collect();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    // Rows in a fixture are coerced like API writes: a fixture with generated rows parses
    // and prepares, so every generated value is valid for its column.
    let mut with_rows = fx.clone();
    with_rows["rows"] = (0..50)
        .map(
            |i| json!({"id": 100 + i, "sheetId": 1, "cells": data::row_cells(&columns, i, &mut rng)}),
        )
        .collect();
    let fixture = sheetd::server::parse_fixture(&with_rows.to_string(), "test").unwrap();
    let state = actors::directory::DirectoryState::default();
    actors::directory::fixture::prepare(fixture, &state, 1, 0).expect("generated cells coerce");
}

/// The own server and load of the runs here: 2 sheets of 300 rows, 150 requests a level.
const SMALL_RUN: &[&str] = &[
    "--sheets",
    "2",
    "--rows",
    "300",
    "--columns",
    "12",
    "--requests",
    "150",
    "--warmup",
    "0s",
    "--bulk-size",
    "20",
];

/// Run `workload` against an own server and check its report.
async fn own_server_run(workload: &[&str], writes: bool) -> Value {
    let more = ["--concurrency", "1,4", "--rows-per-client", "8", "--verify"];
    let args = flags(&[workload, SMALL_RUN, &more].concat());
    let report = bench::execute(&args, Some(own_server)).await.expect("the run completes");
    let r = json_of(&report);
    let what = workload.join(" ");
    assert_eq!(r["version"], 1);
    assert_eq!(r["target"]["mode"], "own");
    assert_eq!(r["target"]["sheets"], json!([1, 2]));
    assert_eq!(r["target"]["loaded"]["rows"], 600);
    assert_eq!(r["load"]["loop"], "closed");
    assert_eq!(r["warnings"], json!([]), "{what}: the own server's limit is out of reach");
    assert_eq!(r["passed"], true, "{what}: {r:#}");
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for (l, c) in levels.iter().zip([1, 4]) {
        assert_eq!(l["concurrency"], c);
        assert_eq!(l["requests"], 150, "{what}: exactly the requests asked for");
        let ok = l["okRequests"].as_u64().unwrap();
        assert_eq!(ok + l["expectedConflicts"].as_u64().unwrap(), 150, "{what}: {l}");
        assert_eq!(l["fatalErrors"], 0);
        assert_sane_level(l, &what);
        assert!(l["rowsPerSecond"].as_f64().unwrap() > 0.0, "{what}: {l}");
        let server = &l["server"];
        assert!(server["flushes"].is_u64(), "{what}: the own server's log figures: {l}");
        if writes {
            assert!(l["rowsWritten"].as_u64().unwrap() > 0, "{what}: {l}");
            assert!(server["flushes"].as_u64().unwrap() > 0, "{what}: {l}");
            assert!(server["recordsPerFlush"].as_f64().unwrap() >= 1.0, "{what}: {l}");
            assert!(server["flushMeanMs"].as_f64().unwrap() > 0.0, "{what}: {l}");
        } else {
            assert!(l["rowsRead"].as_u64().unwrap() > 0, "{what}: {l}");
        }
    }
    let v = &r["verify"];
    assert_eq!((v["lost"].as_u64(), v["wrong"].as_u64()), (Some(0), Some(0)), "{what}: {v}");
    assert!(v["checked"].as_u64().unwrap() > 0 || !writes, "{what}: {v}");
    r
}

#[actix_rt::test]
async fn read_workloads_report_rows_read_and_ordered_percentiles() {
    for w in ["read-page", "get-sheet", "report"] {
        let r = own_server_run(&["--workload", w, "--page-size", "50"], false).await;
        assert_eq!(r["workload"]["name"], w);
    }
}

#[actix_rt::test]
async fn write_workloads_report_rows_written_and_the_logs_flushes() {
    for w in ["patch", "bulk-add", "bulk-update", "delete"] {
        let r = own_server_run(&["--workload", w], true).await;
        assert_eq!(r["workload"]["name"], w);
        for l in r["levels"].as_array().unwrap() {
            assert!(l["rowsWritten"].as_u64().unwrap() >= 150, "one row or more per request: {l}");
        }
        if w == "delete" {
            let v = &r["verify"];
            assert!(v["deletesChecked"].as_u64().unwrap() >= 300, "{v}");
            assert_eq!(v["notDeleted"], 0);
        }
        if w == "bulk-add" {
            let l = &r["levels"][0];
            assert_eq!(l["rowsWritten"], 150 * 20, "every item of every bulk add: {l}");
        }
    }
    // Without --verify a bulk answer's rows are skipped, not read: the count must not change.
    let args = flags(&[&["--workload", "bulk-add", "--concurrency", "1"], SMALL_RUN].concat());
    let r = json_of(&bench::execute(&args, Some(own_server)).await.expect("the run completes"));
    let l = &r["levels"][0];
    assert_eq!(l["rowsWritten"], 150 * 20, "every item of every bulk add: {l}");
    assert_eq!(l["errorRequests"], 0, "{l}");
}

#[actix_rt::test]
async fn a_mixed_workload_counts_deliberate_conflicts_apart_from_errors() {
    let r = own_server_run(
        &["--mix", "read-page=50,patch=40,bulk-add=10", "--conflict-rate", "0.3"],
        true,
    )
    .await;
    assert_eq!(r["workload"]["name"], "mixed");
    let mut conflicts = 0;
    for l in r["levels"].as_array().unwrap() {
        conflicts += l["expectedConflicts"].as_u64().unwrap();
        assert_eq!(l["errorRequests"], 0, "expected conflicts are not errors: {l}");
        let ops: Vec<&str> =
            l["ops"].as_array().unwrap().iter().map(|o| o["op"].as_str().unwrap()).collect();
        assert_eq!(ops, ["read-page", "patch", "bulk-add"], "{l}");
    }
    assert!(conflicts > 0, "30 % of some 120 patches were sent stale");
}

#[actix_rt::test]
async fn get_row_reads_the_clients_own_rows() {
    let r = own_server_run(&["--workload", "get-row"], false).await;
    assert_eq!(r["workload"]["name"], "get-row");
    for l in r["levels"].as_array().unwrap() {
        assert_eq!(l["rowsRead"], 150, "one row per request: {l}");
    }
}

#[actix_rt::test]
async fn get_row_runs_against_a_running_server_with_the_route() {
    let s = TestServer::start().await;
    let args = flags(&[
        "--url",
        &s.base,
        "--key",
        ADA_WRITE,
        "--sheet-ids",
        "11",
        "--workload",
        "get-row",
        "--requests",
        "10",
        "--concurrency",
        "1",
        "--warmup",
        "0s",
    ]);
    let target = Target::open(&args, None).await.unwrap();
    let r = json_of(&bench::run(&args, &target).await.expect("the server has getRow").report);
    assert_eq!(r["passed"], true, "{r:#}");
    assert_eq!(
        (&r["levels"][0]["okRequests"], &r["levels"][0]["rowsRead"]),
        (&json!(10), &json!(10))
    );
}

#[actix_rt::test]
async fn verify_passes_untouched_writes_and_reports_ones_changed_behind_the_runs_back() {
    let s = TestServer::start().await;
    // Sheet 10 has every column type; sheet 11 is the one a second key can write.
    let args = flags(&[
        "--url",
        &s.base,
        "--key",
        ADA_WRITE,
        "--sheet-ids",
        "10,11",
        "--mix",
        "patch=50,bulk-update=20,bulk-add=20,delete=10",
        "--bulk-size",
        "5",
        "--requests",
        "200",
        "--concurrency",
        "2",
        "--warmup",
        "0s",
        "--rows-per-client",
        "6",
        "--verify",
        "--admin-url",
        &s.admin,
        "--admin-token",
        ADMIN_TOKEN,
    ]);
    let target = Target::open(&args, None).await.unwrap();
    let run = bench::run(&args, &target).await.unwrap();
    let r = json_of(&run.report);
    assert_eq!(r["passed"], true, "{r:#}");
    assert!(r["levels"][0]["server"]["recordsFlushed"].as_u64().unwrap() > 0, "{r:#}");

    let clean = bench::verify(&target, &run.ledger).await.unwrap();
    assert!(clean.passed(), "{clean:?}");
    assert!(clean.checked > 50 && clean.deletes_checked > 0, "{clean:?}");
    assert!(clean.requests >= 2, "one listRows walk per sheet");
    assert_eq!((clean.lost, clean.wrong, clean.uncertain), (0, 0, 0));

    // Behind the run's back: another key patches one acknowledged row, and deletes another.
    let mut in_sheet_11 =
        run.ledger.rows().filter(|(_, e)| e.sheet == 11 && matches!(e.state, Expected::Row { .. }));
    let (patched, _) = in_sheet_11.next().expect("a row written in sheet 11");
    let (deleted, _) = in_sheet_11.next().expect("another");
    let version = match &run.ledger.get(patched).unwrap().state {
        Expected::Row { version, .. } => *version,
        _ => unreachable!(),
    };
    let body = json!({"version": version, "cells": {"110": "changed behind the run's back"}});
    let (status, _, _) = s
        .call("PATCH", &format!("/sheets/11/rows/{patched}"), Some(ADA_SHEET11), Some(&body))
        .await;
    assert_eq!(status, 200);
    let (status, _, _) =
        s.call("DELETE", &format!("/sheets/11/rows/{deleted}"), Some(ADA_SHEET11), None).await;
    assert_eq!(status, 204);

    let v = bench::verify(&target, &run.ledger).await.unwrap();
    assert!(!v.passed());
    assert_eq!((v.lost, v.wrong, v.not_deleted), (1, 1, 0), "{v:?}");
    let lost = v.findings.iter().find(|f| f.problem == "lost").unwrap();
    assert_eq!((lost.row_id, lost.found_version), (deleted, None));
    let wrong = v.findings.iter().find(|f| f.problem == "wrong").unwrap();
    assert_eq!(wrong.row_id, patched);
    assert_eq!((wrong.expected_version, wrong.found_version), (Some(version), Some(version + 1)));
    assert_eq!(wrong.found_cells.as_ref().unwrap()["110"], "changed behind the run's back");
    target.close().await.unwrap();
}

/// A pass-through proxy to `upstream` that holds exactly one `getSheet` (the `stall_at`-th)
/// for `stall` before forwarding it.
async fn stalling_proxy(
    upstream: String,
    stall_at: usize,
    stall: Duration,
) -> (String, actix_web::dev::ServerHandle) {
    let hits = Arc::new(AtomicUsize::new(0));
    let server = HttpServer::new(move || {
        let (upstream, hits) = (upstream.clone(), hits.clone());
        App::new().default_service(web::to(move |req: HttpRequest, body: web::Bytes| {
            let (upstream, hits) = (upstream.clone(), hits.clone());
            async move {
                let segments = req.path().trim_matches('/').split('/').count();
                let get_sheet = req.method() == "GET"
                    && req.path().starts_with("/api/v1/sheets/")
                    && segments == 4;
                if get_sheet && hits.fetch_add(1, Ordering::SeqCst) == stall_at {
                    actix_rt::time::sleep(stall).await;
                }
                let client = awc::Client::default();
                let mut out =
                    client.request(req.method().clone(), format!("{upstream}{}", req.uri()));
                for name in ["authorization", "content-type"] {
                    if let Some(v) = req.headers().get(name) {
                        out = out.insert_header((name, v.clone()));
                    }
                }
                let mut res = out.send_body(body).await.expect("upstream answers");
                let bytes = res.body().limit(64 << 20).await.unwrap();
                let mut reply = HttpResponse::build(res.status());
                for (n, v) in res.headers() {
                    let hop = ["content-length", "transfer-encoding", "connection", "keep-alive"];
                    if !hop.contains(&n.as_str()) {
                        reply.insert_header((n.clone(), v.clone()));
                    }
                }
                reply.body(bytes)
            }
        }))
    })
    .workers(1)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_rt::spawn(server);
    (format!("http://{addr}/api/v1"), handle)
}

#[actix_rt::test]
async fn open_loop_latency_counts_the_wait_of_requests_due_during_a_stall() {
    let s = TestServer::start().await;
    let upstream = s.base.trim_end_matches("/api/v1").to_owned();
    let (proxy, handle) = stalling_proxy(upstream, 30, Duration::from_millis(200)).await;
    // 200 requests per second on one connection: about 40 fall due during the 200 ms stall.
    let args = flags(&[
        "--url",
        &proxy,
        "--key",
        ADA_READ,
        "--sheet-ids",
        "11",
        "--workload",
        "get-sheet",
        "--rate",
        "200",
        "--concurrency",
        "1",
        "--requests",
        "100",
        "--warmup",
        "0s",
    ]);
    let target = Target::open(&args, None).await.unwrap();
    let run = bench::run(&args, &target).await.unwrap();
    handle.stop(true).await;
    let r = json_of(&run.report);
    assert_eq!(r["load"]["loop"], "open");
    let l = &r["levels"][0];
    assert_eq!(l["requests"], 100);
    assert_sane_level(l, "open loop");
    let ms = &l["latencyMs"];
    assert!(ms["max"].as_f64().unwrap() >= 200.0, "the stalled request itself: {ms}");
    // The requests due while the one connection was held waited too, up to 200 ms each; at
    // least 20 of the 100 waited 100 ms or more, so the 90th percentile shows it (a closed
    // loop would show only the one stalled request).
    assert!(ms["p90"].as_f64().unwrap() >= 100.0, "queueing delay is counted: {ms}");
}

#[actix_rt::test]
async fn rate_limited_runs_warn_up_front_and_count_429s_without_failing() {
    let s = TestServer::start_with(fixture(), |a| a.rate_limit_per_minute = 50).await;
    let args = flags(&[
        "--url",
        &s.base,
        "--key",
        ADA_READ,
        "--sheet-ids",
        "11",
        "--workload",
        "get-sheet",
        "--requests",
        "80",
        "--concurrency",
        "1",
        "--warmup",
        "0s",
    ]);
    let target = Target::open(&args, None).await.unwrap();
    let run = bench::run(&args, &target).await.expect("429s do not end the run");
    let r = json_of(&run.report);
    assert_eq!(r["rateLimit"]["limit"], 50);
    let warnings = r["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{r:#}");
    let w = warnings[0].as_str().unwrap();
    assert!(w.contains("at least 80 requests") && w.contains("of its 50 per minute"), "{w}");
    let l = &r["levels"][0];
    assert_eq!(l["requests"], 80);
    let limited: Vec<&Value> = l["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"] == 429 && e["errorCode"] == "rate_limit_exceeded")
        .collect();
    assert_eq!(limited.len(), 1, "{l}");
    let n429 = limited[0]["count"].as_u64().unwrap();
    assert!(n429 >= 30, "at most 50 requests a minute pass, setup included: {l}");
    assert_eq!(l["okRequests"].as_u64().unwrap() + n429, 80, "{l}");
    assert_eq!(l["fatalErrors"], 0);
    assert_eq!(r["passed"], true, "429s are reported, not fatal");
}

/// `sheetd bench` as an operator runs it: the built binary with its own server, in `dir`.
fn bench_binary(dir: &std::path::Path, flags: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sheetd"))
        .arg("bench")
        .args(flags)
        .current_dir(dir)
        .output()
        .expect("sheetd runs")
}

/// A short real run of the binary: patches on a small own server at concurrency 1 and 2,
/// writing `run.json` and `run.html` in `dir`.
fn short_run(dir: &std::path::Path, budget: &[&str]) -> (Value, String) {
    let flags = [
        &["--sheets", "1", "--rows", "200", "--workload", "patch", "--concurrency", "1,2"],
        budget,
        &["--warmup", "0s", "--json", "run.json", "--html", "run.html"],
    ]
    .concat();
    let out = bench_binary(dir, &flags);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = std::fs::read_to_string(dir.join("run.json")).unwrap();
    let html = std::fs::read_to_string(dir.join("run.html")).unwrap();
    (serde_json::from_str(&json).unwrap(), html)
}

const FIGURES: [&str; 4] = ["throughput", "latency", "percentiles", "group-commits"];

/// The page is well-formed (it parses whole as XML), and names nothing outside itself: no
/// element that loads anything, no URL but the SVG namespace.
fn assert_self_contained(html: &str) -> roxmltree::Document<'_> {
    let options = roxmltree::ParsingOptions { allow_dtd: true, ..Default::default() };
    let doc = roxmltree::Document::parse_with_options(html, options)
        .unwrap_or_else(|e| panic!("the page parses as XML: {e}"));
    for n in doc.descendants().filter(|n| n.is_element()) {
        let name = n.tag_name().name();
        assert!(
            !["script", "link", "img", "iframe", "object", "embed", "image", "use"].contains(&name),
            "<{name}> in the page"
        );
        for a in n.attributes() {
            let link = ["href", "src", "srcset", "action", "data"].contains(&a.name());
            assert!(!link, "<{name} {}=\"{}\">", a.name(), a.value());
            assert!(!a.value().contains("url("), "<{name} {}=\"{}\">", a.name(), a.value());
        }
    }
    let outside = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for word in ["http://", "https://", "@import", "url(", "file:"] {
        assert!(!outside.contains(word), "{word} in the page");
    }
    doc
}

/// The page of a short real run holds one chart per figure and level, each with its title,
/// axes and legend, and nothing from outside; headless Chromium renders it without a console
/// error, and the charts' lines are on the screenshot.
#[test]
fn a_runs_html_page_holds_every_chart_links_nothing_and_renders() {
    let dir = tempfile::tempdir().unwrap();
    let (run, html) = short_run(dir.path(), &["--duration", "2s"]);
    assert_eq!(run["passed"], true, "{run:#}");
    assert_eq!(run["build"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(run["machine"]["cores"].as_u64().unwrap() >= 1, "{}", run["machine"]);
    for l in run["levels"].as_array().unwrap() {
        assert!(!l["timeline"].as_array().unwrap().is_empty(), "{l}");
        assert!(l["latencyCurve"].as_array().unwrap().len() >= 2, "{l}");
        assert!(!l["serverTimeline"].as_array().unwrap().is_empty(), "{l}");
        assert_eq!(l["repeats"].as_array().unwrap().len(), 1);
        assert!(l["spread"].is_null());
    }

    let doc = assert_self_contained(&html);
    let figures: Vec<roxmltree::Node> =
        doc.descendants().filter(|n| n.has_tag_name("figure")).collect();
    assert_eq!(figures.len(), 2 * FIGURES.len(), "one chart per figure and level");
    for c in ["1", "2"] {
        for f in FIGURES {
            let mut found = figures.iter().filter(|n| {
                n.attribute("data-figure") == Some(f) && n.attribute("data-concurrency") == Some(c)
            });
            let fig = found.next().unwrap_or_else(|| panic!("{f} at concurrency {c}"));
            assert!(found.next().is_none(), "one {f} at concurrency {c}");
            let svgs: Vec<_> = fig.children().filter(|n| n.has_tag_name("svg")).collect();
            assert_eq!(svgs.len(), 1, "{f} at {c}: one inline SVG");
            let texts: Vec<&str> = svgs[0]
                .descendants()
                .filter(|n| n.has_tag_name("text"))
                .filter_map(|n| n.text())
                .map(str::trim)
                .collect();
            let title = texts.iter().find(|t| t.ends_with(&format!("concurrency {c}")));
            assert!(title.is_some(), "{f} at {c}: a title: {texts:?}");
            assert!(texts.len() > 8, "{f} at {c}: axis labels: {texts:?}");
            let lines = svgs[0].descendants().filter(|n| n.has_tag_name("polyline")).count();
            assert!(lines >= 2, "{f} at {c}: drawn lines and legend keys");
        }
    }
    let page_text: String = doc.descendants().filter_map(|n| n.text()).collect();
    for fact in ["patch", "closed", "cores", "sheetd 0.1.0"] {
        assert!(page_text.contains(fact), "settings, machine and build: {fact}");
    }

    let page = dir.path().join("run.html");
    let shot = dir.path().join("shot.png");
    let console = chromium_console(&page, &shot, (1200, 3200));
    assert!(console.is_empty(), "console messages: {console:?}");
    let pixels = screenshot_pixels(&shot);
    // The series colours appear only in the charts' lines, never in the page's own style.
    for (name, rgb) in [("requests/s", [31, 119, 180]), ("percentile curve", [148, 103, 189])] {
        let near =
            pixels.iter().filter(|p| p.iter().zip(rgb).all(|(a, b)| a.abs_diff(b) < 12)).count();
        assert!(near > 100, "{name}: {near} pixels of its colour in the screenshot");
    }
    let distinct: std::collections::HashSet<&[u8; 3]> = pixels.iter().collect();
    assert!(distinct.len() > 50, "the screenshot varies: {} colours", distinct.len());

    // The check above would see a console error: a page that makes one is caught.
    let bad = dir.path().join("bad.html");
    std::fs::write(&bad, "<html><body><script>console.error('seen')</script></body></html>")
        .unwrap();
    let seen = chromium_console(&bad, &dir.path().join("bad.png"), (300, 200));
    assert!(seen.iter().any(|l| l.contains("seen")), "{seen:?}");
}

/// Open `page` in headless Chromium, screenshot it into `shot`, and give the console's lines.
fn chromium_console(
    page: &std::path::Path,
    shot: &std::path::Path,
    (w, h): (u32, u32),
) -> Vec<String> {
    let out = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(format!("--window-size={w},{h}"))
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "headless Chromium is needed to check the --html page ({e}): install Debian's \
                 `chromium` (.ci/test does: apt-get install -y chromium)"
            )
        });
    assert!(out.status.success() && shot.exists(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect()
}

/// The RGB pixels of a PNG screenshot.
fn screenshot_pixels(path: &std::path::Path) -> Vec<[u8; 3]> {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = info.color_type.samples();
    assert!(step >= 3 && info.bit_depth == png::BitDepth::Eight, "{info:?}");
    buf[..info.buffer_size()].chunks(step).map(|p| [p[0], p[1], p[2]]).collect()
}

/// `--repeat 2` records each run and their spread; `bench compare` finds no change between a
/// run and itself, and a change that fails `--fail-if 10` when the throughput is halved.
#[test]
fn compare_tells_a_halved_throughput_from_the_same_run() {
    let dir = tempfile::tempdir().unwrap();
    let (run, _) = short_run(dir.path(), &["--requests", "200", "--repeat", "2"]);
    assert_eq!(run["load"]["repeat"], 2);
    for l in run["levels"].as_array().unwrap() {
        let repeats = l["repeats"].as_array().unwrap();
        assert_eq!(repeats.len(), 2, "{l}");
        assert_eq!(l["requests"], 400, "both runs' requests: {l}");
        let rates: Vec<f64> =
            repeats.iter().map(|r| r["requestsPerSecond"].as_f64().unwrap()).collect();
        let spread = l["spread"]["requestsPerSecond"].as_f64().unwrap();
        let expected = (rates[0] - rates[1]).abs() / ((rates[0] + rates[1]) / 2.0);
        assert!((spread - expected).abs() < 1e-9, "{spread} from {rates:?}");
        assert!(l["spread"]["p99"].as_f64().unwrap() >= 0.0);
        let seconds: Vec<u64> = l["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["repeat"].as_u64().unwrap())
            .collect();
        assert!(seconds.contains(&0) && seconds.contains(&1), "both runs over time: {seconds:?}");
    }

    let mut halved = run.clone();
    let halve = |v: &mut Value| {
        let rps = v["requestsPerSecond"].as_f64().unwrap();
        v["requestsPerSecond"] = json!(rps / 2.0);
    };
    for l in halved["levels"].as_array_mut().unwrap() {
        halve(l);
        l["repeats"].as_array_mut().unwrap().iter_mut().for_each(halve);
    }
    // The same figures once a level: no repeats, so no spread, and every difference counts.
    let once = |v: &Value| {
        let mut v = v.clone();
        for l in v["levels"].as_array_mut().unwrap() {
            l.as_object_mut().unwrap().retain(|k, _| k != "repeats" && k != "spread");
        }
        v.to_string()
    };
    let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
    write("same.json", run.to_string());
    write("halved.json", halved.to_string());
    write("once.json", once(&run));
    write("once-halved.json", once(&halved));

    let same = bench_binary(
        dir.path(),
        &["compare", "run.json", "same.json", "--fail-if", "10", "--html", "same.html"],
    );
    let table = String::from_utf8_lossy(&same.stdout);
    assert!(same.status.success(), "{table}\n{}", String::from_utf8_lossy(&same.stderr));
    let lines: Vec<&str> = table.lines().filter(|l| l.starts_with("patch")).collect();
    assert_eq!(lines.len(), 2 * 6, "every figure of both levels: {table}");
    assert!(lines.iter().all(|l| l.ends_with("no change") && l.contains(" 1.000 ")), "{table}");

    let worse = bench_binary(
        dir.path(),
        &["compare", "once.json", "once-halved.json", "--fail-if", "10", "--html", "halved.html"],
    );
    let table = String::from_utf8_lossy(&worse.stdout);
    assert_eq!(worse.status.code(), Some(1), "{table}");
    let req_line = |table: &str, c: &str| -> String {
        let words = ["patch", c, "req/s"];
        let line = table.lines().find(|l| l.split_whitespace().take(3).eq(words));
        line.unwrap_or_else(|| panic!("{table}")).to_owned()
    };
    for c in ["1", "2"] {
        let line = req_line(&table, c);
        assert!(line.contains(" 0.500 ") && line.ends_with("worse"), "{line}");
    }
    assert!(table.contains("spread is unknown"), "{table}");
    let stderr = String::from_utf8_lossy(&worse.stderr);
    assert!(stderr.contains("req/s: B/A 0.500"), "{stderr}");
    assert!(
        table.lines().filter(|l| !l.contains("req/s")).all(|l| !l.ends_with("worse")),
        "only the throughput changed: {table}"
    );
    // Without --fail-if the same comparison reports and passes.
    let report_only = bench_binary(dir.path(), &["compare", "once.json", "once-halved.json"]);
    assert!(report_only.status.success());

    // With two runs a level, halving is a change exactly when the runs spread less than half:
    // a run on a busy machine can spread more, and then it is noise, not a regression.
    let spread = bench_binary(dir.path(), &["compare", "run.json", "halved.json"]);
    let table = String::from_utf8_lossy(&spread.stdout);
    for c in ["1", "2"] {
        let line = req_line(&table, c);
        let band = line.split_whitespace().find(|w| w.ends_with('%')).unwrap();
        let band: f64 = band.trim_end_matches('%').parse().unwrap();
        let verdict = if band < 50.0 { "worse" } else { "no change" };
        assert!(line.contains(" 0.500 ") && line.ends_with(verdict), "{line}");
    }

    let page = std::fs::read_to_string(dir.path().join("halved.html")).unwrap();
    let doc = assert_self_contained(&page);
    let charts = doc.descendants().filter(|n| n.attribute("data-figure") == Some("ratios")).count();
    assert_eq!(charts, 1, "one chart of the ratios per workload");
    assert!(doc.descendants().any(|n| n.attribute("class") == Some("worse")));
    let missing = bench_binary(dir.path(), &["compare", "run.json", "nothing.json"]);
    assert_eq!(missing.status.code(), Some(2), "an unreadable file is not a verdict");
    let mixed =
        bench_binary(dir.path(), &["--concurrency", "4", "compare", "run.json", "run.json"]);
    assert_eq!(mixed.status.code(), Some(2), "a run's flags are refused beside compare");
    let said = String::from_utf8_lossy(&mixed.stderr);
    assert!(said.contains("cannot be used with '--concurrency"), "{said}");
}
