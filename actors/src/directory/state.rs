//! The directory's state: users, plans, projects, folders, sheet identities, shares, reports and
//! keys, and the one rule that turns them into access.
//!
//! # Access
//!
//! A user's role on a target is the highest role reaching it: `owner` for the project's owner,
//! else the best share on the target or on anything above it (project → folder → sheet). A
//! key's ceiling on a target is the best of its grants that cover it (`read` = viewer, `write` =
//! editor; an `account` grant covers everything). The effective role is the lower of the two,
//! computed live on every request from the current state, so a lost share or a revoked key
//! counts on the very next request. [`DirectoryState::effective_role`] is the only place this
//! is computed.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::model::{
    ApiKey, Folder, FolderId, KeyId, Plan, Project, ProjectId, Report, ReportId, Role, ScopeType,
    Share, SheetId, SheetMeta, User, UserId,
};
use crate::record::{DirectoryChange, ImportBatch, PlanCaps};

/// What a request wants to touch, for [`DirectoryState::effective_role`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A project (reports are reached through their project).
    Project(ProjectId),
    /// A folder: shares on it and on its project reach it.
    Folder(FolderId),
    /// A sheet: shares on it, its folder and its project reach it.
    Sheet(SheetId),
}

/// The objects a target sits in: its project, its folder if any, and the sheet itself. Grants
/// and shares on any of them cover the target (they flow down, never up).
#[derive(Clone, Copy, Debug)]
struct Scopes {
    project: ProjectId,
    folder: Option<FolderId>,
    sheet: Option<SheetId>,
}

impl Scopes {
    fn covers(&self, scope_type: ScopeType, id: u64) -> bool {
        match scope_type {
            ScopeType::Project => self.project == id,
            ScopeType::Folder => self.folder == Some(id),
            ScopeType::Sheet => self.sheet == Some(id),
            ScopeType::Account => false,
        }
    }
}

/// The directory at one point in time. Readers hold an `Arc` of it; the directory actor
/// replaces it whole on every change, so a reader always sees one consistent state.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DirectoryState {
    /// Row caps per plan.
    pub caps: PlanCaps,
    /// Users by id.
    pub users: BTreeMap<UserId, User>,
    /// Projects by id.
    pub projects: BTreeMap<ProjectId, Project>,
    /// Folders by id.
    pub folders: BTreeMap<FolderId, Folder>,
    /// Sheet identities by id (columns and rows live in the sheet actors).
    pub sheets: BTreeMap<SheetId, SheetMeta>,
    /// Shares by user.
    pub shares: BTreeMap<UserId, Vec<Share>>,
    /// Reports by id.
    pub reports: BTreeMap<ReportId, Report>,
    /// Keys by id.
    pub keys: BTreeMap<KeyId, ApiKey>,
    /// Key lookup by secret hash; derived from `keys`, rebuilt after decoding.
    #[serde(skip)]
    key_by_hash: HashMap<[u8; 32], KeyId>,
}

impl DirectoryState {
    /// Rebuild derived indexes (after decoding a checkpoint).
    pub fn reindex(&mut self) {
        self.key_by_hash = self.keys.values().map(|k| (k.secret_hash, k.id)).collect();
    }

    /// The key whose secret hashes to `hash`, usable or not.
    pub fn key_by_hash(&self, hash: &[u8; 32]) -> Option<&ApiKey> {
        self.key_by_hash.get(hash).and_then(|id| self.keys.get(id))
    }

    /// The plan of a project's owner (free when unknown).
    pub fn owner_plan(&self, project_id: ProjectId) -> Plan {
        self.projects
            .get(&project_id)
            .and_then(|p| self.users.get(&p.owner_id))
            .map_or(Plan::Free, |u| u.plan)
    }

    /// The per-sheet row cap that applies to a sheet (its project owner's plan).
    pub fn row_cap(&self, sheet_id: SheetId) -> u64 {
        let plan = self.sheets.get(&sheet_id).map_or(Plan::Free, |s| self.owner_plan(s.project_id));
        self.caps.cap(plan)
    }

    /// Where a target sits; `None` if it does not exist.
    fn scopes(&self, target: Target) -> Option<Scopes> {
        match target {
            Target::Project(id) => {
                self.projects.get(&id).map(|_| Scopes { project: id, folder: None, sheet: None })
            }
            Target::Folder(id) => self.folders.get(&id).map(|f| Scopes {
                project: f.project_id,
                folder: Some(id),
                sheet: None,
            }),
            Target::Sheet(id) => self.sheets.get(&id).map(|s| Scopes {
                project: s.project_id,
                folder: s.folder_id,
                sheet: Some(id),
            }),
        }
    }

    fn user_role_in(&self, user_id: UserId, scopes: &Scopes) -> Option<Role> {
        if self.projects.get(&scopes.project).is_some_and(|p| p.owner_id == user_id) {
            return Some(Role::Owner);
        }
        self.shares
            .get(&user_id)?
            .iter()
            .filter(|s| scopes.covers(s.scope_type, s.scope_id))
            .map(|s| s.role)
            .max()
    }

    fn key_ceiling_in(key: &ApiKey, scopes: &Scopes) -> Option<Role> {
        key.grants
            .iter()
            .filter(|g| match (g.scope_type, g.scope_id) {
                (ScopeType::Account, _) => true,
                (scope_type, Some(id)) => scopes.covers(scope_type, id),
                (_, None) => false,
            })
            .map(|g| g.verb.ceiling())
            .max()
    }

    /// A user's live role on a target, if any.
    pub fn user_role(&self, user_id: UserId, target: Target) -> Option<Role> {
        self.user_role_in(user_id, &self.scopes(target)?)
    }

    /// The effective role of a key on a target: min(owner's live role, key ceiling). `None`
    /// when the target does not exist or the key cannot reach it at all. Runs on every
    /// request (and per sheet of a list), so it locates the target once and allocates nothing.
    pub fn effective_role(&self, key: &ApiKey, target: Target) -> Option<Role> {
        let scopes = self.scopes(target)?;
        let ceiling = Self::key_ceiling_in(key, &scopes)?;
        let owner = self.user_role_in(key.owner_id, &scopes)?;
        Some(owner.min(ceiling))
    }

    /// Apply an import batch (already validated against this state).
    pub fn apply_import(&mut self, batch: &ImportBatch) {
        if let Some(caps) = batch.plan_caps {
            self.caps = caps;
        }
        for u in &batch.users {
            self.users.insert(u.id, u.clone());
        }
        for p in &batch.projects {
            self.projects.insert(p.id, p.clone());
        }
        for f in &batch.folders {
            self.folders.insert(f.id, f.clone());
        }
        for s in &batch.sheets {
            self.sheets.insert(s.meta.id, s.meta.clone());
        }
        for share in &batch.shares {
            self.set_share(*share, true);
        }
        for r in &batch.reports {
            self.reports.insert(r.id, r.clone());
        }
        for k in &batch.keys {
            self.key_by_hash.insert(k.secret_hash, k.id);
            self.keys.insert(k.id, k.clone());
        }
    }

    /// Apply one directory change.
    pub fn apply_change(&mut self, change: &DirectoryChange) {
        match change {
            DirectoryChange::CreateKey(key) => {
                self.key_by_hash.insert(key.secret_hash, key.id);
                self.keys.insert(key.id, (**key).clone());
            }
            DirectoryChange::RevokeKey(id) => {
                if let Some(k) = self.keys.get_mut(id) {
                    k.revoked = true;
                }
            }
            DirectoryChange::SetShare { share, present } => self.set_share(*share, *present),
            DirectoryChange::SetPlan { user_id, plan } => {
                if let Some(u) = self.users.get_mut(user_id) {
                    u.plan = *plan;
                }
            }
        }
    }

    /// Replace (or remove) the share of one user on one object.
    fn set_share(&mut self, share: Share, present: bool) {
        let list = self.shares.entry(share.user_id).or_default();
        list.retain(|s| (s.scope_type, s.scope_id) != (share.scope_type, share.scope_id));
        if present {
            list.push(share);
        }
        if list.is_empty() {
            self.shares.remove(&share.user_id);
        }
    }

    /// The next free key id.
    pub fn next_key_id(&self) -> KeyId {
        self.keys.keys().next_back().map_or(1, |id| id + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Grant, Verb};

    fn state() -> DirectoryState {
        let mut d = DirectoryState::default();
        d.apply_import(&ImportBatch {
            users: vec![
                User { id: 1, name: "ada".into(), plan: Plan::Paid },
                User { id: 2, name: "bob".into(), plan: Plan::Free },
            ],
            projects: vec![Project { id: 1, name: "Ops".into(), owner_id: 1 }],
            folders: vec![Folder { id: 5, project_id: 1, name: "Q3".into() }],
            sheets: vec![
                crate::record::SheetImport {
                    meta: SheetMeta {
                        id: 10,
                        project_id: 1,
                        folder_id: Some(5),
                        name: "a".into(),
                        created_at: 0,
                    },
                    columns: vec![],
                    rows: vec![],
                },
                crate::record::SheetImport {
                    meta: SheetMeta {
                        id: 11,
                        project_id: 1,
                        folder_id: None,
                        name: "b".into(),
                        created_at: 0,
                    },
                    columns: vec![],
                    rows: vec![],
                },
            ],
            shares: vec![Share {
                user_id: 2,
                scope_type: ScopeType::Folder,
                scope_id: 5,
                role: Role::Editor,
            }],
            ..Default::default()
        });
        d
    }

    fn key(owner: UserId, grants: Vec<Grant>) -> ApiKey {
        ApiKey {
            id: 1,
            owner_id: owner,
            name: "k".into(),
            prefix: "svc_live_x".into(),
            secret_hash: [0; 32],
            grants,
            created_at: 0,
            expires_at: None,
            revoked: false,
        }
    }

    fn grant(verb: Verb, scope_type: ScopeType, scope_id: Option<u64>) -> Grant {
        Grant { verb, scope_type, scope_id }
    }

    #[test]
    fn shares_flow_down_and_stop_at_their_scope() {
        let d = state();
        assert_eq!(d.user_role(2, Target::Sheet(10)), Some(Role::Editor));
        assert_eq!(d.user_role(2, Target::Sheet(11)), None, "sheet 11 is outside folder 5");
        assert_eq!(d.user_role(2, Target::Project(1)), None);
        assert_eq!(d.user_role(1, Target::Sheet(11)), Some(Role::Owner));
        assert_eq!(d.user_role(1, Target::Sheet(99)), None);
    }

    #[test]
    fn effective_role_is_the_lower_of_owner_role_and_key_ceiling() {
        let mut d = state();
        let write_all = key(2, vec![grant(Verb::Write, ScopeType::Account, None)]);
        assert_eq!(d.effective_role(&write_all, Target::Sheet(10)), Some(Role::Editor));
        let read_project = key(1, vec![grant(Verb::Read, ScopeType::Project, Some(1))]);
        assert_eq!(d.effective_role(&read_project, Target::Sheet(11)), Some(Role::Viewer));
        let folder = key(1, vec![grant(Verb::Write, ScopeType::Folder, Some(5))]);
        assert_eq!(
            d.effective_role(&folder, Target::Sheet(10)),
            Some(Role::Editor),
            "folder grants flow down"
        );
        assert_eq!(d.effective_role(&folder, Target::Sheet(11)), None, "sheet 11 is in no folder");
        assert_eq!(d.effective_role(&folder, Target::Project(1)), None, "grants do not flow up");
        let mixed = key(
            1,
            vec![
                grant(Verb::Read, ScopeType::Project, Some(1)),
                grant(Verb::Write, ScopeType::Sheet, Some(10)),
            ],
        );
        assert_eq!(
            d.effective_role(&mixed, Target::Sheet(10)),
            Some(Role::Editor),
            "the best covering grant"
        );
        assert_eq!(d.effective_role(&mixed, Target::Sheet(11)), Some(Role::Viewer));
        let sheet_only = key(1, vec![grant(Verb::Write, ScopeType::Sheet, Some(10))]);
        assert_eq!(d.effective_role(&sheet_only, Target::Sheet(11)), None);
        assert_eq!(d.effective_role(&sheet_only, Target::Sheet(10)), Some(Role::Editor));
        // Losing the share removes access through every key at once.
        d.apply_change(&DirectoryChange::SetShare {
            share: Share {
                user_id: 2,
                scope_type: ScopeType::Folder,
                scope_id: 5,
                role: Role::Editor,
            },
            present: false,
        });
        assert_eq!(d.effective_role(&write_all, Target::Sheet(10)), None);
    }
}
