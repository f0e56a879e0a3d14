//! After a failed apply: what the run created, and per the job's `on_failure` keeping it,
//! destroying exactly that, or rolling the workspace back to its last successful apply.

use std::collections::BTreeSet;

use state_backends::{StoreError, WorkspaceId};

use crate::job::OnFailure;
use crate::job::validate::ValidatedJob;
use crate::run::result::{Category, Changes, Cleanup, JobError};
use crate::run::rollback;
use crate::run::terraform::{Command, PlanMode};

use super::Runner;
use super::report::Report;
use super::steps::{Ran, Steps};
use super::workdir::prepare_workdir;

impl Runner {
    /// The managed resources in the workspace's current state.
    pub(super) async fn addresses(&self, ws: &WorkspaceId) -> Result<BTreeSet<String>, String> {
        addresses(self.store.current(ws).await)
    }

    /// After a failed apply: finds what the run created (state after minus state before) and,
    /// per the job's `on_failure`, keeps it, destroys exactly that (never anything that existed
    /// before the run), or rolls the workspace back to its last successful apply.
    pub(super) async fn clean_up(
        &self,
        job: &ValidatedJob,
        before: Result<BTreeSet<String>, String>,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Cleanup {
        let (policy, ws) = (job.job.on_failure, s.ws);
        let policy_name = serde_json::to_value(policy)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let mut cleanup = Cleanup {
            policy: policy_name,
            ..Cleanup::default()
        };
        let (before, after) = match (before, self.addresses(ws).await) {
            (Ok(before), Ok(after)) => (before, after),
            (Err(e), _) | (_, Err(e)) => {
                cleanup.error = Some(format!("cannot tell what the run created: {e}"));
                return cleanup;
            }
        };
        let created: BTreeSet<String> = after.difference(&before).cloned().collect();
        cleanup.created = created.iter().cloned().collect();
        cleanup.left = cleanup.created.clone();
        // A rollback also reverts changes to older resources, even when nothing was created,
        // but only when this run changed the state at all (a failed plan changed nothing).
        let changed_state = !s.server.settled_activity().await.versions.is_empty();
        let nothing_to_roll_back = !(policy == OnFailure::Rollback && changed_state);
        if policy == OnFailure::Keep || (created.is_empty() && nothing_to_roll_back) {
            if !created.is_empty() {
                s.logger
                    .runner(
                        "cleanup",
                        &format!(
                            "keeping what this run created: {}",
                            cleanup.created.join(", ")
                        ),
                    )
                    .await;
            }
            return cleanup;
        }
        let mut failure: Option<String> = None;
        let mut left = created.clone();
        let mut rollback_note: Option<String> = None;
        if policy == OnFailure::Rollback {
            match self.roll_back(job, s, report).await {
                Ok(Some((to, changes))) => {
                    cleanup.rolled_back_to = Some(to);
                    cleanup.reverted = changes
                        .resources
                        .iter()
                        .map(|r| r.address.clone())
                        .filter(|a| !created.contains(a))
                        .collect();
                }
                Ok(None) => {
                    rollback_note = Some(
                        "no earlier apply succeeded in this workspace: rolled back by destroying what the run created".into(),
                    );
                }
                Err(e) => failure = Some(format!("rollback failed: {e}")),
            }
            if let Ok(now) = self.addresses(ws).await {
                left = created.intersection(&now).cloned().collect();
            }
        }
        if let Some(e) = self
            .destroy_created(&created, &mut left, s, report, &mut cleanup.attempts)
            .await
        {
            failure = Some(e);
        }
        // A destroy failure matters only if something is still left; a failed rollback always.
        let failure = failure.filter(|f| !left.is_empty() || f.starts_with("rollback failed"));
        cleanup.error = match (rollback_note, failure) {
            (Some(note), Some(failure)) => Some(format!("{failure}; {note}")),
            (note, failure) => failure.or(note),
        };
        cleanup.destroyed = created.difference(&left).cloned().collect();
        cleanup.left = left.into_iter().collect();
        cleanup
    }

    /// Destroys what the run created and is still `left`, up to three attempts in all, and
    /// narrows `left` to what is still there; the last attempt's failure, if any.
    async fn destroy_created(
        &self,
        created: &BTreeSet<String>,
        left: &mut BTreeSet<String>,
        s: &Steps<'_>,
        report: &mut Report,
        attempts: &mut u32,
    ) -> Option<String> {
        let mut failure = None;
        while *attempts < 3 && !left.is_empty() && !s.stop.is_cancelled() {
            *attempts += 1;
            s.logger
                .runner(
                    "cleanup",
                    &format!(
                        "attempt {} to destroy what this run created: {}",
                        *attempts,
                        left.iter().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )
                .await;
            match self.destroy_only(left, s, report).await {
                Ok(()) => {}
                Err(e) if e.category == Category::Internal && e.step == "cleanup" => {
                    failure = Some(e.message);
                    break;
                }
                Err(e) => failure = Some(e.message),
            }
            let Ok(now) = self.addresses(s.ws).await else {
                break;
            };
            *left = created.intersection(&now).cloned().collect();
        }
        failure
    }

    /// Plans the destruction of exactly `targets`, checks that the plan destroys nothing else
    /// (terraform also destroys what depends on a target), and applies it.
    pub(super) async fn destroy_only(
        &self,
        targets: &BTreeSet<String>,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), JobError> {
        let plan = Command::Plan {
            mode: PlanMode::Destroy,
            detailed_exitcode: false,
            targets: targets.iter().cloned().collect(),
        };
        let planned = s.run(&plan, report).await?.ok()?;
        let changes = s.changes(planned, report).await?;
        let beyond: Vec<&str> = changes
            .resources
            .iter()
            .filter(|r| !targets.contains(&r.address))
            .map(|r| r.address.as_str())
            .collect();
        if !beyond.is_empty() {
            return Err(JobError::new(
                Category::Internal,
                "cleanup",
                format!(
                    "the cleanup would also change {}, which existed before the run; nothing was destroyed",
                    beyond.join(", ")
                ),
                "clean up by hand, or change the template so nothing older depends on what the run created",
                false,
            ));
        }
        s.run(&Command::Apply, report).await?.ok()?;
        Ok(())
    }

    /// Re-applies the workspace's last successful configuration in a workdir of its own, through
    /// the same state server. `None` when no apply has succeeded in the workspace yet.
    pub(super) async fn roll_back(
        &self,
        job: &ValidatedJob,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<Option<(String, Changes)>, String> {
        let templates = self
            .config
            .templates
            .as_ref()
            .ok_or("the runner has no templates to load the earlier configuration from")?;
        let Some((to, previous)) =
            rollback::previous_configuration(self.store.as_ref(), s.ws, job, templates).await?
        else {
            return Ok(None);
        };
        s.logger
            .runner(
                "rollback",
                &format!(
                    "rolling back to the configuration of {to} ({})",
                    previous.job.template
                ),
            )
            .await;
        // Tagged as the apply whose configuration it restores.
        let workdir = prepare_workdir(
            self.config.work_root.as_deref(),
            &previous,
            &to,
            self.config.terraform.user,
        )
        .map_err(|e| format!("cannot prepare the workdir: {e}"))?;
        let r = Steps {
            dir: workdir.path(),
            ..*s
        };
        let failed = |e: JobError| format!("{} (step {})", e.message, e.step);
        r.run(&Command::Init, report)
            .await
            .and_then(Ran::ok)
            .map_err(failed)?;
        let plan = Command::Plan {
            mode: PlanMode::Normal,
            detailed_exitcode: false,
            targets: Vec::new(),
        };
        let planned = r
            .run(&plan, report)
            .await
            .and_then(Ran::ok)
            .map_err(failed)?;
        let changes = r.changes(planned, report).await.map_err(failed)?;
        r.run(&Command::Apply, report)
            .await
            .and_then(Ran::ok)
            .map_err(failed)?;
        Ok(Some((to, changes)))
    }
}

/// The managed resources in a state read from the store.
pub(super) fn addresses(
    current: Result<Option<state_backends::CurrentState>, StoreError>,
) -> Result<BTreeSet<String>, String> {
    match current {
        Ok(Some(current)) => {
            state_backends::tfstate::resource_addresses(&current.data).map_err(|e| e.to_string())
        }
        Ok(None) => Ok(BTreeSet::new()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use state_backends::StateStore;

    #[tokio::test]
    async fn the_managed_resources_of_a_state_and_of_none() {
        let state = serde_json::json!({
            "version": 4, "serial": 3, "lineage": "l-1", "terraform_version": "1.11.4",
            "outputs": {},
            "resources": [
                { "mode": "managed", "type": "testcloud_network", "name": "main", "provider": "p", "instances": [{ "attributes": {} }] },
                { "mode": "data", "type": "testcloud_zone", "name": "z", "provider": "p", "instances": [{ "attributes": {} }] },
            ],
        });
        let store = state_backends::memory::MemoryStore::new();
        let ws = WorkspaceId::new("acme", "demo").unwrap();
        let state = state_backends::NewState::parse(Bytes::from(state.to_string())).unwrap();
        store
            .put(&ws, state, state_backends::PutMode::Create, None)
            .await
            .unwrap();
        let found = addresses(store.current(&ws).await).unwrap();
        assert!(found.contains("testcloud_network.main"), "{found:?}");
        assert!(
            !found.iter().any(|a| a.contains("testcloud_zone")),
            "{found:?}"
        );
        assert!(addresses(Ok(None)).unwrap().is_empty());
        let e = addresses(Err(StoreError::NotFound {
            workspace: ws.clone(),
            what: "the bucket".into(),
        }))
        .unwrap_err();
        assert!(e.contains("the bucket"), "{e}");
    }
}
