//! Webhooks (X8) through the real server, with receivers on loopback (`--webhook-allow-private`
//! where they must be reached): signed deliveries verified with the Standard Webhooks reference
//! library, order and no gaps through failures, redirects and a SIGKILL, `failing` and
//! `access_lost`, and the address checks without the flag.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

/// What a receiver answers to its `n`th request (from 0): a status, or nothing at all (the
/// connection is held open without an answer).
type Answer = Arc<dyn Fn(usize) -> Option<(u16, Vec<(String, String)>)> + Send + Sync>;

/// One request a receiver took.
#[derive(Clone, Debug)]
struct Received {
    at: Instant,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn seqs(&self) -> Vec<u64> {
        self.json()["data"].as_array().unwrap().iter().map(|c| c["seq"].as_u64().unwrap()).collect()
    }

    fn id(&self) -> &str {
        &self.headers["webhook-id"]
    }
}

/// An HTTP receiver on 127.0.0.1 that records every request, on threads of its own (so it
/// lives on while a server is killed and started again).
#[derive(Clone)]
struct Receiver {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<Received>>>,
    answer: Arc<Mutex<Answer>>,
}

impl Receiver {
    fn start(answer: Answer) -> Receiver {
        Receiver::start_with(answer, None)
    }

    /// A receiver speaking TLS with `tests/data/webhook-tls/receiver.pem` (issued by `ca.pem`
    /// for `localhost` and 127.0.0.1).
    fn start_tls(answer: Answer) -> Receiver {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/webhook-tls");
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(format!("{dir}/receiver.pem"))
                .unwrap()
                .map(Result::unwrap)
                .collect();
        let key = PrivateKeyDer::from_pem_file(format!("{dir}/receiver.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        Receiver::start_with(answer, Some(Arc::new(config)))
    }

    fn start_with(answer: Answer, tls: Option<Arc<rustls::ServerConfig>>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = Receiver {
            addr: listener.local_addr().unwrap(),
            got: Arc::default(),
            answer: Arc::new(Mutex::new(answer)),
        };
        let me = r.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (me, tls) = (me.clone(), tls.clone());
                std::thread::spawn(move || match tls {
                    None => me.serve(stream),
                    Some(config) => {
                        let Ok(conn) = rustls::ServerConnection::new(config) else { return };
                        me.serve(rustls::StreamOwned::new(conn, stream));
                    }
                });
            }
        });
        r
    }

    fn answering(status: u16) -> Receiver {
        Receiver::start(Arc::new(move |_| Some((status, Vec::new()))))
    }

    fn set_answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    fn url(&self) -> String {
        format!("http://{}/hook?from=sheetd", self.addr)
    }

    fn serve(&self, mut stream: impl Read + Write) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        let head_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p;
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let mut lines = head.split("\r\n");
        assert!(lines.next().unwrap().starts_with("POST /hook?from=sheetd HTTP/1.1"), "{head}");
        let headers: BTreeMap<String, String> = lines
            .filter_map(|l| l.split_once(": "))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
            .collect();
        let len: usize = headers["content-length"].parse().unwrap();
        let mut body = buf[head_end + 4..].to_vec();
        while body.len() < len {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        let n = {
            let mut got = self.got.lock().unwrap();
            got.push(Received { at: Instant::now(), headers, body });
            got.len() - 1
        };
        let answer = (self.answer.lock().unwrap())(n);
        match answer {
            Some((status, extra)) => {
                let mut out =
                    format!("HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n");
                for (name, value) in extra {
                    out.push_str(&format!("{name}: {value}\r\n"));
                }
                out.push_str("\r\n");
                let _ = stream.write_all(out.as_bytes());
                let _ = stream.flush();
            }
            None => std::thread::sleep(Duration::from_secs(30)),
        }
    }

    fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Every `seq` acknowledged or not, in arrival order.
    fn all_seqs(&self) -> Vec<u64> {
        self.got().iter().flat_map(Received::seqs).collect()
    }
}

/// Waits up to `secs` for `done`, checking every 50 ms.
async fn wait_for(secs: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "waited {secs} s for {what}");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn add_rows(base: &str, key: &str, sheet: u64, n: usize) -> Value {
    let column = if sheet == 10 { "100" } else { "110" };
    let rows: Vec<Value> = (0..n).map(|i| json!({"cells": {column: format!("row {i}")}})).collect();
    let (status, body, _) = send(
        "POST",
        &format!("{base}/sheets/{sheet}/rows:bulkAdd"),
        Some(key),
        &[],
        Some(json!({"rows": rows}).to_string().into_bytes()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

/// The sheet's feed position now (the `seq` its next change will get).
async fn feed_position(base: &str, key: &str, sheet: u64) -> u64 {
    let mut cursor: Option<String> = None;
    let mut next = 1;
    loop {
        let url = match &cursor {
            Some(c) => format!("{base}/sheets/{sheet}/changes?limit=500&cursor={c}"),
            None => format!("{base}/sheets/{sheet}/changes?limit=500"),
        };
        let (status, page, _) = send("GET", &url, Some(key), &[], None).await;
        assert_eq!(status, 200, "{page}");
        let data = page["data"].as_array().unwrap();
        if let Some(last) = data.last() {
            next = last["seq"].as_u64().unwrap() + 1;
        }
        if data.is_empty() {
            return next;
        }
        cursor = Some(page["nextCursor"].as_str().unwrap().to_owned());
    }
}

async fn create(base: &str, key: &str, body: Value) -> Reply {
    send("POST", &format!("{base}/webhooks"), Some(key), &[], Some(body.to_string().into_bytes()))
        .await
}

/// A Python interpreter with the Standard Webhooks reference library (PyPI `standardwebhooks`),
/// installed into a venv of its own on first use.
fn standard_webhooks_python() -> PathBuf {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let venv = std::env::temp_dir().join("sheetd-test-standardwebhooks-1.1.0");
    let python = venv.join("bin/python");
    let ready = |python: &PathBuf| {
        Command::new(python)
            .args(["-c", "import standardwebhooks"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ready(&python) {
        let made = Command::new("python3").arg("-m").arg("venv").arg(&venv).status();
        assert!(made.is_ok_and(|s| s.success()), "python3 -m venv {} failed", venv.display());
        let installed = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "standardwebhooks==1.1.0"])
            .status();
        assert!(installed.is_ok_and(|s| s.success()), "pip install standardwebhooks failed");
        assert!(ready(&python), "standardwebhooks does not import after its install");
    }
    python
}

/// Runs the reference library's `Webhook(secret).verify(body, headers)` on each message;
/// returns for each whether it verified.
fn verify_with_reference_library(
    messages: &[(String, Vec<u8>, BTreeMap<String, String>)],
) -> Vec<bool> {
    let python = standard_webhooks_python();
    let dir = tempfile::tempdir().unwrap();
    let input: Vec<Value> = messages
        .iter()
        .map(|(secret, body, headers)| {
            json!({"secret": secret, "body": String::from_utf8(body.clone()).unwrap(), "headers": headers})
        })
        .collect();
    let input_path = dir.path().join("messages.json");
    std::fs::write(&input_path, serde_json::to_vec(&input).unwrap()).unwrap();
    let script = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
out = []
for m in json.load(open(sys.argv[1])):
    try:
        Webhook(m["secret"]).verify(m["body"], m["headers"])
        out.append(True)
    except WebhookVerificationError:
        out.append(False)
print(json.dumps(out))
"#;
    let output = Command::new(python).arg("-c").arg(script).arg(&input_path).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

async fn private_server() -> TestServer {
    TestServer::start_with(fixture(), |a| a.webhook_allow_private = true).await
}

#[actix_rt::test]
async fn deliveries_are_signed_in_order_and_verify_with_the_reference_library() {
    let s = private_server().await;
    let receiver = Receiver::answering(204);
    let start = feed_position(&s.base, ADA_WRITE, 10).await;
    let (status, made, headers) = create(
        &s.base,
        ADA_WRITE,
        json!({"sheetId": 10, "url": receiver.url(), "description": "the warehouse"}),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_u64().unwrap();
    let secret = made["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_") && secret.len() == 6 + 44, "{secret}");
    assert_eq!(made["requestId"], headers.get("x-request-id").unwrap().to_str().unwrap());
    for (field, value) in [
        ("sheetId", json!(10)),
        ("url", json!(receiver.url())),
        ("description", json!("the warehouse")),
        ("status", json!("active")),
        ("disabledReason", Value::Null),
        ("pendingChanges", json!(0)),
        ("lastDelivery", Value::Null),
        ("consecutiveFailures", json!(0)),
    ] {
        assert_eq!(made[field], value, "{field} of {made}");
    }

    // 250 changes: three messages (100, 100, 50) or more, never more than 100 each.
    add_rows(&s.base, ADA_WRITE, 10, 150).await;
    add_rows(&s.base, ADA_WRITE, 10, 100).await;
    let end = start + 250;
    wait_for(30, "every change delivered", || receiver.all_seqs().len() >= 250).await;
    let got = receiver.got();
    assert_eq!(receiver.all_seqs(), (start..end).collect::<Vec<_>>(), "in order, no gap, once");
    for m in &got {
        let body = m.json();
        let n = body["data"].as_array().unwrap().len();
        assert!((1..=100).contains(&n), "{n} changes in one message");
        assert_eq!(
            (body["type"].as_str(), body["webhookId"].as_u64()),
            (Some("sheet.changes"), Some(id))
        );
        assert_eq!(body["sheetId"], 10);
        assert_eq!(body["data"][0]["type"], "row.created");
        assert_eq!(m.headers["content-type"], "application/json");
        assert_eq!(m.headers["user-agent"], format!("sheetd/{}", env!("CARGO_PKG_VERSION")));
        assert_eq!(m.id(), format!("msg_{id}_{}", m.seqs()[0]));
        let ts: i64 = m.headers["webhook-timestamp"].parse().unwrap();
        assert!((ts - chrono::Utc::now().timestamp()).abs() < 120, "{ts}");
        // nextCursor continues the feed right after the message.
        let next = body["nextCursor"].as_str().unwrap();
        let (status, page, _) =
            s.get(&format!("/sheets/10/changes?limit=1&cursor={next}"), ADA_WRITE).await;
        assert_eq!(status, 200);
        match page["data"].as_array().unwrap().first() {
            Some(c) => assert_eq!(c["seq"].as_u64(), Some(m.seqs().last().unwrap() + 1)),
            None => assert_eq!(*m.seqs().last().unwrap(), end - 1),
        }
    }

    // The reference library: the right secret verifies, a wrong one or a changed body fails.
    let mut wrong = secret.clone();
    wrong.replace_range(6..10, if &wrong[6..10] == "AAAA" { "BBBB" } else { "AAAA" });
    let mut cases = Vec::new();
    for m in &got {
        cases.push((secret.clone(), m.body.clone(), m.headers.clone()));
    }
    let first = &got[0];
    cases.push((wrong, first.body.clone(), first.headers.clone()));
    let mut changed = first.body.clone();
    let at = changed.len() - 3;
    changed[at] = if changed[at] == b'A' { b'B' } else { b'A' };
    cases.push((secret.clone(), changed, first.headers.clone()));
    let verified = verify_with_reference_library(&cases);
    let n = got.len();
    assert!(verified[..n].iter().all(|v| *v), "every delivery verifies: {verified:?}");
    assert_eq!(&verified[n..], [false, false], "a wrong secret and a changed body fail");

    // The webhook shows its position and last delivery; its secret never again.
    wait_for(10, "the last acknowledgement logged", || {
        s.running().state.try_service().unwrap().webhooks().get(id).unwrap().cursor == end
    })
    .await;
    let (status, shown, _) = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["pendingChanges"], 0);
    assert_eq!(shown["lastDelivery"]["status"], 204);
    assert_eq!(shown["lastDelivery"]["error"], Value::Null);
    assert!(shown.get("secret").is_none(), "{shown}");
    let (status, page, _) = s
        .get(&format!("/sheets/10/changes?cursor={}", shown["cursor"].as_str().unwrap()), ADA_WRITE)
        .await;
    assert_eq!(
        (status, page["data"].as_array().unwrap().len()),
        (200, 0),
        "cursor is after the last delivery"
    );
    let (status, list, _) = s.get("/webhooks", ADA_WRITE).await;
    assert_eq!(status, 200);
    assert_eq!(list["data"].as_array().unwrap().len(), 1);
    assert_eq!(list["data"][0]["id"].as_u64(), Some(id));
    assert!(!list.to_string().contains(&secret[6..]), "the secret never shows again");

    // Another key sees nothing of it.
    assert_error(&s.get(&format!("/webhooks/{id}"), ADA_READ).await, 404, "not_found");
    assert_eq!(s.get("/webhooks", ADA_READ).await.1["data"], json!([]));
    assert_error(
        &s.call("DELETE", &format!("/webhooks/{id}"), Some(BOB_ALL), None).await,
        404,
        "not_found",
    );

    // Metrics count what the delivery thread did.
    assert!(metric(&s.admin, "sheetd_webhook_deliveries_total").await >= 3.0);
    assert_eq!(metric(&s.admin, "sheetd_webhook_changes_delivered_total").await, 250.0);
    assert_eq!(metric(&s.admin, "sheetd_webhook_failures_total").await, 0.0);
    assert_eq!(metric(&s.admin, "sheetd_webhooks{status=\"active\"}").await, 1.0);

    // Deleted: gone, and nothing more is delivered.
    let (status, _, _) = s.call("DELETE", &format!("/webhooks/{id}"), Some(ADA_WRITE), None).await;
    assert_eq!(status, 204);
    assert_error(&s.get(&format!("/webhooks/{id}"), ADA_WRITE).await, 404, "not_found");
    add_rows(&s.base, ADA_WRITE, 10, 5).await;
    actix_rt::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(receiver.all_seqs().len(), 250, "nothing after the delete");
}

#[actix_rt::test]
async fn a_webhook_its_position_and_its_secret_survive_a_restart_from_the_checkpoint() {
    let mut s = private_server().await;
    let receiver = Receiver::answering(200);
    let (_, made, _) =
        create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": receiver.url()})).await;
    let (id, secret) = (made["id"].as_u64().unwrap(), made["secret"].as_str().unwrap().to_owned());
    let start = feed_position(&s.base, ADA_WRITE, 10).await;
    add_rows(&s.base, ADA_WRITE, 10, 4).await;
    wait_for(10, "delivered", || {
        s.running().state.try_service().unwrap().webhooks().get(id).unwrap().cursor == start + 4
    })
    .await;
    let before = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await.1;
    // A graceful stop writes a checkpoint; the start reads the webhook back from it.
    s.restart().await;
    let after = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await.1;
    assert_eq!(without_request_id(after), without_request_id(before));
    add_rows(&s.base, ADA_WRITE, 10, 2).await;
    wait_for(10, "delivered after the restart", || receiver.all_seqs().len() == 6).await;
    assert_eq!(receiver.all_seqs(), (start..start + 6).collect::<Vec<_>>());
    let cases: Vec<_> = receiver
        .got()
        .iter()
        .map(|m| (secret.clone(), m.body.clone(), m.headers.clone()))
        .collect();
    assert!(verify_with_reference_library(&cases).iter().all(|v| *v), "the same secret signs");
}

#[actix_rt::test]
async fn a_failing_receiver_gets_retries_with_backoff_then_everything_in_order() {
    let s = private_server().await;
    // 500 to the first four attempts, then 200.
    let receiver = Receiver::start(Arc::new(|n| Some((if n < 4 { 500 } else { 200 }, Vec::new()))));
    let (status, made, _) =
        create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": receiver.url()})).await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_u64().unwrap();
    let start = feed_position(&s.base, ADA_WRITE, 10).await;
    add_rows(&s.base, ADA_WRITE, 10, 3).await;
    wait_for(5, "the first attempt", || !receiver.got().is_empty()).await;
    // More changes while the first message fails: they wait behind it.
    add_rows(&s.base, ADA_WRITE, 10, 120).await;
    wait_for(30, "every change delivered", || {
        receiver.got().len() > 4 && receiver.all_seqs().last() == Some(&(start + 122))
    })
    .await;
    let got = receiver.got();
    // The first five attempts are the same message: same id, same body.
    for retry in &got[1..5] {
        assert_eq!(retry.id(), got[0].id(), "a retry keeps the message id");
        assert_eq!(retry.body, got[0].body, "a retry carries the same body");
    }
    assert_eq!(got[0].seqs(), (start..start + 3).collect::<Vec<_>>());
    // Backoff: 1 s, 2 s, 4 s, 8 s (each ±20 %): every gap longer than the one before.
    let gaps: Vec<f64> = got[..5].windows(2).map(|w| (w[1].at - w[0].at).as_secs_f64()).collect();
    assert!(gaps[0] >= 0.7 && gaps[0] < 1.6, "{gaps:?}");
    assert!(gaps.windows(2).all(|g| g[1] > g[0] * 1.25), "the wait doubles: {gaps:?}");
    // Then the rest, in order: everything once after the acknowledged message.
    let after: Vec<u64> = got[4..].iter().flat_map(Received::seqs).collect();
    assert_eq!(after, (start..start + 123).collect::<Vec<_>>());
    wait_for(10, "the last acknowledgement logged", || {
        s.running().state.try_service().unwrap().webhooks().get(id).unwrap().cursor == start + 123
    })
    .await;
    let (_, shown, _) = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await;
    assert_eq!(
        (shown["consecutiveFailures"].as_u64(), shown["status"].as_str()),
        (Some(0), Some("active"))
    );
}

#[actix_rt::test]
async fn a_receiver_that_never_answers_is_disabled_as_failing_and_enable_resumes() {
    let s = TestServer::start_with(fixture(), |a| {
        a.webhook_allow_private = true;
        a.webhook_disable_after_secs = 1;
    })
    .await;
    let receiver = Receiver::start(Arc::new(|_| None));
    let (_, made, _) =
        create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": receiver.url()})).await;
    let id = made["id"].as_u64().unwrap();
    let start = feed_position(&s.base, ADA_WRITE, 10).await;
    add_rows(&s.base, ADA_WRITE, 10, 2).await;
    // Attempt 1 times out after 10 s; attempt 2 (1 s later) is past the 1 s period.
    let service = s.running().state.try_service().unwrap().clone();
    wait_for(40, "disabled", || service.webhooks().get(id).unwrap().disabled.is_some()).await;
    let (status, shown, _) = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await;
    assert_eq!(status, 200);
    assert_eq!(
        (shown["status"].as_str(), shown["disabledReason"].as_str()),
        (Some("disabled"), Some("failing"))
    );
    assert_eq!(shown["consecutiveFailures"], 2, "{shown}");
    assert_eq!(shown["lastDelivery"]["status"], Value::Null);
    assert!(
        shown["lastDelivery"]["error"].as_str().unwrap().contains("no answer within 10 s"),
        "{shown}"
    );
    assert!(shown["lastDelivery"]["durationMs"].as_u64().unwrap() >= 9_900);
    assert_eq!(shown["pendingChanges"], 2);
    let attempts = receiver.got().len();
    assert_eq!(attempts, 2);

    // The receiver comes back; enabling resumes where it stopped.
    receiver.set_answer(Arc::new(|_| Some((200, Vec::new()))));
    add_rows(&s.base, ADA_WRITE, 10, 1).await;
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.got().len(), attempts, "a disabled webhook delivers nothing");
    let (status, enabled, _) =
        s.post(&format!("/webhooks/{id}:enable"), ADA_WRITE, &json!({})).await;
    assert_eq!(status, 200, "{enabled}");
    assert_eq!(
        (enabled["status"].as_str(), enabled["consecutiveFailures"].as_u64()),
        (Some("active"), Some(0))
    );
    wait_for(20, "the rest delivered", || receiver.all_seqs().last() == Some(&(start + 2))).await;
    let got = receiver.got();
    assert_eq!(got[2].id(), got[0].id(), "the message in flight is sent again under its id");
    assert_eq!(got[2].body, got[0].body);
    let seqs: Vec<u64> = got[2..].iter().flat_map(Received::seqs).collect();
    assert_eq!(seqs, (start..start + 3).collect::<Vec<_>>());
}

#[actix_rt::test]
async fn a_key_that_loses_the_sheet_or_is_revoked_disables_its_webhook_as_access_lost() {
    let s = private_server().await;
    let service = s.running().state.try_service().unwrap().clone();
    // Bob reads sheet 10 through a share of folder 5.
    let bob_receiver = Receiver::answering(200);
    let (status, bobs, _) =
        create(&s.base, BOB_ALL, json!({"sheetId": 10, "url": bob_receiver.url()})).await;
    assert_eq!(status, 201, "{bobs}");
    let bobs = bobs["id"].as_u64().unwrap();
    // ada-read reads sheet 11 through its project grant.
    let ada_receiver = Receiver::answering(200);
    let (status, adas, _) =
        create(&s.base, ADA_READ, json!({"sheetId": 11, "url": ada_receiver.url()})).await;
    assert_eq!(status, 201, "{adas}");
    let adas = adas["id"].as_u64().unwrap();
    add_rows(&s.base, ADA_WRITE, 10, 1).await;
    add_rows(&s.base, ADA_SHEET11, 11, 1).await;
    wait_for(10, "first deliveries", || {
        bob_receiver.got().len() == 1 && ada_receiver.got().len() == 1
    })
    .await;

    // Bob's share goes; ada-read is revoked.
    let share = json!({"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "none"});
    assert_eq!(s.admin_call("PUT", "/shares", Some(&share)).await.0, 200);
    assert_eq!(s.admin_call("POST", "/keys/2/revoke", None).await.0, 200);
    add_rows(&s.base, ADA_WRITE, 10, 3).await;
    add_rows(&s.base, ADA_SHEET11, 11, 3).await;
    wait_for(15, "both disabled", || {
        [bobs, adas].iter().all(|id| service.webhooks().get(*id).unwrap().disabled.is_some())
    })
    .await;
    for id in [bobs, adas] {
        let reason = service.webhooks().get(id).unwrap().disabled.unwrap();
        assert_eq!(reason, actors::webhook::DisabledReason::AccessLost);
    }
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        (bob_receiver.got().len(), ada_receiver.got().len()),
        (1, 1),
        "nothing more delivered"
    );

    // Bob's key still sees, and may enable, its webhook (which stops again at once); the
    // revoked key can do nothing.
    let (status, shown, _) = s.get(&format!("/webhooks/{bobs}"), BOB_ALL).await;
    assert_eq!(status, 200);
    assert_eq!(
        (shown["status"].as_str(), shown["disabledReason"].as_str()),
        (Some("disabled"), Some("access_lost"))
    );
    assert_eq!(shown["pendingChanges"], 3);
    let (status, _, _) = s.post(&format!("/webhooks/{bobs}:enable"), BOB_ALL, &json!({})).await;
    assert_eq!(status, 200);
    wait_for(10, "disabled again", || service.webhooks().get(bobs).unwrap().disabled.is_some())
        .await;
    assert_eq!(bob_receiver.got().len(), 1);
    assert_error(&s.get(&format!("/webhooks/{adas}"), ADA_READ).await, 401, "unauthorized");
    // A new webhook on a sheet the key cannot read: 404.
    let (status, _, _) =
        create(&s.base, BOB_ALL, json!({"sheetId": 10, "url": bob_receiver.url()})).await;
    assert_eq!(status, 404);
}

#[actix_rt::test]
async fn https_receivers_are_verified_against_the_trusted_roots() {
    let ca = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/webhook-tls/ca.pem");
    let s = TestServer::start_with(fixture(), |a| {
        a.webhook_allow_private = true;
        a.webhook_ca_file = Some(ca.into());
    })
    .await;
    let receiver = Receiver::start_tls(Arc::new(|_| Some((200, Vec::new()))));
    let by_name = format!("https://localhost:{}/hook?from=sheetd", receiver.addr.port());
    let by_ip = format!("https://127.0.0.1:{}/hook?from=sheetd", receiver.addr.port());
    for url in [&by_name, &by_ip] {
        let (status, made, _) =
            create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": url})).await;
        assert_eq!(status, 201, "{made}");
    }
    let start = feed_position(&s.base, ADA_WRITE, 10).await;
    add_rows(&s.base, ADA_WRITE, 10, 3).await;
    wait_for(10, "both delivered over TLS", || receiver.all_seqs().len() == 6).await;
    assert_eq!(receiver.all_seqs(), [start, start + 1, start + 2, start, start + 1, start + 2]);

    // Without the CA the same receiver is not trusted: the attempt fails, nothing arrives.
    let s = TestServer::start_with(fixture(), |a| a.webhook_allow_private = true).await;
    let untrusted = Receiver::start_tls(Arc::new(|_| Some((200, Vec::new()))));
    let url = format!("https://localhost:{}/hook?from=sheetd", untrusted.addr.port());
    let (_, made, _) = create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": url})).await;
    let id = made["id"].as_u64().unwrap();
    add_rows(&s.base, ADA_WRITE, 10, 1).await;
    let service = s.running().state.try_service().unwrap().clone();
    wait_for(10, "a failed attempt", || {
        service.webhooks().get(id).unwrap().consecutive_failures >= 1
    })
    .await;
    let (_, shown, _) = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await;
    let error = shown["lastDelivery"]["error"].as_str().unwrap();
    assert!(error.contains("TLS handshake failed"), "{error}");
    assert!(untrusted.got().is_empty());
}

#[actix_rt::test]
async fn a_redirect_is_a_failure_and_is_not_followed() {
    let s = private_server().await;
    let target = Receiver::answering(200);
    let location = target.url();
    let redirecting = Receiver::start(Arc::new(move |_| {
        Some((307, vec![("Location".into(), location.clone())]))
    }));
    let (_, made, _) =
        create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": redirecting.url()})).await;
    let id = made["id"].as_u64().unwrap();
    add_rows(&s.base, ADA_WRITE, 10, 1).await;
    let service = s.running().state.try_service().unwrap().clone();
    wait_for(10, "a failed attempt logged", || {
        service.webhooks().get(id).unwrap().consecutive_failures >= 1
    })
    .await;
    let (_, shown, _) = s.get(&format!("/webhooks/{id}"), ADA_WRITE).await;
    assert_eq!(shown["lastDelivery"]["status"], 307);
    assert!(shown["lastDelivery"]["error"].as_str().unwrap().contains("307"), "{shown}");
    assert_eq!(shown["pendingChanges"], 1);
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    assert!(target.got().is_empty(), "the redirect's target never hears from the server");
}

#[actix_rt::test]
async fn inward_addresses_bad_urls_and_too_many_webhooks_are_refused() {
    let s = TestServer::start().await;
    let refused = |reply: &Reply, loc: Value, url: &str| {
        assert_error(reply, 422, "validation_failed");
        assert_eq!(reply.1["detail"][0]["loc"], loc, "{url}: {}", reply.1);
    };
    let long = format!("https://example.com/{}", "a".repeat(2048));
    for url in [
        "http://127.0.0.1/hook",
        "http://localhost:8080/hook",
        "http://10.0.0.1/",
        "http://172.16.5.4/",
        "http://192.168.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://0.0.0.0/",
        "http://[::1]/",
        "http://[::]/",
        "http://[fe80::1]/",
        "http://[fc00::1]/",
        "http://[fd00::abcd]/",
        "http://[ff02::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://0x7f.1/",
        "ftp://example.com/",
        "https://user:secret@example.com/",
        "not a url",
        long.as_str(),
    ] {
        let reply = create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": url})).await;
        refused(&reply, json!(["body", "url"]), url);
    }
    // Other refusals: a sheet out of reach, a foreign cursor, a wrong type.
    assert_eq!(
        create(&s.base, ADA_WRITE, json!({"sheetId": 20, "url": "http://93.184.216.34/"})).await.0,
        404
    );
    let reply = create(
        &s.base,
        ADA_WRITE,
        json!({"sheetId": 10, "url": "http://93.184.216.34/", "from": "abc"}),
    )
    .await;
    refused(&reply, json!(["body", "from"]), "from");
    let reply =
        create(&s.base, ADA_WRITE, json!({"sheetId": "ten", "url": "http://93.184.216.34/"})).await;
    refused(&reply, json!(["body", "sheetId"]), "sheetId");

    // 50 per key; the 51st is refused at the body.
    for i in 0..50 {
        let (status, body, _) = create(
            &s.base,
            ADA_WRITE,
            json!({"sheetId": 10, "url": format!("http://93.184.216.34/{i}")}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    let reply =
        create(&s.base, ADA_WRITE, json!({"sheetId": 10, "url": "http://93.184.216.34/51"})).await;
    refused(&reply, json!(["body"]), "the 51st");
    assert_eq!(
        create(&s.base, ADA_READ, json!({"sheetId": 10, "url": "http://93.184.216.34/"})).await.0,
        201,
        "another key has its own 50"
    );
    // Paged like every list, by id.
    let (_, first, _) = s.get("/webhooks?limit=30", ADA_WRITE).await;
    assert_eq!(first["data"].as_array().unwrap().len(), 30);
    let cursor = first["nextCursor"].as_str().unwrap();
    let (_, second, _) = s.get(&format!("/webhooks?limit=30&cursor={cursor}"), ADA_WRITE).await;
    assert_eq!(second["data"].as_array().unwrap().len(), 20);
    assert_eq!(second["nextCursor"], Value::Null);
    let reply = s.get(&format!("/webhooks?cursor={cursor}"), ADA_READ).await;
    refused(&reply, json!(["query", "cursor"]), "another key's cursor");
}

/// SIGKILL under a steady write load with three webhooks: after the restart each receiver has
/// the feed exactly, every `seq` once except those of a message sent again under its id.
#[actix_rt::test]
async fn after_a_sigkill_under_load_every_receiver_has_the_feed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let data = dir.path().join("data");
    let flags = ["--seed", seed.to_str().unwrap(), "--webhook-allow-private"];
    let mut server = Binary::start(&data, &flags).await;
    // Receivers that are slow now and then (5 ms), so messages are in flight at the kill.
    let receivers: Vec<Receiver> = (0..3)
        .map(|i| {
            Receiver::start(Arc::new(move |n| {
                if (n + i) % 7 == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some((200, Vec::new()))
            }))
        })
        .collect();
    let start = feed_position(&server.base, ADA_WRITE, 10).await;
    for r in &receivers {
        let (status, made, _) =
            create(&server.base, ADA_WRITE, json!({"sheetId": 10, "url": r.url()})).await;
        assert_eq!(status, 201, "{made}");
    }
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (base, written) = (server.base.clone(), Arc::clone(&written));
        actix_rt::spawn(async move {
            // Small writes of 1 to 5 rows, as fast as they are acknowledged, until the kill.
            for i in 0.. {
                let n = 1 + i % 5;
                let rows: Vec<Value> = (0..n).map(|_| json!({"cells": {"100": "load"}})).collect();
                let client = awc::Client::builder().timeout(Duration::from_secs(5)).finish();
                let sent = client
                    .post(format!("{base}/sheets/10/rows:bulkAdd"))
                    .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
                    .send_json(&json!({"rows": rows}))
                    .await;
                match sent {
                    Ok(res) if res.status() == 200 => {
                        written.fetch_add(n as u64, std::sync::atomic::Ordering::SeqCst);
                    }
                    _ => break,
                }
            }
        })
    };
    wait_for(30, "deliveries under way", || receivers.iter().all(|r| r.all_seqs().len() >= 300))
        .await;
    server.kill9();
    let _ = writer.await;
    let server = Binary::start(&data, &["--webhook-allow-private"]).await;
    add_rows(&server.base, ADA_WRITE, 10, 7).await;
    let end = feed_position(&server.base, ADA_WRITE, 10).await;
    assert!(
        end - start >= written.load(std::sync::atomic::Ordering::SeqCst) + 7,
        "every acknowledged write is in the feed"
    );
    for (i, r) in receivers.iter().enumerate() {
        wait_for(60, "the whole feed delivered", || r.all_seqs().last() == Some(&(end - 1))).await;
        let got = r.got();
        // Each seq came in messages of one id only; a repeated id carries the same body.
        let mut ids_of: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        let mut body_of: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for m in &got {
            for seq in m.seqs() {
                ids_of.entry(seq).or_default().insert(m.id().to_owned());
            }
            let first = body_of.entry(m.id().to_owned()).or_insert_with(|| m.body.clone());
            assert_eq!(*first, m.body, "receiver {i}: message {} came with another body", m.id());
        }
        assert_eq!(
            ids_of.keys().copied().collect::<Vec<_>>(),
            (start..end).collect::<Vec<_>>(),
            "receiver {i}: the feed exactly"
        );
        for (seq, ids) in &ids_of {
            assert_eq!(ids.len(), 1, "receiver {i}: seq {seq} came under several ids {ids:?}");
        }
        // In order: no message starts after a change not yet sent (a gap); one may start
        // earlier only to repeat a message (the ids above say it is the same one).
        let mut seen_up_to = start;
        for m in &got {
            let seqs = m.seqs();
            assert!(seqs[0] <= seen_up_to, "receiver {i}: a gap before {}", seqs[0]);
            seen_up_to = seen_up_to.max(*seqs.last().unwrap() + 1);
        }
    }
}

#[actix_rt::test]
async fn webhooks_behind_a_busy_sheet_are_paced_and_catch_up_once_the_load_ends() {
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    // 1 % of a core while requests are served: ten webhooks following a steady write load
    // need more than that, so they wait for their budget and fall behind.
    let flags =
        ["--seed", seed.to_str().unwrap(), "--webhook-allow-private", "--webhook-cpu-percent", "1"];
    let server = Binary::start(&dir.path().join("data"), &flags).await;
    let receivers: Vec<Receiver> = (0..10).map(|_| Receiver::answering(204)).collect();
    let start = feed_position(&server.base, ADA_WRITE, 10).await;
    for r in &receivers {
        let (status, made, _) =
            create(&server.base, ADA_WRITE, json!({"sheetId": 10, "url": r.url()})).await;
        assert_eq!(status, 201, "{made}");
    }
    let until = Instant::now() + Duration::from_secs(3);
    let writers: Vec<_> = (0..4)
        .map(|_| {
            let base = server.base.clone();
            actix_rt::spawn(async move {
                while Instant::now() < until {
                    add_rows(&base, ADA_WRITE, 10, 2).await;
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let paced = metric(&server.admin, "sheetd_webhook_paced_seconds_total").await;
    assert!(paced > 0.0, "deliveries never waited for their budget under the load");
    // The load is over: unpaced, every receiver gets the whole feed, in order, once each.
    let end = feed_position(&server.base, ADA_WRITE, 10).await;
    for (i, r) in receivers.iter().enumerate() {
        wait_for(60, "the whole feed delivered", || r.all_seqs().last() == Some(&(end - 1))).await;
        assert_eq!(
            r.all_seqs(),
            (start..end).collect::<Vec<_>>(),
            "receiver {i}: the feed exactly"
        );
    }
}
