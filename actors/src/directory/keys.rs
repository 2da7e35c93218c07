//! API keys: how a secret is made, stored and recognised, what a key may be granted, and how
//! long it lives. The admin API, the offline CLI and fixture imports all go through here, so a
//! key made one way obeys the same rules as a key made another.
//!
//! # Secrets
//!
//! A secret is `svc_live_` and 40 random alphanumerics (about 238 bits). Only its SHA-256 is
//! kept (and looked up); the first [`VISIBLE_PREFIX_LEN`] characters are kept in clear so an
//! operator can tell keys apart. The secret itself is shown once, to whoever created the key.
//! The admin token is not an API key: it has its own prefix (`adm_`), so neither can be taken
//! for the other, and it is never stored.
//!
//! # Grants
//!
//! A grant names a verb and a scope (`account`, or a project, folder or sheet by id). Every
//! grant must name an object that exists ([`check_grant`]). A key created on a running service
//! ([`check_new_key`]) may in addition grant no more than its owner holds on the object now:
//! a key is a narrowing of its owner's access, never a widening. A fixture states keys as they
//! are in a workspace being loaded, so its grants are held to the first rule only.
//!
//! # Expiry
//!
//! A key without an expiry lives [`DEFAULT_KEY_LIFETIME_MS`] (one year) from its creation; an
//! expiry sent by a caller is an RFC 3339 instant read by [`crate::coerce::parse_instant`] and
//! must lie in the future.

use rand::distributions::Alphanumeric;
use rand::Rng;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::state::{DirectoryState, Target};
use crate::coerce::parse_instant;
use crate::error::{Error, Result};
use crate::model::{ApiKey, Grant, KeyId, Millis, ScopeType, UserId, Verb};

/// The prefix of every key secret.
pub const SECRET_PREFIX: &str = "svc_live_";
/// How many characters of a secret stay visible as its prefix.
pub const VISIBLE_PREFIX_LEN: usize = SECRET_PREFIX.len() + 4;
/// Random characters after the prefix of a generated secret (or admin token).
const SECRET_RANDOM_CHARS: usize = 40;
/// Fewest random characters a secret sent in a fixture may have.
const MIN_SECRET_RANDOM_CHARS: usize = 32;
/// The prefix of a generated admin token.
pub const ADMIN_TOKEN_PREFIX: &str = "adm_";
/// Default key lifetime: one year.
pub const DEFAULT_KEY_LIFETIME_MS: Millis = 365 * 24 * 3600 * 1000;
/// Longest key name, in characters.
pub const MAX_KEY_NAME_CHARS: usize = 200;

/// A grant as asked for (JSON in the admin API and fixtures, `VERB:SCOPE:ID` on the CLI).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantSpec {
    /// `read` or `write`.
    pub verb: Verb,
    /// `account`, `project`, `folder` or `sheet`.
    pub scope_type: ScopeType,
    /// Scope id (null for `account`).
    #[serde(default)]
    pub scope_id: Option<u64>,
}

fn random_chars(n: usize) -> String {
    rand::thread_rng().sample_iter(&Alphanumeric).take(n).map(char::from).collect()
}

/// A fresh high-entropy secret: `svc_live_` + 40 alphanumerics (~238 bits).
pub fn generate_secret() -> String {
    format!("{SECRET_PREFIX}{}", random_chars(SECRET_RANDOM_CHARS))
}

/// A fresh admin token: `adm_` + 40 alphanumerics (~238 bits). Its prefix is not an API key's,
/// so no key check ever accepts it.
pub fn generate_admin_token() -> String {
    format!("{ADMIN_TOKEN_PREFIX}{}", random_chars(SECRET_RANDOM_CHARS))
}

/// Whether a string has the key format: `svc_live_` then at least 32 of `[A-Za-z0-9]`.
pub fn is_valid_secret(secret: &str) -> bool {
    secret.strip_prefix(SECRET_PREFIX).is_some_and(|t| {
        t.len() >= MIN_SECRET_RANDOM_CHARS && t.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// SHA-256 of a secret: what is stored and looked up.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Build a key record from its parts (the secret itself is not kept).
pub fn new_key(
    id: KeyId,
    owner_id: UserId,
    name: String,
    secret: &str,
    grants: Vec<Grant>,
    now: Millis,
    expires_at: Option<Millis>,
) -> ApiKey {
    ApiKey {
        id,
        owner_id,
        name,
        prefix: secret.chars().take(VISIBLE_PREFIX_LEN).collect(),
        secret_hash: hash_secret(secret),
        grants,
        created_at: now,
        expires_at,
        revoked: false,
    }
}

/// The expiry of a key created at `now` without one.
pub fn default_expiry(now: Millis) -> Millis {
    now + DEFAULT_KEY_LIFETIME_MS
}

/// Check a grant's shape and that its object exists; `what` names it in messages.
///
/// # Errors
/// [`Error::Invalid`]; an unknown object's detail names its `scopeId`.
pub fn check_grant(state: &DirectoryState, g: GrantSpec, what: &str) -> Result<Grant> {
    let ok = match (g.scope_type, g.scope_id) {
        (ScopeType::Account, None) => true,
        (ScopeType::Account, Some(_)) => {
            return Err(Error::invalid(format!("{what}: an account grant takes a null scopeId")))
        }
        (_, None) => return Err(Error::invalid(format!("{what}: scopeId is required"))),
        (ScopeType::Project, Some(id)) => state.projects.contains_key(&id),
        (ScopeType::Folder, Some(id)) => state.folders.contains_key(&id),
        (ScopeType::Sheet, Some(id)) => state.sheets.contains_key(&id),
    };
    if !ok {
        let id = g.scope_id.unwrap_or_default();
        return Err(Error::Invalid {
            message: format!("{what}: no {:?} with id {id}", g.scope_type).to_lowercase(),
            detail: Some(serde_json::json!({"scopeId": id, "reason": "no such object"})),
        });
    }
    Ok(Grant { verb: g.verb, scope_type: g.scope_type, scope_id: g.scope_id })
}

/// Check the owner and grants of a key to be created on a running service: the owner exists,
/// there is at least one grant, each passes [`check_grant`], and none exceeds what the owner
/// holds on its object now (the over-grant rule).
///
/// # Errors
/// [`Error::Invalid`]; an over-grant's detail names its `scopeId`.
pub fn check_new_key(
    state: &DirectoryState,
    owner_id: UserId,
    specs: &[GrantSpec],
) -> Result<Vec<Grant>> {
    if !state.users.contains_key(&owner_id) {
        return Err(Error::invalid(format!("user {owner_id} does not exist")));
    }
    if specs.is_empty() {
        return Err(Error::invalid("a key needs at least one grant"));
    }
    let mut grants = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let grant = check_grant(state, *spec, &format!("grants[{i}]"))?;
        if let Some(id) = grant.scope_id {
            let target = match grant.scope_type {
                ScopeType::Project => Target::Project(id),
                ScopeType::Folder => Target::Folder(id),
                _ => Target::Sheet(id),
            };
            let held = state.user_role(owner_id, target);
            if held < Some(grant.verb.ceiling()) {
                return Err(Error::Invalid {
                    message: format!(
                        "grants[{i}]: user {owner_id} cannot grant {:?} on {:?} {id}: they hold {}",
                        grant.verb,
                        grant.scope_type,
                        held.map_or("no role".to_string(), |r| format!("{r:?}"))
                    )
                    .to_lowercase(),
                    detail: Some(serde_json::json!({
                        "scopeId": id,
                        "reason": "the owner does not hold this level on the object"
                    })),
                });
            }
        }
        grants.push(grant);
    }
    Ok(grants)
}

/// A field of a key request that breaks a rule, as the request named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldProblem {
    /// The field: `name`, `grants` or `expiresAt`.
    pub field: &'static str,
    /// What is wrong, as a sentence naming the field.
    pub message: String,
    /// A machine-readable kind (`string_length`, `too_short`, `datetime_parsing`,
    /// `datetime_future`).
    pub kind: &'static str,
}

impl FieldProblem {
    fn new(field: &'static str, message: impl Into<String>, kind: &'static str) -> Self {
        FieldProblem { field, message: message.into(), kind }
    }
}

/// The fields of a key request, checked on their own (the owner's rights are the directory's to
/// check, in [`check_new_key`]): the trimmed name, and the expiry as milliseconds.
///
/// # Errors
/// The first field that breaks a rule: a name of 0 or more than [`MAX_KEY_NAME_CHARS`]
/// characters, no grant, an expiry that is not an RFC 3339 instant or is not in the future.
pub fn check_request_fields(
    name: &str,
    grants: &[GrantSpec],
    expires_at: Option<&str>,
    now: Millis,
) -> Result<(String, Option<Millis>), FieldProblem> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_KEY_NAME_CHARS {
        return Err(FieldProblem::new(
            "name",
            format!("`name` must have 1 to {MAX_KEY_NAME_CHARS} characters"),
            "string_length",
        ));
    }
    if grants.is_empty() {
        return Err(FieldProblem::new("grants", "at least one grant is required", "too_short"));
    }
    let expires_at = match expires_at {
        None => None,
        Some(text) => {
            let t = parse_instant(text).map_err(|_| {
                FieldProblem::new(
                    "expiresAt",
                    format!("`expiresAt` must be an RFC 3339 time with offset, got `{text}`"),
                    "datetime_parsing",
                )
            })?;
            if t <= now {
                return Err(FieldProblem::new(
                    "expiresAt",
                    "`expiresAt` must be in the future",
                    "datetime_future",
                ));
            }
            Some(t)
        }
    };
    Ok((name.to_owned(), expires_at))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::directory::fixture::{prepare, Fixture};

    /// ada owns project 1 (folder 5, sheet 10); bob views folder 5 and nothing else.
    fn directory() -> DirectoryState {
        let fixture: Fixture = serde_json::from_value(json!({
            "users": [{"id": 1, "name": "ada"}, {"id": 2, "name": "bob"}],
            "projects": [{"id": 1, "name": "Ops", "ownerId": 1}],
            "folders": [{"id": 5, "projectId": 1, "name": "Q3"}],
            "sheets": [{"id": 10, "projectId": 1, "folderId": 5, "name": "Tasks"}],
            "shares": [{"userId": 2, "scopeType": "folder", "scopeId": 5, "role": "viewer"}]
        }))
        .unwrap();
        let mut state = DirectoryState::default();
        state.apply_import(&prepare(fixture, &state, 1, 0).unwrap().0);
        state
    }

    fn grant(verb: Verb, scope_type: ScopeType, scope_id: Option<u64>) -> GrantSpec {
        GrantSpec { verb, scope_type, scope_id }
    }

    #[test]
    fn a_key_grants_at_most_what_its_owner_holds() {
        let d = directory();
        let read_sheet = grant(Verb::Read, ScopeType::Sheet, Some(10));
        let granted = check_new_key(&d, 2, &[read_sheet]).unwrap();
        assert_eq!(
            granted,
            [Grant { verb: Verb::Read, scope_type: ScopeType::Sheet, scope_id: Some(10) }]
        );
        assert!(check_new_key(&d, 1, &[grant(Verb::Write, ScopeType::Project, Some(1))]).is_ok());
        assert!(
            check_new_key(&d, 2, &[grant(Verb::Write, ScopeType::Account, None)]).is_ok(),
            "an account grant is capped by the owner's role on each object instead"
        );

        let over = [read_sheet, grant(Verb::Write, ScopeType::Folder, Some(5))];
        let Err(Error::Invalid { message, detail }) = check_new_key(&d, 2, &over) else {
            panic!("an over-grant was accepted")
        };
        assert_eq!(message, "grants[1]: user 2 cannot grant write on folder 5: they hold viewer");
        assert_eq!(
            detail,
            Some(
                json!({"scopeId": 5, "reason": "the owner does not hold this level on the object"})
            )
        );
        let Err(Error::Invalid { message, .. }) =
            check_new_key(&d, 2, &[grant(Verb::Read, ScopeType::Project, Some(1))])
        else {
            panic!("a grant above the owner's shares was accepted")
        };
        assert!(message.ends_with("they hold no role"), "{message}");
    }

    #[test]
    fn grants_need_an_owner_a_grant_and_an_object_of_the_right_shape() {
        let d = directory();
        let refused = |owner, specs: &[GrantSpec]| match check_new_key(&d, owner, specs) {
            Err(Error::Invalid { message, .. }) => message,
            other => panic!("not refused: {other:?}"),
        };
        assert_eq!(
            refused(9, &[grant(Verb::Read, ScopeType::Account, None)]),
            "user 9 does not exist"
        );
        assert_eq!(refused(1, &[]), "a key needs at least one grant");
        assert_eq!(
            refused(1, &[grant(Verb::Read, ScopeType::Account, Some(1))]),
            "grants[0]: an account grant takes a null scopeId"
        );
        assert_eq!(
            refused(1, &[grant(Verb::Read, ScopeType::Sheet, None)]),
            "grants[0]: scopeId is required"
        );
        assert_eq!(
            refused(1, &[grant(Verb::Read, ScopeType::Sheet, Some(11))]),
            "grants[0]: no sheet with id 11"
        );
    }

    #[test]
    fn secrets_and_admin_tokens_are_told_apart() {
        let secret = generate_secret();
        assert!(is_valid_secret(&secret));
        assert_eq!(secret.len(), SECRET_PREFIX.len() + 40);
        assert_ne!(generate_secret(), secret);
        let token = generate_admin_token();
        assert!(
            token.starts_with(ADMIN_TOKEN_PREFIX) && token.len() == ADMIN_TOKEN_PREFIX.len() + 40
        );
        assert!(!is_valid_secret(&token), "an admin token is never an API key");
        assert!(!is_valid_secret("svc_live_tooShort"));
        let key = new_key(1, 1, "k".into(), &secret, Vec::new(), 0, None);
        assert_eq!(key.prefix, &secret[..VISIBLE_PREFIX_LEN]);
        assert_eq!(key.secret_hash, hash_secret(&secret));
    }

    #[test]
    fn request_fields_name_the_field_they_break() {
        let one = [grant(Verb::Read, ScopeType::Account, None)];
        let field = |name: &str, grants: &[GrantSpec], expires: Option<&str>| {
            check_request_fields(name, grants, expires, 1_000).unwrap_err()
        };
        assert_eq!(field("  ", &one, None).field, "name");
        assert_eq!(field(&"n".repeat(MAX_KEY_NAME_CHARS + 1), &one, None).kind, "string_length");
        assert_eq!(field("k", &[], None).field, "grants");
        assert_eq!(field("k", &one, Some("2030-01-01 00:00:00Z")).kind, "datetime_parsing");
        assert_eq!(field("k", &one, Some("1970-01-01T00:00:01Z")).kind, "datetime_future");
        assert_eq!(
            check_request_fields(" ci ", &one, Some("1970-01-01T00:00:01.001Z"), 1_000),
            Ok(("ci".to_owned(), Some(1_001)))
        );
    }
}
