//! `sheetd cluster up`: a cluster of N `sheetd serve` processes on this machine, for trying
//! it out. Node `i` listens on `127.0.0.i` (the public API on `:8080`, the admin API on
//! `:8081`, the cluster link on `:9101` by default), keeps its data in `<data-dir>/node<i>`
//! and logs to `<data-dir>/node<i>.log`. The secret and the admin token are made once and kept
//! in the data dir, so a second `up` on the same dir brings the same cluster back. Ctrl-C (or
//! SIGTERM) stops every node gracefully. An `--archive-dir D` among the serve flags gives node
//! `i` the archive dir `D/node<i>`: an archive dir serves one node only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::RngCore;

/// `sheetd cluster up` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// How many nodes (1 to 9).
    #[arg(long, default_value_t = 3)]
    pub nodes: u8,
    /// Where the nodes keep their data dirs, logs, the secret and the admin token.
    #[arg(long, default_value = "./sheetd-cluster")]
    pub data_dir: PathBuf,
    /// The public API port of every node (each on its own 127.0.0.i).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The admin API port of every node.
    #[arg(long, default_value_t = 8081)]
    pub admin_port: u16,
    /// The cluster link port of every node.
    #[arg(long, default_value_t = 9101)]
    pub raft_port: u16,
    /// More `sheetd serve` flags for every node, after `--` (e.g. `-- --rate-limit-per-minute
    /// 100000`); `--archive-dir D` becomes `D/node<i>` for node `i`.
    #[arg(last = true)]
    pub serve_flags: Vec<String>,
}

/// Reads the file at `path`, or makes it with `make` (owner-only) when it is absent.
fn kept(path: &Path, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    if let Ok(text) = std::fs::read_to_string(path) {
        return Ok(text.trim().to_owned());
    }
    let text = make();
    crate::server::write_private(path, text.as_bytes())?;
    Ok(text)
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut buf);
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// The serve flags for node `i`: as given, but an archive dir of its own (`--archive-dir D`
/// or `--archive-dir=D` becomes `D/node<i>`), since two nodes never archive into one dir.
fn node_flags(flags: &[String], i: u64) -> Vec<String> {
    let own = |dir: &str| Path::new(dir).join(format!("node{i}")).display().to_string();
    let mut out = Vec::with_capacity(flags.len());
    let mut flags = flags.iter();
    while let Some(flag) = flags.next() {
        match flag.strip_prefix("--archive-dir") {
            Some("") => {
                out.push(flag.clone());
                if let Some(dir) = flags.next() {
                    out.push(own(dir));
                }
            }
            Some(value) if value.starts_with('=') => {
                out.push(format!("--archive-dir={}", own(&value[1..])));
            }
            _ => out.push(flag.clone()),
        }
    }
    out
}

/// Runs the cluster until Ctrl-C or SIGTERM.
pub fn up(args: UpArgs) -> ExitCode {
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sheetd cluster up: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &UpArgs) -> anyhow::Result<()> {
    if !(1..=9).contains(&args.nodes) {
        anyhow::bail!("--nodes must be 1 to 9, got {}", args.nodes);
    }
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let secret_file = dir.join("cluster-secret");
    kept(&secret_file, || random_hex(32))?;
    let token = kept(&dir.join("admin-token"), || format!("adm_{}", random_hex(24)))?;
    let ids = 1..=u64::from(args.nodes);
    let initial: Vec<String> =
        ids.clone().map(|i| format!("{i}=127.0.0.{i}:{}", args.raft_port)).collect();
    let initial = initial.join(",");
    let exe = std::env::current_exe().context("cannot find this program")?;
    let mut children: Vec<(u64, Child)> = Vec::new();
    for i in ids.clone() {
        let log = dir.join(format!("node{i}.log"));
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let child = Command::new(&exe)
            .arg("serve")
            .args(["--addr", &format!("127.0.0.{i}:{}", args.port)])
            .args(["--admin-addr", &format!("127.0.0.{i}:{}", args.admin_port)])
            .arg("--data-dir")
            .arg(dir.join(format!("node{i}")))
            .args(["--admin-token", &token])
            .args(["--node-id", &i.to_string()])
            .args(["--raft-addr", &format!("127.0.0.{i}:{}", args.raft_port)])
            .args(["--initial-cluster", &initial])
            .arg("--cluster-secret-file")
            .arg(&secret_file)
            .args(node_flags(&args.serve_flags, i))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start node {i}"))?;
        children.push((i, child));
    }
    println!("sheetd cluster: {} nodes, data in {}", args.nodes, dir.display());
    for i in ids {
        println!(
            "  node {i}: API http://127.0.0.{i}:{}/api/v1  admin http://127.0.0.{i}:{}/admin/v1  \
             log {}",
            args.port,
            args.admin_port,
            dir.join(format!("node{i}.log")).display()
        );
    }
    println!("Admin token: {token}");
    println!("Any node serves the whole API (followers forward to the leader).");
    if let Some(keys) = wait_for_demo_keys(dir, args.nodes, &mut children) {
        println!("Demo keys (from {}):\n{keys}", keys_path(dir, args.nodes).display());
    }
    println!("Ctrl-C stops every node.");
    actix_rt::System::new().block_on(crate::server::wait_for_signal());
    println!("stopping the nodes");
    for (_, child) in &children {
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    }
    for (i, child) in &mut children {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!("node {i} exited with {status}"),
            Err(e) => eprintln!("node {i}: {e}"),
        }
    }
    Ok(())
}

fn keys_path(dir: &Path, nodes: u8) -> PathBuf {
    (1..=nodes)
        .map(|i| dir.join(format!("node{i}/demo-keys.txt")))
        .find(|p| p.exists())
        .unwrap_or_else(|| dir.join("node1/demo-keys.txt"))
}

/// The demo keys the first leader wrote when it seeded the new cluster (a cluster brought
/// back has none to show); `None` after 10 s or when a node exits.
fn wait_for_demo_keys(dir: &Path, nodes: u8, children: &mut [(u64, Child)]) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(text) = std::fs::read_to_string(keys_path(dir, nodes)) {
            return Some(text);
        }
        for (i, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("node {i} exited with {status}; see its log");
                return None;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::node_flags;

    fn flags(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn each_node_gets_an_archive_dir_of_its_own_and_other_flags_as_given() {
        let given = flags(&[
            "--rate-limit-per-minute",
            "9",
            "--archive-dir",
            "/a",
            "--archive-seal-ms",
            "100",
        ]);
        assert_eq!(
            node_flags(&given, 2),
            flags(&[
                "--rate-limit-per-minute",
                "9",
                "--archive-dir",
                "/a/node2",
                "--archive-seal-ms",
                "100"
            ])
        );
        assert_eq!(
            node_flags(&flags(&["--archive-dir=/b"]), 3),
            flags(&["--archive-dir=/b/node3"])
        );
        // Another flag that only begins alike, and a flag without its value, pass as given.
        let alike = flags(&["--archive-dir-x", "y", "--archive-dir"]);
        assert_eq!(node_flags(&alike, 1), alike);
    }
}
