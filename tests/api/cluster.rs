//! A cluster of real `sheetd serve` processes on 127.0.0.1, .2 and .3 (docs/spec/cluster.md):
//! the leader killed with SIGKILL again and again under writers that retry on another node, and
//! after the load every acknowledged write present once, on a state every node agrees on.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::backup;
use crate::common::{fixture, list_all, send, ADA_READ, ADA_WRITE, ADMIN_TOKEN};

/// A port free on `ip` now, below the range the OS picks outgoing ports from: a node restarted
/// on its port must not find it taken by some client's connection meanwhile (one cluster test
/// runs at a time, and every other test binds port 0).
fn free_port(ip: &str) -> u16 {
    use rand::Rng;
    loop {
        let port = rand::thread_rng().gen_range(20_000..32_000);
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return port;
        }
    }
}

/// One node of the cluster: its addresses stay the same across restarts.
struct Node {
    id: u64,
    api: String,
    admin: String,
    child: Option<Child>,
    log: PathBuf,
    flags: Vec<String>,
}

impl Node {
    fn new(dir: &Path, id: u64, raft: String, initial: &str, secret: &Path, seed: &Path) -> Node {
        let ip = format!("127.0.0.{id}");
        let api = format!("{ip}:{}", free_port(&ip));
        let admin = format!("{ip}:{}", free_port(&ip));
        let data = dir.join(format!("node{id}"));
        let flags = vec![
            "serve".into(),
            "--addr".into(),
            api.clone(),
            "--admin-addr".into(),
            admin.clone(),
            "--data-dir".into(),
            data.display().to_string(),
            "--admin-token".into(),
            ADMIN_TOKEN.into(),
            "--rate-limit-per-minute".into(),
            "10000000".into(),
            "--seed".into(),
            seed.display().to_string(),
            "--node-id".into(),
            id.to_string(),
            "--raft-addr".into(),
            raft,
            "--initial-cluster".into(),
            initial.into(),
            "--cluster-secret-file".into(),
            secret.display().to_string(),
        ];
        let log = dir.join(format!("node{id}.log"));
        Node { id, api, admin, child: None, log, flags }
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_sheetd"))
            .args(&self.flags)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("sheetd starts");
        self.child = Some(child);
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    fn base(&self) -> String {
        format!("http://{}/api/v1", self.api)
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://{}/admin/v1{path}", self.admin)
    }

    /// `GET /admin/v1/cluster`, when the node answers.
    async fn cluster(&self) -> Option<Value> {
        admin_get(&self.admin_url("/cluster")).await
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn admin_get(url: &str) -> Option<Value> {
    let client = awc::Client::builder().timeout(Duration::from_secs(2)).finish();
    let mut res = client
        .get(url)
        .insert_header(("Authorization", format!("Bearer {ADMIN_TOKEN}")))
        .send()
        .await
        .ok()?;
    if res.status() != 200 {
        return None;
    }
    serde_json::from_slice(&res.body().await.ok()?).ok()
}

/// A request that may meet a node that is down: `None` when nothing came back.
async fn attempt(method: &str, url: &str, idem: &str, body: &Value) -> Option<(u16, Value)> {
    let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    let mut res = client
        .request(method.parse().unwrap(), url)
        .insert_header(("Authorization", format!("Bearer {ADA_WRITE}")))
        .insert_header(("Idempotency-Key", idem))
        .insert_header(("Content-Type", "application/json"))
        .send_body(body.to_string())
        .await
        .ok()?;
    let bytes = res.body().await.ok()?;
    Some((res.status().as_u16(), serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}

/// Sends one write until some node acknowledges it, moving to the next node after a 503 or no
/// answer, always with the same `Idempotency-Key`; returns the acknowledged answer.
async fn until_acknowledged(
    apis: &[String],
    start: usize,
    method: &str,
    path: &str,
    idem: &str,
    body: &Value,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut at = start;
    loop {
        assert!(Instant::now() < deadline, "{method} {path} ({idem}) never acknowledged");
        let url = format!("http://{}/api/v1{path}", apis[at % apis.len()]);
        match attempt(method, &url, idem, body).await {
            Some((503, _)) | None => {
                at += 1;
                actix_rt::time::sleep(Duration::from_millis(20)).await;
            }
            // In flight on a node that lost its leadership: ask again later.
            Some((409, reply)) if reply["errorCode"] == "idempotency_in_progress" => {
                actix_rt::time::sleep(Duration::from_millis(50)).await;
            }
            Some(answer) => return answer,
        }
    }
}

/// The node whose `GET /admin/v1/cluster` names itself leader, and serves.
async fn leader(nodes: &[Node]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes.iter().map(tail_of_log).collect();
            panic!("no leader within 30 s\n{}", logs.join("\n"));
        }
        for (i, node) in nodes.iter().enumerate() {
            if node.child.is_none() {
                continue;
            }
            let health = admin_get(&node.admin_url("/health")).await;
            if health.is_some_and(|h| h["cluster"]["serving"] == true) {
                return i;
            }
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `sheetd backup` of the leader `node` into `file`, which must succeed.
async fn backup_of(node: &Node, file: &Path) -> std::process::Output {
    let url = format!("http://{}", node.admin);
    let out = backup::sheetd(backup::args(&[
        "backup",
        "--admin-url",
        &url,
        "--admin-token",
        ADMIN_TOKEN,
        "--out",
        backup::path(file),
    ]))
    .await;
    assert!(out.status.success(), "{}", backup::stderr(&out));
    out
}

/// `sheetd restore` of the backup `file` into `target` with `extra` flags, then `sheetd check`
/// of it: the restored state's digest. Both must succeed.
async fn restored_digest(file: &Path, target: &Path, extra: &[&str]) -> String {
    let mut restore =
        vec!["restore", "--from", backup::path(file), "--data-dir", backup::path(target)];
    restore.extend_from_slice(extra);
    let out = backup::sheetd(backup::args(&restore)).await;
    assert!(out.status.success(), "{}", backup::stderr(&out));
    let out = backup::sheetd(backup::args(&["check", "--data-dir", backup::path(target)])).await;
    assert!(out.status.success(), "{}", backup::stderr(&out));
    backup::field(&out, "digest: ")
}

/// Waits until every node answers the same digest; returns it.
async fn converged(nodes: &[Node]) -> (u64, String) {
    // A restarted node replays its whole log (no snapshots yet), slowly in a debug build on
    // a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut answers = Vec::new();
        for node in nodes {
            answers.push(admin_get(&node.admin_url("/cluster/digest")).await);
        }
        let digests: Vec<Option<&str>> =
            answers.iter().map(|a| a.as_ref().and_then(|a| a["digest"].as_str())).collect();
        if digests.iter().all(|d| d.is_some() && *d == digests[0]) {
            let index = answers.iter().filter_map(|a| a.as_ref()?["appliedIndex"].as_u64()).min();
            return (index.unwrap(), digests[0].unwrap().to_owned());
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes.iter().map(tail_of_log).collect();
            panic!("the nodes did not converge: {answers:?}\n{}", logs.join("\n"));
        }
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The last lines of a node's log, for a failure's message.
fn tail_of_log(node: &Node) -> String {
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().filter(|l| !l.contains("sheetd::middleware")).collect();
    let tail = lines[lines.len().saturating_sub(25)..].join("\n");
    format!("--- node {} ---\n{tail}", node.id)
}

/// One cluster test at a time: three more processes per test on two cores would starve each
/// other's heartbeats into elections that no test is about.
static ONE_CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until a node serves and every node names it leader; returns its position.
async fn agreed_leader(nodes: &[Node]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let at = leader(nodes).await;
        let mut agree = true;
        for node in nodes {
            let status = node.cluster().await;
            agree &= status.is_some_and(|s| s["leaderId"] == nodes[at].id);
        }
        if agree {
            return at;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes.iter().map(tail_of_log).collect();
            panic!("the nodes did not agree on a leader within 30 s\n{}", logs.join("\n"));
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Three nodes on `dir`, started, with a leader serving.
async fn three(dir: &Path) -> Vec<Node> {
    three_with(dir, |_| Vec::new()).await
}

/// [`three`], node `id` started with the serve flags `extra(id)` too.
async fn three_with(dir: &Path, extra: impl Fn(u64) -> Vec<String>) -> Vec<Node> {
    let mut nodes = three_unstarted(dir, extra);
    for node in &mut nodes {
        node.start();
    }
    leader(&nodes).await;
    nodes
}

/// The three nodes of [`three_with`], not started.
fn three_unstarted(dir: &Path, extra: impl Fn(u64) -> Vec<String>) -> Vec<Node> {
    let seed = dir.join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "a cluster secret for the tests, 48 bytes long...\n").unwrap();
    let rafts: Vec<String> =
        (1..=3).map(|id| format!("127.0.0.{id}:{}", free_port(&format!("127.0.0.{id}")))).collect();
    let initial =
        rafts.iter().enumerate().map(|(i, r)| format!("{}={r}", i + 1)).collect::<Vec<_>>();
    let initial = initial.join(",");
    (1..=3)
        .map(|id| {
            let mut node =
                Node::new(dir, id, rafts[id as usize - 1].clone(), &initial, &secret, &seed);
            node.flags.extend(extra(id));
            node
        })
        .collect()
}

/// The first listed voter starts a new cluster at once and the others give it a grace to reach
/// them (so their elections do not unseat its leader); started without it, the other two
/// still form the cluster, seed it once, and the first joins it when it comes.
#[actix_rt::test]
async fn two_listed_voters_start_the_cluster_without_the_first_which_joins_later() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three_unstarted(dir.path(), |_| Vec::new());
    nodes[1].start();
    nodes[2].start();
    let at = leader(&nodes[1..]).await + 1;
    let rows = list_all(&nodes[at].base(), ADA_READ, 10).await;
    assert_eq!(rows.len(), 4, "seeded once: {rows:?}");
    nodes[0].start();
    converged(&nodes).await;
    let status = nodes[0].cluster().await.unwrap();
    assert_eq!(status["leaderId"], nodes[agreed_leader(&nodes).await].id, "{status}");
    let rows = list_all(&nodes[0].base(), ADA_READ, 10).await;
    assert_eq!(rows.len(), 4, "the first node serves what the others formed: {rows:?}");
}

#[actix_rt::test]
async fn three_nodes_elect_one_leader_seed_once_and_every_node_serves_the_api() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path()).await;
    let at = agreed_leader(&nodes).await;
    let status = nodes[at].cluster().await.unwrap();
    assert_eq!(status["leaderId"], nodes[at].id);
    // The first listed voter starts the cluster; the others wait for it rather than run
    // elections of their own that would unseat it.
    assert_eq!(nodes[at].id, 1, "{status}");
    assert_eq!(status["nodes"].as_array().unwrap().len(), 3);
    // The fixture was imported once, on the leader, and every node applied it.
    let rows = list_all(&nodes[at].base(), ADA_READ, 10).await;
    assert_eq!(rows.len(), 4, "{rows:?}");
    converged(&nodes).await;
    // Listed by raft address alone, each voter tells the leader its API address, and every
    // node's view comes to show all three.
    let want: HashMap<u64, String> = nodes.iter().map(|n| (n.id, n.api.clone())).collect();
    for node in &nodes {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let view = node.cluster().await.unwrap();
            let shown: HashMap<u64, String> = view["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| (n["id"].as_u64().unwrap(), n["apiAddr"].as_str().unwrap().to_owned()))
                .collect();
            if shown == want {
                break;
            }
            assert!(Instant::now() < deadline, "node {}: {view}", node.id);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    for (i, node) in nodes.iter().enumerate() {
        // A follower sends the request on to the leader and relays its answer.
        let url = format!("{}/sheets/10/rows", node.base());
        let (status, body, headers) = send("GET", &url, Some(ADA_READ), &[], None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["data"].as_array().unwrap().len(), 4 + i, "the writes so far");
        assert_eq!(headers.get("sheetd-node").unwrap().to_str().unwrap(), node.id.to_string());
        let served_by = headers.get("sheetd-served-by").map(|v| v.to_str().unwrap().to_owned());
        if i == at {
            assert_eq!(served_by, None);
        } else {
            assert_eq!(served_by, Some(nodes[at].id.to_string()));
        }
        // A write through any node, and its error answers too, are the leader's.
        let add = json!({"rows": [{"cells": {"100": format!("through node {}", node.id)}}]});
        let url = format!("{}/sheets/10/rows:bulkAdd", node.base());
        let (status, body, _) =
            send("POST", &url, Some(ADA_WRITE), &[], Some(add.to_string().into_bytes())).await;
        assert_eq!(status, 200, "{body}");
        let (status, body, _) =
            send("GET", &url.replace("/10/", "/999/"), Some(ADA_READ), &[], None).await;
        assert!(status == 404 || status == 405, "{status} {body}");
        assert!(body["requestId"].as_str().unwrap().starts_with("req_"));
        // A request forwarded once is never forwarded again: a follower answers it 503.
        if i != at {
            let url = format!("{}/sheets/10/rows", node.base());
            let hop = [("Sheetd-Forwarded-From", "7")];
            let (status, body, headers) = send("GET", &url, Some(ADA_READ), &hop, None).await;
            assert_eq!(status, 503, "{body}");
            assert_eq!(body["errorCode"], "cluster_unavailable");
            assert_eq!(body["detail"]["outcome"], "not_applied");
            assert_eq!(body["detail"]["leaderId"], nodes[at].id);
            assert_eq!(headers.get("retry-after").unwrap(), "1");
        }
        // Cluster status answers on every node, leader or not; so do health and metrics.
        let status = node.cluster().await.unwrap();
        assert_eq!(status["nodeId"], node.id);
        assert_eq!(status["leaderId"], nodes[at].id);
        let health = admin_get(&node.admin_url("/health")).await.unwrap();
        assert_eq!(health["status"], "ok");
        assert_eq!(health["cluster"]["leaderId"], nodes[at].id);
        assert_eq!(health["cluster"]["role"], if i == at { "leader" } else { "follower" });
        let (_, text, _) =
            send("GET", &node.admin_url("/metrics"), Some(ADMIN_TOKEN), &[], None).await;
        let text = text.as_str().unwrap();
        let leading = format!("sheetd_cluster_is_leader {}", u8::from(i == at));
        assert!(text.lines().any(|l| l == leading), "{text}");
        assert!(text.lines().any(|l| l.starts_with("sheetd_cluster_term ")), "{text}");
        let sample = |name: &str| -> Option<f64> {
            text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        };
        assert!(sample("sheetd_cluster_leader_changes_total").unwrap() >= 1.0, "{text}");
        if i == at {
            // The leader knows each follower's lag.
            for follower in nodes.iter().filter(|n| n.id != node.id) {
                let lag =
                    format!("sheetd_cluster_replication_lag_entries{{peer=\"{}\"}}", follower.id);
                assert!(sample(&lag).is_some(), "{text}");
            }
        } else {
            // This follower forwarded the requests above to the leader.
            assert!(sample("sheetd_cluster_forwarded_requests_total").unwrap() >= 2.0, "{text}");
        }
    }
    let rows = list_all(&nodes[at].base(), ADA_READ, 10).await;
    assert_eq!(rows.len(), 7, "one write through each node");

    // A write under an Idempotency-Key, sent again to each other node: replayed byte for byte
    // with the original X-Request-Id, applied once.
    let add = json!({"rows": [{"cells": {"100": "once, wherever it is retried"}}]}).to_string();
    let key = [("Idempotency-Key", "cluster-replay-1")];
    let first = |n: &Node| format!("{}/sheets/10/rows:bulkAdd", n.base());
    let (status, body, headers) =
        send("POST", &first(&nodes[0]), Some(ADA_WRITE), &key, Some(add.clone().into_bytes()))
            .await;
    assert_eq!(status, 200, "{body}");
    let request_id = headers.get("x-request-id").unwrap().to_str().unwrap().to_owned();
    for node in &nodes[1..] {
        let (again, replay, replay_headers) =
            send("POST", &first(node), Some(ADA_WRITE), &key, Some(add.clone().into_bytes())).await;
        assert_eq!((again, &replay), (200, &body), "node {}", node.id);
        assert_eq!(replay_headers.get("x-request-id").unwrap().to_str().unwrap(), request_id);
        assert_eq!(replay_headers.get("idempotent-replayed").unwrap(), "true");
    }
    assert_eq!(list_all(&nodes[at].base(), ADA_READ, 10).await.len(), 8);
    converged(&nodes).await;

    // The admin API on a follower: what needs the domain is the leader's, forwarded there.
    let follower = &nodes[(at + 1) % 3];
    let grants = json!([{"verb": "read", "scopeType": "project", "scopeId": 1}]);
    let key = json!({"ownerId": 1, "name": "made through a follower", "grants": grants});
    let (status, created, headers) = send(
        "POST",
        &follower.admin_url("/keys"),
        Some(ADMIN_TOKEN),
        &[],
        Some(key.to_string().into_bytes()),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(
        headers.get("sheetd-served-by").unwrap().to_str().unwrap(),
        nodes[at].id.to_string()
    );
    let secret = created["secret"].as_str().unwrap().to_owned();
    let url = format!("{}/sheets/10/rows", follower.base());
    let (status, body, _) = send("GET", &url, Some(&secret), &[], None).await;
    assert_eq!(status, 200, "the key works at once, through any node: {body}");
    for node in &nodes {
        let listed = admin_get(&node.admin_url("/keys")).await.unwrap();
        let names: Vec<&str> =
            listed["data"].as_array().unwrap().iter().filter_map(|k| k["name"].as_str()).collect();
        assert!(names.contains(&"made through a follower"), "node {}: {listed}", node.id);
    }
    // A bad admin token is refused by whichever node decides, never forwarded into a 2xx.
    let (status, body, _) =
        send("GET", &follower.admin_url("/keys"), Some("adm_wrong"), &[], None).await;
    assert_eq!(status, 401, "{body}");
    // A backup is the leader's to stream: a follower names it instead.
    let (status, body, _) =
        send("GET", &follower.admin_url("/backup"), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["errorCode"], "cluster_unavailable");
    assert_eq!(body["detail"]["reason"], "not_leader");
    assert_eq!(body["detail"]["leaderId"], nodes[at].id);
    // The leader's backup holds the state every node agrees on, and restores into a single
    // node with the same digest.
    let file = dir.path().join("cluster.backup");
    let mut digest = None;
    // The leader's housekeeping may write between the digests: then the state moved, and the
    // backup is taken again.
    for _ in 0..5 {
        let (_, before) = converged(&nodes).await;
        let out = backup_of(&nodes[at], &file).await;
        let (_, after) = converged(&nodes).await;
        if before == after {
            assert_eq!(backup::field(&out, "digest: "), before, "the cluster's state");
            digest = Some(before);
            break;
        }
    }
    let digest = digest.expect("the state held still for one backup in five");
    let restored = restored_digest(&file, &dir.path().join("restored"), &[]).await;
    assert_eq!(restored, digest, "restored as it was taken");

    // SIGTERM stops the leader for good: its leadership ends with its shutdown, which must not
    // make it start itself again as a follower.
    let mut leader = nodes.swap_remove(at);
    let mut child = leader.child.take().unwrap();
    // What it logged before: an election at start (every node of a new cluster stands at once)
    // may have unseated it once already, which is not what this checks.
    let logged_before = std::fs::read_to_string(&leader.log).unwrap().len();
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the leader did not stop: {}", tail_of_log(&leader));
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    assert!(admin_get(&leader.admin_url("/health")).await.is_none(), "nothing answers there");
    let log = std::fs::read_to_string(&leader.log).unwrap();
    assert!(!log[logged_before..].contains("restarting as a follower"), "{}", tail_of_log(&leader));
    leader.child = None;
}

/// The log archive on cluster nodes (`--archive-dir`, docs/backups.md): every node archives
/// its committed log, a follower too, and a killed leader goes on where it stopped once it is
/// back; the leader's backup, restored with any node's archive, rolls forward through a
/// leader change to the state every node agrees on.
#[actix_rt::test]
async fn any_nodes_archive_rolls_the_leaders_backup_forward_past_a_leader_change() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let archive = |id: u64| dir.path().join(format!("archive{id}"));
    // A snapshot every 4 entries, so the log is purged behind the archive as it goes.
    let mut nodes = three_with(dir.path(), |id| {
        let archive = archive(id).display().to_string();
        let flags = ["--archive-dir", &archive, "--archive-seal-ms", "300"];
        let mut flags: Vec<String> = flags.map(str::to_owned).to_vec();
        flags.extend(["--checkpoint-every-records".to_owned(), "4".to_owned()]);
        flags
    })
    .await;
    let apis: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let add = |phase: &str, n: usize| {
        let body = json!({"rows": [{"cells": {"100": format!("{phase} {n}")}}]});
        (format!("archive-{phase}-{n}"), body)
    };
    let path = "/sheets/10/rows:bulkAdd";
    for n in 0..5 {
        let (key, body) = add("before", n);
        let (status, reply) = until_acknowledged(&apis, n, "POST", path, &key, &body).await;
        assert_eq!(status, 200, "{reply}");
    }
    let at = agreed_leader(&nodes).await;
    let file = dir.path().join("cluster.backup");
    backup_of(&nodes[at], &file).await;
    // A follower's archive dir is unusable for a while (a file where the dir was): its
    // archive fails and falls behind while the log is snapshotted and purged, which must keep
    // what the archive has not taken.
    let follower = (at + 1) % 3;
    let broken = archive(nodes[follower].id);
    let away = dir.path().join("archive-away");
    std::fs::rename(&broken, &away).unwrap();
    std::fs::write(&broken, "not a dir").unwrap();
    // More entries than a purge keeps behind a snapshot (100 at the least).
    for n in 0..150 {
        let (key, body) = add("after", n);
        let (status, reply) = until_acknowledged(&apis, n, "POST", path, &key, &body).await;
        assert_eq!(status, 200, "{reply}");
    }
    // The leader dies; the next one takes writes; the old one comes back as a follower.
    nodes[at].kill9();
    for n in 0..5 {
        let (key, body) = add("later", n);
        let (status, reply) = until_acknowledged(&apis, at + 1, "POST", path, &key, &body).await;
        assert_eq!(status, 200, "{reply}");
    }
    nodes[at].start();
    let (index, digest) = converged(&nodes).await;
    let health = admin_get(&nodes[follower].admin_url("/health")).await.unwrap();
    assert!(health["archive"]["lastError"].is_string(), "the archive fails: {health}");
    assert_eq!(health["status"], "degraded", "{health}");
    // The follower's log purged past what its archive has taken (entry `purgedIndex` is at
    // LSN `purgedIndex + 1`).
    let archived = health["archive"]["position"].as_u64().unwrap();
    let purged = |node: &Node| {
        let url = node.admin_url("/cluster");
        async move { admin_get(&url).await.and_then(|c| c["purgedIndex"].as_u64()) }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while purged(&nodes[follower]).await.is_none_or(|index| index < archived) {
        assert!(Instant::now() < deadline, "no purge past {archived} on the follower");
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::remove_file(&broken).unwrap();
    std::fs::rename(&away, &broken).unwrap();
    // The state at `index` is the record at LSN `index + 1` (the wal position of its entry).
    let until = (index + 1).to_string();
    for i in [follower, at] {
        let node = &nodes[i];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let health = admin_get(&node.admin_url("/health")).await;
            let archived = health.as_ref().and_then(|h| h["archive"]["position"].as_u64());
            if archived.is_some_and(|p| p > index) {
                let health = health.unwrap();
                assert_eq!(health["archive"]["gaps"], json!([]), "{health}");
                assert_eq!(health["archive"]["lastError"], Value::Null, "{health}");
                let url = node.admin_url("/metrics");
                let (_, metrics, _) = send("GET", &url, Some(ADMIN_TOKEN), &[], None).await;
                let metrics = metrics.as_str().unwrap_or_default();
                assert!(metrics.contains("sheetd_archive_position_lsn "), "{metrics}");
                assert!(metrics.contains("sheetd_archive_gaps_total 0"), "{metrics}");
                break;
            }
            assert!(Instant::now() < deadline, "node {}: {health:?}", node.id);
            actix_rt::time::sleep(Duration::from_millis(100)).await;
        }
        let restored = dir.path().join(format!("restored{}", node.id));
        let archived = archive(node.id);
        let extra = ["--archive-dir", backup::path(&archived), "--until-position", &until];
        assert_eq!(
            restored_digest(&file, &restored, &extra).await,
            digest,
            "node {}'s archive rolls the backup forward to the cluster's state at {index}",
            node.id
        );
    }
}

#[actix_rt::test]
async fn killing_the_leader_again_and_again_loses_no_acknowledged_write() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every 500 entries: nodes restart from them, and the log behind is purged.
    let mut nodes =
        three_with(dir.path(), |_| vec!["--checkpoint-every-records".into(), "500".into()]).await;
    let apis: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();

    // Writers at 64 connections: each adds a row, then patches it by version, every request
    // under its own Idempotency-Key, retried on another node until acknowledged.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked: Arc<Mutex<HashMap<String, (u64, u64)>>> = Arc::default();
    let writers: Vec<_> = (0..64usize)
        .map(|w| {
            let (apis, stop, acked) = (apis.clone(), Arc::clone(&stop), Arc::clone(&acked));
            actix_rt::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("w{w} n{n}");
                    let body = json!({"rows": [{"cells": {"100": name}}]});
                    let (status, reply) = until_acknowledged(
                        &apis,
                        w,
                        "POST",
                        "/sheets/10/rows:bulkAdd",
                        &format!("add-w{w}-n{n}"),
                        &body,
                    )
                    .await;
                    assert_eq!(status, 200, "{reply}");
                    let id = reply["results"][0]["row"]["id"].as_u64().unwrap();
                    let patch = json!({"version": 1, "cells": {"102": n}});
                    let (status, reply) = until_acknowledged(
                        &apis,
                        w,
                        "PATCH",
                        &format!("/sheets/10/rows/{id}"),
                        &format!("patch-w{w}-n{n}"),
                        &patch,
                    )
                    .await;
                    assert_eq!(status, 200, "{reply}");
                    assert_eq!(reply["version"], 2, "{reply}");
                    acked.lock().unwrap().insert(name, (id, n));
                    n += 1;
                }
            })
        })
        .collect();

    // Kill the leader ten times, a second and a half apart, and bring it back each time.
    let mut kills = Vec::new();
    for _ in 0..10 {
        actix_rt::time::sleep(Duration::from_millis(1500)).await;
        let at = leader(&nodes).await;
        let killed_at = Instant::now();
        nodes[at].kill9();
        let next = leader(&nodes).await;
        kills.push((nodes[at].id, nodes[next].id, killed_at.elapsed()));
        nodes[at].start();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.unwrap();
    }
    eprintln!("leader kills (killed, next, until the next served): {kills:?}");

    // Every node applied the same state.
    let (index, digest) = converged(&nodes).await;
    eprintln!("converged at {index}: {digest}");
    let at = leader(&nodes).await;
    let rows = list_all(&nodes[at].base(), ADA_READ, 10).await;
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 64, "the writers got through: {}", acked.len());
    // Every acknowledged write once, with its patch; none twice.
    let mut by_name: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for row in rows.values() {
        if let Some(name) = row["cells"]["100"].as_str() {
            by_name.entry(name.to_owned()).or_default().push(row);
        }
    }
    for (name, (id, n)) in &acked {
        let found = by_name.get(name).unwrap_or_else(|| panic!("{name} (row {id}) lost"));
        assert_eq!(found.len(), 1, "{name} applied twice: {found:?}");
        assert_eq!(found[0]["id"], *id);
        assert_eq!(found[0]["version"], 2, "{name}'s patch lost");
        assert_eq!(found[0]["cells"]["102"], *n);
    }
    // The feed: seq 1..N without a gap, followed page by page from the oldest change, the
    // same on every node (each follower read from its own copy).
    let feed = feed_of(&nodes[at], false).await;
    let seqs: Vec<u64> = feed.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    for node in nodes.iter().filter(|n| n.id != nodes[at].id) {
        assert!(feed_of(node, true).await == feed, "node {}'s feed differs", node.id);
    }
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "a gap in the feed");
    // The fixture's rows, each writer's add and patch.
    assert!(seqs.len() >= 4 + 2 * acked.len(), "{} changes", seqs.len());
    // The leader's log was purged behind a snapshot: the feed above was read in part from
    // the records the snapshots retained.
    let status = nodes[at].cluster().await.unwrap();
    assert!(status["purgedIndex"].as_u64().is_some(), "no snapshot was taken: {status}");
}

/// Adds rows through `api` until `stop`, without retrying: every answer must be a 200.
fn steady_writer(
    api: String,
    name: String,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> actix_rt::task::JoinHandle<Vec<(u16, String)>> {
    actix_rt::spawn(async move {
        let mut failures = Vec::new();
        let mut n = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let body = json!({"rows": [{"cells": {"100": format!("{name} {n}")}}]});
            let url = format!("http://{api}/api/v1/sheets/10/rows:bulkAdd");
            match attempt("POST", &url, &format!("{name}-{n}"), &body).await {
                Some((200, _)) => {}
                Some((status, reply)) => failures.push((status, reply.to_string())),
                None => failures.push((0, "no answer".into())),
            }
            n += 1;
        }
        failures
    })
}

#[actix_rt::test]
async fn a_lost_follower_costs_the_others_clients_nothing_and_a_paused_leader_steps_down() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path()).await;
    let at = agreed_leader(&nodes).await;
    let follower = (at + 1) % 3;
    let other = (at + 2) % 3;

    // A follower killed and restarted under load: clients of the two other nodes (one of
    // them forwarding to the leader) see no failed request while the leader keeps its term.
    let term = |c: Option<Value>| c.and_then(|c| c["term"].as_u64()).unwrap_or(0);
    let term_before = term(nodes[at].cluster().await);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let api = if w % 2 == 0 { &nodes[at].api } else { &nodes[other].api };
            steady_writer(api.clone(), format!("steady{w}"), Arc::clone(&stop))
        })
        .collect();
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    nodes[follower].kill9();
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    nodes[follower].start();
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut failed = Vec::new();
    for w in writers {
        failed.push(w.await.unwrap());
    }
    // A machine starved of CPU (a loaded CI runner, debug builds) can delay the leader's
    // heartbeats past the election timeout: an election then fails the writes in flight,
    // which is the contract's `unknown` outcome, not a cost of the lost follower. Failures
    // are excused only by such a change of term.
    let term_after = term(nodes[at].cluster().await).max(term(nodes[other].cluster().await));
    if term_after != term_before && failed.iter().any(|f| !f.is_empty()) {
        eprintln!("the term moved from {term_before} to {term_after} under load: failures excused");
        failed.clear();
    }
    for failures in failed {
        let restarts: Vec<String> = nodes
            .iter()
            .flat_map(|n| {
                let log = std::fs::read_to_string(&n.log).unwrap_or_default();
                log.lines()
                    .filter(|l| l.contains("restarting") || l.contains("leading"))
                    .map(|l| format!("node {}: {l}", n.id))
                    .collect::<Vec<_>>()
            })
            .collect();
        let first: Vec<_> = failures.iter().take(3).collect();
        assert!(
            failures.is_empty(),
            "a client of a live node saw a failure: {first:?}; {restarts:#?}"
        );
    }
    converged(&nodes).await;

    // The leader paused past the election timeout: the others elect a new leader and take
    // writes; resumed, the old leader acknowledges nothing more, steps down and converges.
    let paused = nodes[at].child.as_ref().unwrap().id().to_string();
    Command::new("kill").args(["-STOP", &paused]).status().unwrap();
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let apis: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let writers: Vec<_> = (0..8usize)
        .map(|w| {
            let (apis, acked) = (apis.clone(), Arc::clone(&acked));
            actix_rt::spawn(async move {
                for n in 0..20 {
                    let name = format!("paused{w} {n}");
                    let body = json!({"rows": [{"cells": {"100": name}}]});
                    let idem = format!("paused-{w}-{n}");
                    let path = "/sheets/10/rows:bulkAdd";
                    let (status, reply) =
                        until_acknowledged(&apis, w, "POST", path, &idem, &body).await;
                    assert_eq!(status, 200, "{reply}");
                    let id = reply["results"][0]["row"]["id"].as_u64().unwrap();
                    acked.lock().unwrap().push((name, id));
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    'elected: loop {
        assert!(Instant::now() < deadline, "no new leader while the old one is paused");
        for (i, node) in nodes.iter().enumerate() {
            let health = admin_get(&node.admin_url("/health")).await;
            if i != at && health.is_some_and(|h| h["cluster"]["serving"] == true) {
                break 'elected;
            }
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    actix_rt::time::sleep(Duration::from_millis(1000)).await;
    // A read sent to the paused leader waits in its accept queue; resumed, it must not answer
    // it from the state the new leader has moved past: the row acknowledged meanwhile is
    // there, or the answer is a 503 (or the node restarts as a follower under it).
    // A writer that moved on to the paused node waits out its client timeout there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let written = loop {
        if let Some((_, written)) = acked.lock().unwrap().last().cloned() {
            break written;
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes.iter().map(tail_of_log).collect();
            panic!("no write acknowledged while the leader is paused\n{}", logs.join("\n"));
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    };
    let url = format!("{}/sheets/10/rows/{written}", nodes[at].base());
    let stale_read = actix_rt::spawn(async move { attempt("GET", &url, "read", &json!({})).await });
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    Command::new("kill").args(["-CONT", &paused]).status().unwrap();
    match stale_read.await.unwrap() {
        Some((200, row)) => assert_eq!(row["id"], written, "{row}"),
        Some((503, reply)) => assert_eq!(reply["errorCode"], "cluster_unavailable", "{reply}"),
        None => {}
        Some(other) => panic!("the resumed leader answered a read from a stale state: {other:?}"),
    }
    for w in writers {
        w.await.unwrap();
    }
    converged(&nodes).await;
    // Resumed, it learned of the newer term and started again as a follower.
    let log = std::fs::read_to_string(&nodes[at].log).unwrap();
    assert!(log.contains("restarting as a follower"), "{log}");
    let leader_now = leader(&nodes).await;
    let names = row_names(&nodes[leader_now]).await;
    for (name, _) in acked.lock().unwrap().iter() {
        assert_eq!(names.get(name), Some(&1), "{name}: acknowledged, so present once");
    }
}

/// The first change `node`'s feed of sheet 10 holds (a follower forwards the read).
async fn oldest_change(node: &Node) -> u64 {
    let url = format!("{}/sheets/10/changes?limit=1", node.base());
    let (status, page) = attempt("GET", &url, "oldest", &json!({})).await.expect("an answer");
    assert_eq!(status, 200, "{page}");
    page["data"][0]["seq"].as_u64().expect("a change")
}

#[actix_rt::test]
async fn feed_retention_is_the_leaders_and_every_node_prunes_alike() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // Each node is configured with its own retention: the leader's is the group's.
    let mut nodes = three_with(dir.path(), |id| {
        let keep = (5 * id).to_string();
        vec!["--changes-retention-days".into(), "0".into(), "--changes-retention-min".into(), keep]
    })
    .await;
    let apis: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let write = |round: &'static str, n: usize| {
        let apis = apis.clone();
        async move {
            let body = json!({"rows": [{"cells": {"100": format!("{round} {n}")}}]});
            let idem = format!("{round}-{n}");
            let path = "/sheets/10/rows:bulkAdd";
            let (status, reply) = until_acknowledged(&apis, n, "POST", path, &idem, &body).await;
            assert_eq!(status, 200, "{reply}");
        }
    };
    for n in 0..40 {
        write("first", n).await;
    }
    // Pruned, by the same rule at the same positions on every node.
    converged(&nodes).await;
    let at = agreed_leader(&nodes).await;
    assert!(oldest_change(&nodes[at]).await > 1, "the feed was pruned");

    // A new leader with another retention: the group prunes by its from then on.
    nodes[at].kill9();
    for n in 0..40 {
        write("second", n).await;
    }
    nodes[at].start();
    converged(&nodes).await;
    let now = agreed_leader(&nodes).await;
    assert_ne!(now, at);
    let log = std::fs::read_to_string(&nodes[now].log).unwrap();
    assert!(log.contains("retention is this leader's"), "{}", tail_of_log(&nodes[now]));
    for node in &nodes {
        assert!(oldest_change(node).await > 40, "pruned after the second round");
    }
}

/// An admin request with the admin token; its status and JSON answer.
async fn admin_send(method: &str, url: &str, body: Option<Value>) -> (u16, Value) {
    let body = body.map(|b| b.to_string().into_bytes());
    let (status, reply, _) = send(method, url, Some(ADMIN_TOKEN), &[], body).await;
    (status, reply)
}

/// Waits until the membership change `node`'s leader runs is done; fails on a failed one.
async fn change_done(node: &Node) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status = node.cluster().await.unwrap_or(Value::Null);
        match status["membershipChange"]["phase"].as_str() {
            Some("done") => return,
            Some("failed") => panic!("the membership change failed: {status}"),
            _ => {}
        }
        assert!(Instant::now() < deadline, "the membership change did not finish: {status}");
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn a_node_joins_under_writes_and_a_removed_leader_leaves_nothing_lost() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = three(dir.path()).await;
    let at = agreed_leader(&nodes).await;

    // Node 4 starts on an empty data dir with --join: health at once, the public API 503.
    let raft4 = format!("127.0.0.4:{}", free_port("127.0.0.4"));
    let secret = dir.path().join("secret");
    let seed = dir.path().join("seed.json");
    let mut joiner = Node::new(dir.path(), 4, raft4.clone(), "", &secret, &seed);
    let initial = joiner.flags.iter().position(|f| f == "--initial-cluster").unwrap();
    joiner.flags.drain(initial..initial + 2);
    joiner.flags.push("--join".into());
    joiner.start();
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin_get(&joiner.admin_url("/health")).await.is_none() {
        assert!(Instant::now() < deadline, "{}", tail_of_log(&joiner));
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    let url = format!("{}/sheets/10/rows?limit=1", joiner.base());
    let (status, _, _) = send("GET", &url, Some(ADA_READ), &[], None).await;
    assert_eq!(status, 503, "a node not yet added serves nothing");

    // Writers on every node, retrying with their keys, while the membership changes.
    let writers = RetryingWriters::start(&nodes, "member", 8);
    actix_rt::time::sleep(Duration::from_millis(500)).await;

    // Sent to a follower, which runs them on the leader. Refused: an id that is a member, a
    // node that is not one.
    let via_follower = nodes[(at + 1) % 3].admin_url("/cluster/nodes");
    let nodes_url = nodes[at].admin_url("/cluster/nodes");
    let taken = json!({"id": 2, "raftAddr": raft4, "apiAddr": joiner.api});
    let (status, reply) = admin_send("POST", &via_follower, Some(taken)).await;
    assert_eq!(
        (status, reply["errorCode"].as_str()),
        (409, Some("membership_conflict")),
        "{reply}"
    );
    let (status, _) = admin_send("DELETE", &format!("{via_follower}/9"), None).await;
    assert_eq!(status, 404);

    let add = json!({"id": 4, "raftAddr": raft4, "apiAddr": joiner.api});
    let (status, reply) = admin_send("POST", &via_follower, Some(add)).await;
    assert_eq!(status, 202, "{reply}");
    assert_eq!(reply["membershipChange"]["action"], "add", "{reply}");
    // The leader may change under the load; the change runs on the one that took it.
    change_done(&nodes[at]).await;
    let status = nodes[at].cluster().await.unwrap();
    let four = status["nodes"].as_array().unwrap().iter().find(|n| n["id"] == 4).cloned();
    assert_eq!(four.map(|n| n["voter"].clone()), Some(json!(true)), "{status}");
    // The membership entries landed with no proposal in flight: no record's guessed index
    // was taken by one (which would fail the write and restart the leader as a follower).
    let log = std::fs::read_to_string(&nodes[at].log).unwrap();
    assert!(!log.contains("skipped where it landed"), "{}", tail_of_log(&nodes[at]));

    // The leader removes itself: the others go on without it.
    let leader_id = nodes[at].id;
    let (status, reply) = admin_send("DELETE", &format!("{nodes_url}/{leader_id}"), None).await;
    assert_eq!(status, 202, "{reply}");
    change_done(&nodes[at]).await;
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    let acked = writers.stop().await;

    // The removed node says so; the three members converge, node 4 with them.
    let url = format!("{}/sheets/10/rows?limit=1", nodes[at].base());
    let (status, reply, _) = send("GET", &url, Some(ADA_READ), &[], None).await;
    assert_eq!(status, 503, "{reply}");
    assert_eq!(reply["detail"]["reason"], "removed", "{reply}");
    let local = [("Sheetd-Consistency", "local")];
    let (status, reply, _) = send("GET", &url, Some(ADA_READ), &local, None).await;
    assert_eq!(status, 503, "not even a local read: {reply}");
    assert_eq!(reply["detail"]["reason"], "removed", "{reply}");
    let removed = nodes.remove(at);
    nodes.push(joiner);
    converged(&nodes).await;
    let now = agreed_leader(&nodes).await;
    let names = row_names(&nodes[now]).await;
    assert!(!acked.is_empty());
    for name in &acked {
        assert_eq!(names.get(name), Some(&1), "{name}: acknowledged, so present once");
    }
    drop(removed);
}

/// Packet filters that cut the cluster link between nodes (iptables, root: CI runs as root);
/// removed on drop. Each rule carries this process's id, so concurrent runs never remove
/// each other's.
struct Cut {
    rules: Vec<Vec<String>>,
}

impl Cut {
    /// Cuts every cluster-link packet between `node` and each of `others`, both ways: the
    /// link opens its connections from the host of its raft address, so the two addresses
    /// name all of it.
    fn off(node: &Node, others: &[&Node]) -> Cut {
        let tag = format!("sheetd-test-{}", std::process::id());
        let mut rules = Vec::new();
        let (a_ip, a_port) = node.raft_addr().split_once(':').map(owned).unwrap();
        for other in others {
            let (b_ip, b_port) = other.raft_addr().split_once(':').map(owned).unwrap();
            for (src, dst, port) in [(&a_ip, &b_ip, &b_port), (&b_ip, &a_ip, &a_port)] {
                for dir in ["--dport", "--sport"] {
                    let (s, d) = if dir == "--dport" { (src, dst) } else { (dst, src) };
                    rules.push(
                        [
                            "INPUT",
                            "-p",
                            "tcp",
                            "-s",
                            s,
                            "-d",
                            d,
                            dir,
                            port,
                            "-m",
                            "comment",
                            "--comment",
                            &tag,
                            "-j",
                            "DROP",
                        ]
                        .map(str::to_owned)
                        .to_vec(),
                    );
                }
            }
        }
        for rule in &rules {
            let status = Command::new("iptables").arg("-A").args(rule).status().expect(
                "this test cuts the cluster link with iptables and needs it and root \
                 (.ci/test installs it; CI runs as root)",
            );
            assert!(status.success(), "iptables -A {rule:?} failed");
        }
        Cut { rules }
    }
}

fn owned((a, b): (&str, &str)) -> (String, String) {
    (a.to_owned(), b.to_owned())
}

impl Drop for Cut {
    fn drop(&mut self) {
        for rule in &self.rules {
            let _ = Command::new("iptables").arg("-D").args(rule).status();
        }
    }
}

impl Node {
    /// The node's `--raft-addr`.
    fn raft_addr(&self) -> String {
        let at = self.flags.iter().position(|f| f == "--raft-addr").unwrap();
        self.flags[at + 1].clone()
    }
}

#[actix_rt::test]
async fn a_leader_cut_off_from_the_majority_serves_nothing_and_converges_after_healing() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = three(dir.path()).await;
    let at = agreed_leader(&nodes).await;
    let others: Vec<&Node> =
        nodes.iter().enumerate().filter(|(i, _)| *i != at).map(|(_, n)| n).collect();

    // Writers on every node, retrying with their keys (a 503 or no answer moves them on).
    let writers = RetryingWriters::start(&nodes, "cut", 6);
    actix_rt::time::sleep(Duration::from_millis(500)).await;

    let cut = Cut::off(&nodes[at], &others);
    // The majority elects a leader of its own and takes writes.
    let deadline = Instant::now() + Duration::from_secs(20);
    'elected: loop {
        if Instant::now() >= deadline {
            let logs: Vec<String> = nodes.iter().map(tail_of_log).collect();
            panic!("the majority elected no leader\n{}", logs.join("\n"));
        }
        for node in &others {
            let health = admin_get(&node.admin_url("/health")).await;
            if health.is_some_and(|h| h["cluster"]["serving"] == true) {
                break 'elected;
            }
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    // A writer whose request was in flight to the old leader waits for its client timeout.
    let before = writers.acknowledged();
    let deadline = Instant::now() + Duration::from_secs(20);
    while writers.acknowledged() < before + 10 {
        assert!(Instant::now() < deadline, "the majority side takes no writes");
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }

    // The minority side: every read and write gets 503 cluster_unavailable, never an answer
    // from its own state (its lease lapsed, no quorum confirms it).
    // (A write it took before the cut may end `unknown` and restart it as a follower: no
    // answer while it starts again.)
    let lone = &nodes[at];
    let answer = |method: &'static str, url: String, body: Value, idem: String| async move {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(answer) = attempt(method, &url, &idem, &body).await {
                return answer;
            }
            assert!(Instant::now() < deadline, "the cut-off node never answered");
            actix_rt::time::sleep(Duration::from_millis(100)).await;
        }
    };
    for n in 0..5 {
        let url = format!("{}/sheets/10/rows?limit=1", lone.base());
        let (status, reply) = answer("GET", url, json!({}), format!("read-{n}")).await;
        assert_eq!(status, 503, "a read on the cut-off node: {reply}");
        assert_eq!(reply["detail"]["outcome"], "not_applied", "{reply}");
        let body = json!({"rows": [{"cells": {"100": format!("lone {n}")}}]});
        let url = format!("{}/sheets/10/rows:bulkAdd", lone.base());
        let (status, reply) = answer("POST", url, body, format!("lone-{n}")).await;
        assert_eq!(status, 503, "a write on the cut-off node: {reply}");
    }

    // Healed: the old leader learns of the newer term, starts again as a follower, and
    // every node converges with every acknowledged write once.
    drop(cut);
    actix_rt::time::sleep(Duration::from_millis(1000)).await;
    let acked = writers.stop().await;
    converged(&nodes).await;
    let now = agreed_leader(&nodes).await;
    let names = row_names(&nodes[now]).await;
    for name in &acked {
        assert_eq!(names.get(name), Some(&1), "{name}: acknowledged, so present once");
    }
    for n in 0..5 {
        assert_eq!(names.get(&format!("lone {n}")), None, "refused on the minority, so absent");
    }
}

/// Writers adding rows through every node until stopped, each write retried with its key
/// until some node acknowledges it (see [`until_acknowledged`]).
struct RetryingWriters {
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<actix_rt::task::JoinHandle<()>>,
}

impl RetryingWriters {
    /// `count` writers whose rows are named `"{prefix}{writer} {n}"`.
    fn start(nodes: &[Node], prefix: &'static str, count: usize) -> RetryingWriters {
        let acked: Arc<Mutex<Vec<String>>> = Arc::default();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let apis: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
        let tasks = (0..count)
            .map(|w| {
                let (apis, acked, stop) = (apis.clone(), Arc::clone(&acked), Arc::clone(&stop));
                actix_rt::spawn(async move {
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let name = format!("{prefix}{w} {n}");
                        let body = json!({"rows": [{"cells": {"100": name}}]});
                        let idem = format!("{prefix}-{w}-{n}");
                        let path = "/sheets/10/rows:bulkAdd";
                        let (status, reply) =
                            until_acknowledged(&apis, w, "POST", path, &idem, &body).await;
                        assert_eq!(status, 200, "{reply}");
                        acked.lock().unwrap().push(name);
                        n += 1;
                    }
                })
            })
            .collect();
        RetryingWriters { acked, stop, tasks }
    }

    /// How many writes were acknowledged so far.
    fn acknowledged(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Stops the writers (each finishes its write in flight); the names acknowledged.
    async fn stop(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let acked = self.acked.lock().unwrap().clone();
        acked
    }
}

/// How many rows of sheet 10 carry each name (column 100), read through `node`.
async fn row_names(node: &Node) -> HashMap<String, usize> {
    let rows = list_all(&node.base(), ADA_READ, 10).await;
    let mut names: HashMap<String, usize> = HashMap::new();
    for row in rows.values() {
        if let Some(name) = row["cells"]["100"].as_str() {
            *names.entry(name.to_owned()).or_default() += 1;
        }
    }
    names
}

#[actix_rt::test]
async fn a_write_whose_fate_is_unknown_is_settled_by_its_retry_exactly_once() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let nodes = three(dir.path()).await;
    let at = agreed_leader(&nodes).await;

    // Both followers paused: the leader takes the write while its lease lasts, appends it, and
    // cannot commit it.
    let paused: Vec<String> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at)
        .map(|(_, n)| n.child.as_ref().unwrap().id().to_string())
        .collect();
    for pid in &paused {
        Command::new("kill").args(["-STOP", pid]).status().unwrap();
    }
    let body = json!({"rows": [{"cells": {"100": "fate unknown"}}]});
    let url = format!("{}/sheets/10/rows:bulkAdd", nodes[at].base());
    let first = attempt("POST", &url, "unknown-1", &body).await;
    for pid in &paused {
        Command::new("kill").args(["-CONT", pid]).status().unwrap();
    }
    match &first {
        // Taken inside the lease, appended, not committed in time.
        Some((503, reply)) => {
            assert_eq!(reply["errorCode"], "cluster_unavailable", "{reply}");
            let outcome = reply["detail"]["outcome"].as_str().unwrap();
            assert!(outcome == "unknown" || outcome == "not_applied", "{reply}");
        }
        // The node restarted as a follower before its answer left (it waits a moment for
        // that, so this is rare).
        None => {}
        Some(other) => panic!("a write no quorum could commit was answered {other:?}"),
    }

    // Its retry with the same key settles it: applied once, whichever it was.
    let apis: Vec<String> = nodes.iter().map(|n| n.api.clone()).collect();
    let path = "/sheets/10/rows:bulkAdd";
    let (status, reply) = until_acknowledged(&apis, at, "POST", path, "unknown-1", &body).await;
    assert_eq!(status, 200, "{reply}");
    converged(&nodes).await;
    let now = agreed_leader(&nodes).await;
    assert_eq!(row_names(&nodes[now]).await.get("fate unknown"), Some(&1));
}

/// Every change `node` serves in sheet 10's feed, in order: read from its own state when
/// `local`, else as a client reads it (a follower forwards the reads). A page that fails ends the test with what the node logged about it (an internal
/// error names its cause there).
async fn feed_of(node: &Node, local: bool) -> Vec<Value> {
    let header: &[(&str, &str)] = if local { &[("Sheetd-Consistency", "local")] } else { &[] };
    let mut changes = Vec::new();
    let mut url = format!("{}/sheets/10/changes?limit=500", node.base());
    loop {
        let (status, page, _) = send("GET", &url, Some(ADA_READ), header, None).await;
        if status != 200 {
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            let said: Vec<&str> =
                log.lines().filter(|l| l.contains("ERROR") || l.contains("WARN")).collect();
            panic!("a feed page from node {}: {status} {page}\n{}", node.id, said.join("\n"));
        }
        let data = page["data"].as_array().unwrap();
        if data.is_empty() {
            return changes;
        }
        changes.extend(data.iter().cloned());
        let cursor = page["nextCursor"].as_str().unwrap();
        url = format!("{}/sheets/10/changes?limit=500&cursor={cursor}", node.base());
    }
}

/// A metric's value in `node`'s `/admin/v1/metrics`.
async fn metric(node: &Node, name: &str) -> f64 {
    let (status, text, _) =
        send("GET", &node.admin_url("/metrics"), Some(ADMIN_TOKEN), &[], None).await;
    assert_eq!(status, 200);
    text.as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in the metrics"))
}

#[actix_rt::test]
async fn a_wiped_follower_added_back_under_a_new_id_catches_up_by_snapshot() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    // Snapshots every 200 entries, 100 kept behind each: a node that starts empty finds the
    // leader's log purged past its beginning.
    let snapshots = || vec!["--checkpoint-every-records".to_string(), "200".to_string()];
    let mut nodes = three_with(dir.path(), |_| snapshots()).await;
    let writers = RetryingWriters::start(&nodes, "snap", 8);
    let deadline = Instant::now() + Duration::from_secs(120);
    let at = loop {
        let at = agreed_leader(&nodes).await;
        let status = nodes[at].cluster().await.unwrap_or(Value::Null);
        if status["purgedIndex"].as_u64().is_some_and(|p| p > 50) {
            break at;
        }
        assert!(Instant::now() < deadline, "no purge behind a snapshot: {status}");
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    };

    // A follower loses its disk: removed, wiped, and started empty under a new id, while the
    // writers go on.
    let gone = (at + 1) % 3;
    let gone_id = nodes[gone].id;
    nodes[gone].kill9();
    let (status, reply) =
        admin_send("DELETE", &nodes[at].admin_url(&format!("/cluster/nodes/{gone_id}")), None)
            .await;
    assert_eq!(status, 202, "{reply}");
    change_done(&nodes[at]).await;
    let wiped = nodes.remove(gone);
    // Its id is spent: a node back under it may have lost the votes it cast.
    let again = json!({"id": gone_id, "raftAddr": wiped.raft_addr(), "apiAddr": wiped.api});
    let (status, reply) =
        admin_send("POST", &nodes[0].admin_url("/cluster/nodes"), Some(again)).await;
    assert_eq!(
        (status, reply["errorCode"].as_str()),
        (409, Some("membership_conflict")),
        "{reply}"
    );
    assert!(reply["message"].as_str().unwrap().contains("was a member"), "{reply}");
    let data = wiped.flags.iter().position(|f| f == "--data-dir").unwrap();
    std::fs::remove_dir_all(&wiped.flags[data + 1]).unwrap();
    let raft5 = format!("127.0.0.5:{}", free_port("127.0.0.5"));
    let (secret, seed) = (dir.path().join("secret"), dir.path().join("seed.json"));
    let mut fresh = Node::new(dir.path(), 5, raft5.clone(), "", &secret, &seed);
    let initial = fresh.flags.iter().position(|f| f == "--initial-cluster").unwrap();
    fresh.flags.drain(initial..initial + 2);
    fresh.flags.push("--join".into());
    fresh.flags.extend(snapshots());
    fresh.start();
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin_get(&fresh.admin_url("/health")).await.is_none() {
        assert!(Instant::now() < deadline, "{}", tail_of_log(&fresh));
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    let at = agreed_leader(&nodes).await;
    let add = json!({"id": 5, "raftAddr": raft5, "apiAddr": fresh.api});
    let (status, reply) =
        admin_send("POST", &nodes[at].admin_url("/cluster/nodes"), Some(add)).await;
    assert_eq!(status, 202, "{reply}");
    change_done(&nodes[at]).await;
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    let acked = writers.stop().await;
    nodes.push(fresh);
    converged(&nodes).await;
    let fresh = nodes.len() - 1;
    assert!(
        metric(&nodes[fresh], "sheetd_cluster_snapshots_installed_total").await >= 1.0,
        "node 5 caught up by snapshot: {}",
        tail_of_log(&nodes[fresh])
    );
    let mut sent = 0.0;
    for node in &nodes[..fresh] {
        sent += metric(node, "sheetd_cluster_snapshots_sent_total").await;
    }
    assert!(sent >= 1.0, "a leader sent node 5 its snapshot");

    // Every acknowledged row once, through the leader; node 5's state (rows and feed
    // positions) is the others' by the digests above, and it serves the leader's feed from
    // its own state, read back from the records its snapshot carried.
    let at = agreed_leader(&nodes).await;
    let names = row_names(&nodes[at]).await;
    for name in &acked {
        assert_eq!(names.get(name), Some(&1), "{name}: acknowledged, so present once");
    }
    if at != fresh {
        let feed = feed_of(&nodes[at], false).await;
        assert!(feed_of(&nodes[fresh], true).await == feed, "node 5's own feed differs");
    }
    drop(wiped);
}

/// Serve flags without the cluster's: the same data dir and addresses, served alone.
fn alone(flags: &[String]) -> Vec<String> {
    let mut flags = flags.to_vec();
    for flag in ["--node-id", "--raft-addr", "--initial-cluster", "--cluster-secret-file"] {
        if let Some(at) = flags.iter().position(|f| f == flag) {
            flags.drain(at..at + 2);
        }
    }
    flags
}

/// Node 1 on `dir` as a single node (not started), the flags that make its data dir a cluster
/// of one, and its raft address.
fn lone_node(dir: &Path) -> (Node, Vec<String>, String) {
    let seed = dir.join("seed.json");
    std::fs::write(&seed, fixture().to_string()).unwrap();
    let secret = dir.join("secret");
    std::fs::write(&secret, "a cluster secret for the tests, 48 bytes long...\n").unwrap();
    let raft1 = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let mut first = Node::new(dir, 1, raft1.clone(), &format!("1={raft1}"), &secret, &seed);
    let cluster_flags = first.flags.clone();
    first.flags = alone(&cluster_flags);
    (first, cluster_flags, raft1)
}

/// A node that joins with `--join` (no `--initial-cluster`), answering its health check.
async fn joining(dir: &Path, id: u64) -> Node {
    let raft = format!("127.0.0.{id}:{}", free_port(&format!("127.0.0.{id}")));
    let (secret, seed) = (dir.join("secret"), dir.join("seed.json"));
    let mut node = Node::new(dir, id, raft, "", &secret, &seed);
    let initial = node.flags.iter().position(|f| f == "--initial-cluster").unwrap();
    node.flags.drain(initial..initial + 2);
    node.flags.push("--join".into());
    node.start();
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin_get(&node.admin_url("/health")).await.is_none() {
        assert!(Instant::now() < deadline, "{}", tail_of_log(&node));
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    node
}

/// Adds `node` through `leader` and waits until the change is done.
async fn add(leader: &Node, node: &Node) {
    let body = json!({"id": node.id, "raftAddr": node.raft_addr(), "apiAddr": node.api});
    let (status, reply) = admin_send("POST", &leader.admin_url("/cluster/nodes"), Some(body)).await;
    assert_eq!(status, 202, "{reply}");
    change_done(leader).await;
}

#[actix_rt::test]
async fn a_single_node_grows_into_a_cluster_and_its_first_node_leaves_with_nothing_lost() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut first, cluster_flags, _) = lone_node(dir.path());

    // A single node, written to, then killed: its log holds writes after its checkpoint.
    first.start();
    let writers = RetryingWriters::start(std::slice::from_ref(&first), "alone", 4);
    let deadline = Instant::now() + Duration::from_secs(60);
    while writers.acknowledged() < 100 {
        assert!(Instant::now() < deadline, "{}", tail_of_log(&first));
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    let before = writers.stop().await;
    first.kill9();

    // The same data dir started as the only member of a new cluster: it keeps everything.
    first.flags = cluster_flags;
    first.start();
    let mut nodes = vec![first];
    agreed_leader(&nodes).await;
    let feed_before = feed_of(&nodes[0], false).await;
    let names = row_names(&nodes[0]).await;
    for name in &before {
        assert_eq!(names.get(name), Some(&1), "{name}: acknowledged before, so present once");
    }
    let data = nodes[0].flags.iter().position(|f| f == "--data-dir").unwrap();
    let data = PathBuf::from(&nodes[0].flags[data + 1]);
    assert!(data.join("single-node").is_dir(), "the single node's files are kept");
    // A restart starts from the cluster's snapshot, not the single node's files again.
    nodes[0].kill9();
    nodes[0].start();
    agreed_leader(&nodes).await;
    assert_eq!(feed_of(&nodes[0], false).await, feed_before);
    let log = std::fs::read_to_string(&nodes[0].log).unwrap();
    assert_eq!(log.matches("becomes the state of a new cluster").count(), 1, "adopted once");

    // Nodes 2 and 3 join under writes; then node 1 leaves, under writes sent to all three.
    let writers = RetryingWriters::start(&nodes, "grown", 4);
    for id in [2, 3] {
        let node = joining(dir.path(), id).await;
        add(&nodes[0], &node).await;
        nodes.push(node);
    }
    let mut after = writers.stop().await;
    // Each membership entry moved the leader's epoch on: the directory, untouched since,
    // re-syncs before it decides, so the first admin write after the changes succeeds at once.
    let grants = json!([{"verb": "read", "scopeType": "project", "scopeId": 1}]);
    let key = json!({"ownerId": 1, "name": "after the joins", "grants": grants});
    let (status, reply) = admin_send("POST", &nodes[0].admin_url("/keys"), Some(key)).await;
    assert_eq!(status, 201, "{reply}");
    let writers = RetryingWriters::start(&nodes, "moved", 4);
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    let (status, reply) = admin_send("DELETE", &nodes[0].admin_url("/cluster/nodes/1"), None).await;
    assert_eq!(status, 202, "{reply}");
    change_done(&nodes[0]).await;
    actix_rt::time::sleep(Duration::from_millis(1000)).await;
    after.extend(writers.stop().await);
    let removed = nodes.remove(0);
    converged(&nodes).await;

    // Nodes 2 and 3 serve what node 1 had, and every write since, each once; the feed goes
    // on from the single node's.
    let now = agreed_leader(&nodes).await;
    let names = row_names(&nodes[now]).await;
    for name in before.iter().chain(&after) {
        assert_eq!(names.get(name), Some(&1), "{name}: acknowledged, so present once");
    }
    let feed = feed_of(&nodes[now], false).await;
    assert_eq!(feed[..feed_before.len()], feed_before[..], "the single node's feed, unchanged");
    let seqs: Vec<u64> = feed.iter().map(|c| c["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "a gap in the feed");
    // The follower serves it from its own state, which began as a snapshot installed.
    assert!(feed_of(&nodes[1 - now], true).await == feed, "the follower's own feed differs");
    for node in &nodes {
        assert!(metric(node, "sheetd_cluster_snapshots_installed_total").await >= 1.0);
    }
    drop(removed);
}

/// The first page of `path` read from `node`, `local` or not: status, body, headers.
async fn read_at(node: &Node, path: &str, local: bool) -> crate::common::Reply {
    let url = format!("{}{path}", node.base());
    let header: &[(&str, &str)] = if local { &[("Sheetd-Consistency", "local")] } else { &[] };
    send("GET", &url, Some(ADA_READ), header, None).await
}

/// Local reads (docs/spec/cluster.md, "Local reads"): a follower answers a read sent with
/// `Sheetd-Consistency: local` from its own applied state, without the leader, showing what
/// the leader shows once it has applied it; cut off from every other node it stops after
/// `--max-local-staleness` (503, as it cannot forward either), as a leader that lost its
/// followers does; back in touch, it answers again.
#[actix_rt::test]
async fn a_follower_answers_local_reads_from_its_applied_state_until_it_is_cut_off() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let staleness = |_| vec!["--max-local-staleness".to_owned(), "1s".to_owned()];
    let mut nodes = three_with(dir.path(), staleness).await;
    let at = agreed_leader(&nodes).await;
    let (one, two) = ((at + 1) % 3, (at + 2) % 3);
    for n in 0..30 {
        let add = json!({"rows": [{"cells": {"100": format!("local {n}")}}]});
        let url = format!("{}/sheets/10/rows:bulkAdd", nodes[at].base());
        let (status, body, _) =
            send("POST", &url, Some(ADA_WRITE), &[], Some(add.to_string().into_bytes())).await;
        assert_eq!(status, 200, "{body}");
    }
    let (index, _) = converged(&nodes).await;
    let paths = ["/sheets/10/rows?limit=100", "/sheets/10/changes?limit=1000", "/sheets", "/me"];
    // Each node's local answer names the index it applied through: at least what every node
    // had applied before, at most what that node has applied after.
    for node in &nodes {
        let (status, body, headers) = read_at(node, paths[0], true).await;
        assert_eq!(status, 200, "{body}");
        let applied: u64 =
            headers.get("sheetd-applied-index").unwrap().to_str().unwrap().parse().unwrap();
        let after = admin_get(&node.admin_url("/cluster/digest")).await.unwrap();
        let after = after["appliedIndex"].as_u64().unwrap();
        assert!(
            index <= applied && applied <= after,
            "node {}: {index} {applied} {after}",
            node.id
        );
    }
    for i in [one, two] {
        let forwarded = metric(&nodes[i], "sheetd_cluster_forwarded_requests_total").await;
        for path in paths {
            let (status, local, headers) = read_at(&nodes[i], path, true).await;
            assert_eq!(status, 200, "{path} {local}");
            let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            assert_eq!(header("sheetd-node"), Some(nodes[i].id.to_string()));
            assert_eq!(header("sheetd-served-by"), None, "{path}: answered here");
            let applied: u64 = header("sheetd-applied-index").unwrap().parse().unwrap();
            assert!(applied > 30, "{path}: applied index {applied}");
            let (status, leaders, headers) = read_at(&nodes[at], path, false).await;
            assert_eq!(status, 200, "{leaders}");
            assert!(headers.get("sheetd-applied-index").is_none(), "only on a local read");
            // Rate limits are counted on each node (cluster.md), the rest is the same.
            let (mut local, mut leaders) = (local, leaders);
            for own in ["requestId", "rateLimit"] {
                local[own].take();
                leaders[own].take();
            }
            assert_eq!(local, leaders, "{path}: node {}", nodes[i].id);
        }
        let after = metric(&nodes[i], "sheetd_cluster_forwarded_requests_total").await;
        assert_eq!(after, forwarded, "no local read went to the leader");
        // The default is the leader's answer, forwarded.
        let (status, body, headers) = read_at(&nodes[i], "/sheets/10/rows", false).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(headers.get("sheetd-served-by").unwrap(), &nodes[at].id.to_string());
    }
    // A follower whose state is older than its staleness allows (here: any age at all) sends
    // a local read to the leader, which is alive, and relays its answer.
    let staleness = nodes[two].flags.iter().position(|f| f == "--max-local-staleness").unwrap();
    nodes[two].flags[staleness + 1] = "0s".into();
    nodes[two].kill9();
    nodes[two].start();
    converged(&nodes).await;
    let leads = agreed_leader(&nodes).await;
    assert_ne!(leads, two, "a restarted follower whose log was behind took the lead");
    let (status, body, headers) = read_at(&nodes[two], "/sheets/10/rows", true).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers.get("sheetd-served-by").unwrap(), &nodes[leads].id.to_string());
    assert!(headers.get("sheetd-applied-index").is_some(), "the leader's local answer");
    nodes[two].flags[staleness + 1] = "1s".into();
    nodes[two].kill9();
    nodes[two].start();
    converged(&nodes).await;
    let at = agreed_leader(&nodes).await;
    let (one, two) = ((at + 1) % 3, (at + 2) % 3);

    // A write asked to be local still runs on the leader; a header value it does not know is
    // a client's mistake.
    let add = json!({"rows": [{"cells": {"100": "written through a follower"}}]});
    let url = format!("{}/sheets/10/rows:bulkAdd", nodes[one].base());
    let local = [("Sheetd-Consistency", "local")];
    let (status, body, headers) =
        send("POST", &url, Some(ADA_WRITE), &local, Some(add.to_string().into_bytes())).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(headers.get("sheetd-served-by").unwrap(), &nodes[at].id.to_string());
    let url = format!("{}/sheets/10/rows", nodes[one].base());
    let eventual = [("Sheetd-Consistency", "eventual")];
    let (status, body, headers) = send("GET", &url, Some(ADA_READ), &eventual, None).await;
    assert_eq!(status, 422, "{body}");
    assert!(headers.get("x-ratelimit-remaining").is_some(), "counted as any request");
    assert_eq!(body["errorCode"], "validation_failed");
    assert_eq!(body["detail"][0]["loc"], json!(["header", "Sheetd-Consistency"]));
    assert!(body["requestId"].as_str().unwrap().starts_with("req_"));

    // Cut off: the two others gone, the follower hears from no leader; past the staleness it
    // stops answering locally, and cannot forward.
    nodes[at].kill9();
    nodes[two].kill9();
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    let (status, body, _) = read_at(&nodes[one], "/sheets/10/rows", true).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["errorCode"], "cluster_unavailable");
    assert_eq!(body["detail"]["outcome"], "not_applied");
    nodes[at].start();
    nodes[two].start();
    let at = agreed_leader(&nodes).await;
    converged(&nodes).await;
    let follower = (at + 1) % 3;
    // Back in touch: it answers again from its own state once it has heard from the leader
    // (on a loaded machine a heartbeat may come later than the 1 s of staleness allowed).
    let mut tries = 0;
    let (status, body, headers) = loop {
        let reply = read_at(&nodes[follower], "/sheets/10/rows?limit=100", true).await;
        tries += 1;
        let local = reply.0 == 200 && reply.2.get("sheetd-served-by").is_none();
        if local || tries == 50 {
            break reply;
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status, 200, "after {tries} tries: {body}");
    assert!(headers.get("sheetd-served-by").is_none());
    assert_eq!(body["data"].as_array().unwrap().len(), 4 + 31, "the fixture's and ours");

    // A leader whose followers are gone stops answering local reads too.
    let lost: Vec<usize> = (0..3).filter(|&i| i != at).collect();
    for &i in &lost {
        nodes[i].kill9();
    }
    actix_rt::time::sleep(Duration::from_millis(1500)).await;
    // (Should it learn of a newer term meanwhile, it starts again as a follower: no answer
    // while it does.)
    let url = format!("{}/sheets/10/rows", nodes[at].base());
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let client = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
        let sent = client
            .get(&url)
            .insert_header(("Authorization", format!("Bearer {ADA_READ}")))
            .insert_header(("Sheetd-Consistency", "local"))
            .send()
            .await;
        if let Ok(mut res) = sent {
            let status = res.status().as_u16();
            let body: Value = serde_json::from_slice(&res.body().await.unwrap()).unwrap();
            assert_eq!(status, 503, "{body}");
            break body;
        }
        assert!(Instant::now() < deadline, "the lone leader never answered");
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["errorCode"], "cluster_unavailable");
    assert_eq!(body["detail"]["outcome"], "not_applied");
}

/// A CA for the cluster's TLS test: it issues node certificates naming 127.0.0.{id}, good for
/// both ends of a connection.
struct TestCa {
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl TestCa {
    fn new(name: &str) -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        TestCa { cert: params.self_signed(&key).unwrap(), key }
    }

    /// Writes node `id`'s `--cluster-tls-dir` into `dir`: this CA, and a certificate it signed.
    fn issue(&self, dir: &Path, id: u64) {
        use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, KeyPair, SanType};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        let ip: std::net::IpAddr = format!("127.0.0.{id}").parse().unwrap();
        params.subject_alt_names = vec![SanType::IpAddress(ip)];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("ca.crt"), self.cert.pem()).unwrap();
        std::fs::write(dir.join("node.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("node.key"), key.serialize_pem()).unwrap();
    }
}

/// The cluster link over mutual TLS (`--cluster-tls-dir`, docs/spec/cluster.md, "Security of
/// the cluster link"): nodes whose certificates one CA signed form a cluster, replicate and
/// forward; a node whose certificate another CA signed is refused by its peers (it learns
/// nothing more) until it gets one the cluster's CA signed.
#[actix_rt::test]
async fn with_tls_dirs_nodes_talk_only_to_peers_the_clusters_ca_signed() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("sheetd test cluster");
    let tls_dir = |id: u64| dir.path().join(format!("tls{id}"));
    for id in 1..=3 {
        ca.issue(&tls_dir(id), id);
    }
    let flags = |id: u64| vec!["--cluster-tls-dir".to_owned(), tls_dir(id).display().to_string()];
    let mut nodes = three_with(dir.path(), flags).await;
    let at = agreed_leader(&nodes).await;
    let one = (at + 1) % 3;
    let add = |name: String| json!({"rows": [{"cells": {"100": name}}]}).to_string().into_bytes();
    // Through a follower, so the write is forwarded over the TLS link. A leader change right
    // after the start (a loaded machine) answers 503 cluster_unavailable, which a client
    // retries with its key, as this does; any other answer fails with every node's log.
    let url = format!("{}/sheets/10/rows:bulkAdd", nodes[one].base());
    let deadline = Instant::now() + Duration::from_secs(20);
    let headers = loop {
        let key = [("Idempotency-Key", "tls-first-write")];
        let (status, body, headers) =
            send("POST", &url, Some(ADA_WRITE), &key, Some(add("over tls".into()))).await;
        match status {
            200 => break headers,
            503 if body["errorCode"] == "cluster_unavailable" && Instant::now() < deadline => {
                actix_rt::time::sleep(Duration::from_millis(100)).await;
            }
            _ => {
                let logs: Vec<String> = nodes.iter().map(tail_of_log).collect();
                panic!("the first write through a follower: {status} {body}\n{}", logs.join("\n"));
            }
        }
    };
    // Served by the leader: forwarded, unless a leader change made the receiving node it.
    let at = agreed_leader(&nodes).await;
    let served_by = headers.get("sheetd-served-by").map(|v| v.to_str().unwrap().to_owned());
    let forwarded_to = (at != one).then(|| nodes[at].id.to_string());
    assert_eq!(served_by, forwarded_to);
    let two = (0..3).find(|i| *i != at && *i != one).unwrap();
    converged(&nodes).await;

    // A certificate from another CA: its peers refuse it, and it refuses them.
    nodes[two].kill9();
    TestCa::new("another cluster").issue(&tls_dir(nodes[two].id), nodes[two].id);
    nodes[two].start();
    let url = format!("{}/sheets/10/rows:bulkAdd", nodes[at].base());
    for n in 0..10 {
        let (status, body, _) =
            send("POST", &url, Some(ADA_WRITE), &[], Some(add(format!("without {n}")))).await;
        assert_eq!(status, 200, "the majority goes on: {body}");
    }
    let applied = |node: &Node| {
        let url = node.admin_url("/cluster/digest");
        async move { admin_get(&url).await.and_then(|d| d["appliedIndex"].as_u64()) }
    };
    let leader_applied = applied(&nodes[at]).await.unwrap();
    actix_rt::time::sleep(Duration::from_secs(3)).await;
    let outsider = applied(&nodes[two]).await.unwrap_or(0);
    assert!(outsider < leader_applied, "{outsider} against {leader_applied}");
    let logs = format!(
        "{}{}",
        std::fs::read_to_string(&nodes[at].log).unwrap(),
        std::fs::read_to_string(&nodes[two].log).unwrap()
    );
    assert!(logs.contains("UnknownIssuer"), "{}", tail_of_log(&nodes[two]));

    // Its certificate from the cluster's CA again: it catches up.
    nodes[two].kill9();
    ca.issue(&tls_dir(nodes[two].id), nodes[two].id);
    nodes[two].start();
    converged(&nodes).await;
    let (status, rows, _) = read_at(&nodes[two], "/sheets/10/rows?limit=100", true).await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["data"].as_array().unwrap().len(), 4 + 11);
}

/// The names and sizes of the files under `dir`, sorted.
fn files_under(dir: &Path) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            } else {
                let name = entry.path().strip_prefix(dir).unwrap().display().to_string();
                out.push((name, meta.len()));
            }
        }
    }
    out.sort();
    out
}

/// A single node's data dir started as a cluster node in any way but a cluster of one (to
/// join a running cluster, or as one of three new voters) is refused, saying what to do, and
/// left as it was.
#[actix_rt::test]
async fn a_single_nodes_data_dir_becomes_nothing_but_a_cluster_of_one() {
    let _one = ONE_CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut first, cluster_flags, raft1) = lone_node(dir.path());
    first.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin_get(&first.admin_url("/health")).await.is_none() {
        assert!(Instant::now() < deadline, "{}", tail_of_log(&first));
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(list_all(&first.base(), ADA_READ, 10).await.len(), 4, "the seeded rows");
    first.kill9();
    let data = PathBuf::from(
        &cluster_flags[cluster_flags.iter().position(|f| f == "--data-dir").unwrap() + 1],
    );
    let before = files_under(&data);

    let at = cluster_flags.iter().position(|f| f == "--initial-cluster").unwrap();
    let mut join = cluster_flags.clone();
    join.splice(at..at + 2, ["--join".to_owned()]);
    let mut three = cluster_flags.clone();
    three[at + 1] = format!(
        "1={raft1},2=127.0.0.2:{},3=127.0.0.3:{}",
        free_port("127.0.0.2"),
        free_port("127.0.0.3")
    );
    for flags in [join, three] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sheetd"))
            .args(&flags)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                child.kill().unwrap();
                panic!("a single node's data dir was not refused: {flags:?}");
            }
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert!(!status.success(), "{stderr}");
        assert!(stderr.contains("holds a single node's data"), "{stderr}");
        assert!(stderr.contains("--initial-cluster naming only this node (1)"), "{stderr}");
        assert_eq!(files_under(&data), before, "the data dir is left as it was");
    }
}
