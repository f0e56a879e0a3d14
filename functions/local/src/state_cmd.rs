//! `terrace state …`: list, show, restore and push a workspace's state versions, and break a
//! lease.

use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use state_backends::{
    LeaseRequest, StateStore, StateStoreExt, StoreError, WorkspaceId, display_time,
};
use time::OffsetDateTime;

use crate::ops::{JSON_SCHEMA, Output, print_json};
use crate::{Global, exit};

#[derive(Subcommand, Debug)]
pub enum StateCmd {
    /// List every state version of TENANT/WORKSPACE, oldest first.
    Versions {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        #[command(flatten)]
        out: Output,
    },
    /// Print the current state, or one version.
    Show {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Roll the workspace forward to an old version or an hourly backup (copied into a new
    /// version; history kept).
    Restore {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        #[arg(long, required_unless_present = "backup", conflicts_with = "backup")]
        version: Option<u64>,
        /// A backup label, as `terrace state backups` lists them (e.g. 2026-11-22T03).
        #[arg(long)]
        backup: Option<String>,
    },
    /// List the workspace's backups, oldest first.
    Backups {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        #[command(flatten)]
        out: Output,
    },
    /// Push a state file, such as a run's kept errored.tfstate, as a new version. It gets the
    /// checks of any write from terraform: same lineage, serial not going back.
    Push {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        /// The state file (terraform's JSON state).
        #[arg(required_unless_present = "from_run", conflicts_with = "from_run")]
        file: Option<std::path::PathBuf>,
        /// Push the state a run of this job kept in the store (`runs/JOB/errored.tfstate`),
        /// opened with this runner's keys when it is sealed.
        #[arg(long, value_name = "JOB")]
        from_run: Option<String>,
    },
    /// Break the workspace's lease. A live lease is only broken with --force.
    Unlock {
        /// TENANT/WORKSPACE.
        workspace: WorkspaceId,
        /// Break a lease that has not expired (its runner must be gone: its writes are refused from now on).
        #[arg(long)]
        force: bool,
    },
}

pub async fn run(g: &Global, cmd: StateCmd) -> anyhow::Result<u8> {
    let store: Arc<dyn StateStore> = g.open_store().await?;
    match cmd {
        StateCmd::Versions { workspace, out } => {
            let versions = store.versions(&workspace).await?;
            let current = store.current_version(&workspace).await?.map(|v| v.number);
            if out.json {
                print_json(&crate::output::Versions {
                    schema: JSON_SCHEMA,
                    workspace: workspace.to_string(),
                    current,
                    versions,
                });
                return Ok(exit::OK);
            }
            if versions.is_empty() {
                outln!("{workspace} has no state versions");
                return Ok(exit::OK);
            }
            outln!(
                "{:>7}  {:>6}  {:<36}  {:>8}  {:<25}",
                "VERSION",
                "SERIAL",
                "LINEAGE",
                "BYTES",
                "CREATED"
            );
            for v in versions {
                let mark = if Some(v.number) == current {
                    "  (current)"
                } else {
                    ""
                };
                outln!(
                    "{:>7}  {:>6}  {:<36}  {:>8}  {:<25}{mark}",
                    v.number,
                    v.serial,
                    v.lineage,
                    v.size,
                    display_time(v.created_at)
                );
            }
            Ok(exit::OK)
        }
        StateCmd::Show { workspace, version } => {
            let read = match version {
                Some(n) => store.version(&workspace, n).await.map(Some),
                None => store.current(&workspace).await.map(|c| c.map(|c| c.data)),
            };
            let data = match read {
                Ok(Some(data)) => data,
                Ok(None) => {
                    eprintln!("{workspace} has no current state");
                    return Ok(exit::FAILED);
                }
                // A state this command cannot open is an answer, not a failure of terrace.
                Err(e @ StoreError::Sealed { .. }) => {
                    eprintln!(
                        "error: {e}: give the key it was sealed with (--state-key-file, or --state-old-key-files for an older one)"
                    );
                    return Ok(exit::FAILED);
                }
                Err(e) => return Err(e.into()),
            };
            print!("{}", String::from_utf8_lossy(&data));
            Ok(exit::OK)
        }
        StateCmd::Backups { workspace, out } => {
            let backups = store.backups(&workspace).await?;
            if out.json {
                print_json(&crate::output::Backups {
                    schema: JSON_SCHEMA,
                    workspace: workspace.to_string(),
                    backups,
                });
                return Ok(exit::OK);
            }
            if backups.is_empty() {
                eprintln!("{workspace} has no backups");
            }
            for b in backups {
                outln!("{}  version {}  sha256 {}", b.label, b.version, b.sha256);
            }
            Ok(exit::OK)
        }
        StateCmd::Restore {
            workspace,
            version,
            backup,
        } => {
            // A backup is restored from its own copy: the version it copied may be gone.
            let what = match (version, &backup) {
                (Some(v), _) => format!("version {v}"),
                (None, Some(label)) => {
                    let backups = store.backups(&workspace).await?;
                    if !backups.iter().any(|b| &b.label == label) {
                        let known: Vec<&str> = backups.iter().map(|b| b.label.as_str()).collect();
                        eprintln!(
                            "{workspace} has no backup {label}; it has: {}",
                            if known.is_empty() {
                                "none".to_owned()
                            } else {
                                known.join(", ")
                            }
                        );
                        return Ok(exit::FAILED);
                    }
                    format!("backup {label}")
                }
                (None, None) => unreachable!("clap requires --version or --backup"),
            };
            let info = serde_json::json!({ "operation": "restore", "from": what });
            let Some(lease) = take_lease(g, &store, &workspace, "restore", info).await? else {
                return Ok(exit::BUSY);
            };
            let fence = lease.fence();
            let restored = match (version, &backup) {
                (Some(v), _) => store.restore(&workspace, v, Some(&fence)).await,
                (None, Some(label)) => store.restore_backup(&workspace, label, Some(&fence)).await,
                (None, None) => unreachable!("clap requires --version or --backup"),
            };
            store.release_lease(&workspace, &lease).await?;
            let info = restored?;
            outln!(
                "{workspace}: {what} restored as version {} (serial {})",
                info.number,
                info.serial
            );
            Ok(exit::OK)
        }
        StateCmd::Push {
            workspace,
            file,
            from_run,
        } => {
            let (data, file) = match (file, from_run) {
                (Some(file), _) => {
                    let data = std::fs::read(&file)
                        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
                    if state_backends::sealed::is_sealed(&data) {
                        eprintln!(
                            "{}: the file is sealed (encrypted): push the run's kept state with --from-run JOB, which opens it with this runner's keys",
                            file.display()
                        );
                        return Ok(exit::FAILED);
                    }
                    (data, file.display().to_string())
                }
                (None, Some(job)) => {
                    let name = shared::run::records::ERRORED_STATE;
                    match store.artifact(&workspace, &job, name).await? {
                        Some(data) => (data.to_vec(), format!("runs/{job}/{name}")),
                        None => {
                            eprintln!("{workspace}: run {job} kept no {name}");
                            return Ok(exit::NOT_FOUND);
                        }
                    }
                }
                (None, None) => unreachable!("clap requires FILE or --from-run"),
            };
            let info = serde_json::json!({ "operation": "push", "file": file });
            let Some(lease) = take_lease(g, &store, &workspace, "push", info).await? else {
                return Ok(exit::BUSY);
            };
            // The state server's own write path: the same checks as a write from terraform.
            let server =
                shared::run::state_server::StateServer::start(shared::run::state_server::Config {
                    store: store.clone(),
                    ws: workspace.clone(),
                    fence: shared::run::vouched::Vouched::unvouched(
                        lease.fence(),
                        tokio_util::sync::CancellationToken::new(),
                    ),
                    password: shared::run::state_server::random_secret(),
                    logger: None,
                    max_body: shared::run::state_server::MAX_STATE_BYTES,
                    header_read_timeout: shared::run::state_server::HEADER_READ_TIMEOUT,
                })
                .await?;
            let pushed = server.push(data.into()).await;
            server.shutdown().await;
            store.release_lease(&workspace, &lease).await?;
            match pushed {
                Ok(Some(number)) => {
                    outln!("{workspace}: {file} pushed as version {number}");
                    Ok(exit::OK)
                }
                Ok(None) => {
                    outln!("{workspace}: {file} is already the current state");
                    Ok(exit::OK)
                }
                Err((why, _)) => {
                    eprintln!("{workspace}: {file} not pushed: {why}");
                    Ok(exit::FAILED)
                }
            }
        }
        StateCmd::Unlock { workspace, force } => {
            let Some(lease) = store.lease(&workspace).await? else {
                outln!("{workspace} has no lease");
                return Ok(exit::OK);
            };
            let live = !lease.is_expired_at(OffsetDateTime::now_utc());
            if live && !force {
                eprintln!(
                    "{workspace} is leased by job {} (fence {}) until {}, and the lease is live; \
                     if that runner is gone, run again with --force",
                    lease.owner,
                    lease.fence,
                    display_time(lease.expires_at)
                );
                return Ok(exit::BUSY);
            }
            // Only the lease shown: one taken since by another run stays.
            if store
                .break_lease(&workspace, Some(lease.fence))
                .await?
                .is_none()
            {
                let Some(now) = store.lease(&workspace).await? else {
                    outln!(
                        "{workspace}: the lease of job {} was released meanwhile",
                        lease.owner
                    );
                    return Ok(exit::OK);
                };
                eprintln!(
                    "{workspace}: the lease changed since it was read (now job {} with fence {}); \
                     nothing was broken, look again with `terrace state unlock {workspace}`",
                    now.owner, now.fence
                );
                return Ok(exit::BUSY);
            }
            outln!(
                "{workspace}: broke the {} lease of job {} (fence {})",
                if live { "live" } else { "expired" },
                lease.owner,
                lease.fence
            );
            Ok(exit::OK)
        }
    }
}

/// Takes the workspace's lease for a state command; `None` (after saying so) when it is held.
async fn take_lease(
    g: &Global,
    store: &Arc<dyn StateStore>,
    workspace: &WorkspaceId,
    what: &str,
    info: serde_json::Value,
) -> anyhow::Result<Option<state_backends::Lease>> {
    let request = LeaseRequest {
        owner: format!("{what}-{}", OffsetDateTime::now_utc().unix_timestamp()),
        ttl: Duration::from_secs(g.lease_ttl.max(1)),
        info,
    };
    match store.acquire_lease(workspace, &request).await {
        Ok(lease) => Ok(Some(lease)),
        Err(StoreError::LeaseHeld { holder, .. }) => {
            eprintln!(
                "{workspace} is leased by job {} until {}; {what} when it is free",
                holder.owner,
                display_time(holder.expires_at)
            );
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}
