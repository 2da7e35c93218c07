//! The operator commands that work on a data dir with no server running: `sheetd key
//! create|revoke|list` and `sheetd check`.
//!
//! # One owner per data dir
//!
//! The log store takes a file lock when it opens, so a second opener fails (the log's `InUse`
//! error, which names the holder). These commands therefore refuse a data dir that a server holds open,
//! with that message, instead of writing behind the server's back.
//!
//! # Key changes
//!
//! `key create` and `key revoke` recover the service on the data dir inside a short-lived actix
//! system and send the same [`actors::directory`] messages as the admin API, so the change is
//! checked, logged and made durable exactly like one made through a running server. They end
//! with a checkpoint (which truncates nothing: a server's log archive takes those records at its
//! next start) and a clean shutdown of the log, so the next server start replays nothing.
//! `key list` only reads. A created key's secret is printed once, to stdout; only its hash is
//! stored, and it is never logged.

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;

use actors::directory::keys::{self, GrantSpec};
use actors::directory::{CreateKey, RevokeKey};
use actors::model::{Grant, ScopeType, Verb};
use actors::shared::Clock;
use actors::{Service, ServiceConfig};
use anyhow::{bail, Context};

use crate::config::KeyCommand;
use crate::views::timestamp;

/// Print an error the operator's way and fail: the message and each cause that adds to it
/// (the domain's errors already repeat their source's message).
pub(crate) fn fail(what: &str, e: anyhow::Error) -> ExitCode {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    eprintln!("sheetd {what}: {text}");
    ExitCode::FAILURE
}

/// `sheetd check`: replay a copy of the log, print what the data dir holds and the digest of
/// its state (as a backup's manifest states it), and exit non-zero
/// on any damage (a torn last record, a damaged record anywhere else, a damaged checkpoint, a
/// gap in the log).
pub fn check(data_dir: &Path) -> ExitCode {
    let now = chrono::Utc::now().timestamp_millis();
    let actors::service::Inspection { report, counts, digest } =
        match Service::inspect(data_dir, now) {
            Ok(x) => x,
            Err(e) => return fail("check", anyhow::Error::new(e)),
        };
    println!(
        "log: checkpoint at {}, {} records replayed ({} bytes), last LSN {}",
        report.checkpoint_lsn.map_or("none".to_owned(), |l| format!("LSN {l}")),
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
    println!("digest: {digest}");
    if report.torn_tail_dropped {
        println!(
            "damage: the last record (LSN {}) is torn: an unacknowledged write cut off by a crash; \
             the next start drops it",
            report.torn_tail_lsn.unwrap_or_default()
        );
        return ExitCode::FAILURE;
    }
    println!("ok");
    ExitCode::SUCCESS
}

/// `sheetd key ...`.
pub fn key(cmd: KeyCommand) -> ExitCode {
    let result = match cmd {
        KeyCommand::Create { data_dir, owner, name, grants, expires_at } => {
            create_key(&data_dir, owner, name, &grants, expires_at.as_deref())
        }
        KeyCommand::Revoke { data_dir, id } => revoke_key(&data_dir, id),
        KeyCommand::List { data_dir, owner } => list_keys(&data_dir, owner),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("key", e),
    }
}

/// Parse `VERB:SCOPE_TYPE:ID` (`write:project:1`) or `VERB:account`.
pub fn parse_grant(text: &str) -> anyhow::Result<GrantSpec> {
    let parts: Vec<&str> = text.split(':').collect();
    let verb = match parts.first().copied() {
        Some("read") => Verb::Read,
        Some("write") => Verb::Write,
        _ => bail!("grant `{text}`: the verb must be `read` or `write`"),
    };
    let (scope_type, scope_id) = match parts.get(1..).unwrap_or_default() {
        ["account"] => (ScopeType::Account, None),
        [kind, id] => {
            let scope_type = match *kind {
                "project" => ScopeType::Project,
                "folder" => ScopeType::Folder,
                "sheet" => ScopeType::Sheet,
                _ => bail!("grant `{text}`: the scope must be project, folder, sheet or account"),
            };
            let id = id
                .parse::<u64>()
                .with_context(|| format!("grant `{text}`: `{id}` is not an object id"))?;
            (scope_type, Some(id))
        }
        _ => bail!("grant `{text}`: expected VERB:SCOPE_TYPE:ID or VERB:account"),
    };
    Ok(GrantSpec { verb, scope_type, scope_id })
}

/// A grant as `parse_grant` reads it.
fn format_grant(g: &Grant) -> String {
    let (verb, scope) = (g.verb.as_str(), g.scope_type.as_str());
    match g.scope_id {
        Some(id) => format!("{verb}:{scope}:{id}"),
        None => format!("{verb}:{scope}"),
    }
}

/// Recover the service on `data_dir`, run `work`, then (for changes) checkpoint, and always
/// close the log cleanly. Runs its own actix system: the actors need one.
pub(crate) fn offline<T, F, Fut>(data_dir: &Path, changes: bool, work: F) -> anyhow::Result<T>
where
    F: FnOnce(Service) -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    // Recovery would create a missing dir; a typo must not yield an empty data dir.
    if !data_dir.is_dir() {
        bail!("data dir {} does not exist", data_dir.display());
    }
    actix_rt::System::new().block_on(async move {
        let (service, _) = Service::open(ServiceConfig {
            data_dir: data_dir.to_owned(),
            sheet_threads: 1,
            clock: Clock::default(),
            min_free_bytes: None,
            retention: Default::default(),
            archive: None,
        })
        .with_context(|| format!("cannot open data dir {}", data_dir.display()))?;
        let result = work(service.clone()).await;
        // The change is durable in the log already; the checkpoint only spares the next start
        // its replay. It truncates nothing: the server's log archive (`--archive-dir`, unknown
        // here) takes these records at its next start. The log is closed either way.
        let checkpoint = if changes && result.is_ok() {
            service.checkpoint_keeping_log().await.map(drop).context("checkpoint after the change")
        } else {
            Ok(())
        };
        service.close().context("closing the log")?;
        checkpoint?;
        result
    })
}

fn create_key(
    data_dir: &Path,
    owner: u64,
    name: String,
    grants: &[String],
    expires_at: Option<&str>,
) -> anyhow::Result<()> {
    let grants = grants.iter().map(|g| parse_grant(g)).collect::<anyhow::Result<Vec<_>>>()?;
    // The same checks as `POST /admin/v1/keys`; its messages name the request's fields.
    let now = chrono::Utc::now().timestamp_millis();
    let (name, expires_at) = keys::check_request_fields(&name, &grants, expires_at, now)
        .map_err(|p| anyhow::anyhow!("Request validation failed: {}", p.message))?;
    let msg = CreateKey { owner_id: owner, name, grants, expires_at };
    let (key, secret) = offline(data_dir, true, |service| async move {
        let sent = service.directory_actor().send(msg).await.context("the directory stopped")?;
        sent.map_err(|e| match &e {
            actors::Error::Invalid { detail: Some(detail), .. } => {
                anyhow::anyhow!("{e} ({detail})")
            }
            _ => anyhow::Error::new(e),
        })
    })?;
    println!(
        "Created key {} \"{}\" for user {} (prefix {}, expires {}).",
        key.id,
        key.name,
        key.owner_id,
        key.prefix,
        key.expires_at.and_then(timestamp).unwrap_or_else(|| "never".into())
    );
    println!("Secret (shown once; it cannot be shown again):");
    println!("{secret}");
    Ok(())
}

fn revoke_key(data_dir: &Path, id: u64) -> anyhow::Result<()> {
    let key = offline(data_dir, true, |service| async move {
        let sent = service.directory_actor().send(RevokeKey(id)).await;
        Ok(sent.context("the directory stopped")??)
    })?;
    println!("Revoked key {} \"{}\" of user {}.", key.id, key.name, key.owner_id);
    Ok(())
}

fn list_keys(data_dir: &Path, owner: Option<u64>) -> anyhow::Result<()> {
    let directory = offline(data_dir, false, |service| async move { Ok(service.directory()) })?;
    let now = chrono::Utc::now().timestamp_millis();
    let never = || "never".to_owned();
    println!(
        "{:<6} {:<6} {:<20} {:<14} {:<8} {:<25} {:<25} GRANTS",
        "ID", "OWNER", "NAME", "PREFIX", "STATE", "CREATED", "EXPIRES"
    );
    for k in directory.keys.values().filter(|k| owner.is_none_or(|o| k.owner_id == o)) {
        let grants: Vec<String> = k.grants.iter().map(format_grant).collect();
        println!(
            "{:<6} {:<6} {:<20} {:<14} {:<8} {:<25} {:<25} {}",
            k.id,
            k.owner_id,
            k.name,
            k.prefix,
            k.state(now).as_str(),
            timestamp(k.created_at).unwrap_or_else(never),
            k.expires_at.and_then(timestamp).unwrap_or_else(never),
            grants.join(",")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_parse_from_verb_scope_and_id_and_print_back() {
        for text in ["write:project:1", "read:folder:5", "read:sheet:11", "write:account"] {
            let g = parse_grant(text).unwrap();
            let grant = Grant { verb: g.verb, scope_type: g.scope_type, scope_id: g.scope_id };
            assert_eq!(format_grant(&grant), text);
        }
        for bad in [
            "",
            "admin:project:1",
            "read:project",
            "read:project:x",
            "read:team:1",
            "read:account:1",
        ] {
            assert!(parse_grant(bad).is_err(), "{bad} parses");
        }
    }
}
