//! After "already exists": importing into the state the object that a create of this workspace
//! met, and only one this workspace may have made (this job's or an unfinished earlier run's).

use std::collections::BTreeSet;

use state_backends::WorkspaceId;

use crate::run::recover::Recovery;
use crate::run::result::JobError;
use crate::run::terraform::Command;
use crate::run::{logs, recover};

use super::Runner;
use super::report::{Earlier, Report};
use super::steps::{Ran, Steps};

impl Runner {
    /// After "already exists": imports the object into the state when the error and the plan
    /// say unambiguously which planned create met it and the object's id.
    pub(super) async fn import_existing(
        &self,
        error: &JobError,
        s: &Steps<'_>,
        report: &mut Report,
    ) -> Result<(), NotImported> {
        // The saved plan of the attempt that failed is still in the workdir.
        let shown = s
            .run(&Command::ShowPlan, report)
            .await
            .and_then(Ran::ok)
            .map_err(|e| {
                NotImported::Why(format!(
                    "there is no plan to find the resource in: {}",
                    e.message
                ))
            })?;
        let in_state = self.addresses(s.ws).await.map_err(NotImported::Why)?;
        let import =
            recover::import_for(error, &shown.stdout, &in_state).map_err(NotImported::Why)?;
        // Only what this workspace was making: an object of the same name may be another
        // workspace's, or made by hand, and importing it would hand it to this workspace (whose
        // destroy would delete it).
        if report.earlier.made.is_none() {
            let made = self.made_before(s.ws, &report.earlier).await;
            report.earlier.made = Some(made);
        }
        let earlier = report.earlier.made.as_ref();
        if !report.creating.contains(&import.address)
            && !earlier.is_some_and(|made| made.contains(&import.address))
        {
            return Err(NotImported::NotOurs(format!(
                "no run of this workspace was creating {address}, so {id} may be another workspace's object or one made by hand, and it was not imported: if it is this workspace's, import it (`terraform import {address} {id}`); if not, give this workspace's object another name or delete that one; then run the job again",
                address = import.address,
                id = import.id,
            )));
        }
        s.logger
            .runner(
                "import",
                &format!(
                    "{} already exists in the cloud as {} but not in the state (a create that failed after the cloud made it); importing it",
                    import.address, import.id
                ),
            )
            .await;
        let command = Command::Import {
            address: import.address.clone(),
            id: import.id.clone(),
        };
        s.run(&command, report)
            .await
            .and_then(Ran::ok)
            .map_err(|e| {
                NotImported::Why(format!(
                    "importing {} {} failed: {}",
                    import.address, import.id, e.message
                ))
            })?;
        report.recovered.push(Recovery {
            action: "imported".into(),
            address: import.address,
            id: import.id,
            after: error.message.clone(),
        });
        Ok(())
    }

    /// What earlier runs of `ws` that did not finish may have made, by their stored logs
    /// (this attempt's own chunks left out). A log that cannot be read is no evidence.
    async fn made_before(&self, ws: &WorkspaceId, earlier: &Earlier) -> BTreeSet<String> {
        let own = logs::chunk_prefix(earlier.fence);
        let mut made = BTreeSet::new();
        for run in &earlier.runs {
            let read =
                logs::read_chunks(self.store.as_ref(), ws, run, |name| !name.starts_with(&own));
            match read.await {
                Ok(lines) => made.extend(recover::made_in_log(&lines)),
                Err(e) => {
                    tracing::warn!(job_id = %run, error = %e, "an earlier run's log cannot be read");
                }
            }
        }
        made
    }
}

/// At most this many objects are imported after "already exists" in one job.
pub(super) const MAX_IMPORTS: usize = 5;

/// Why an object that already exists was not imported.
pub(super) enum NotImported {
    /// Added to the error's hint: why it could not be told what to import.
    Why(String),
    /// The error's hint: the object may not be this workspace's.
    NotOurs(String),
}
