//! How terraform is run: as which user (`TERRACE_TERRAFORM_USER`) and within which limits
//! (`TERRACE_JOB_MEMORY`, `TERRACE_JOB_CPU_SECONDS`).

use crate::run::terraform::{RunAs, TerraformConfig};

use super::{ConfigError, var};

/// Who terraform runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Who {
    /// The runner's own user.
    Runner,
    /// One user for every job.
    One(RunAs),
    /// A user of each job's own (see [`crate::run::terraform::JobUser`]).
    PerJob,
}

/// `TERRACE_TERRAFORM_USER`: who terraform runs as: `per-job`, `UID[:GID]`, or `root` (the
/// runner's own). Unset: `default_unprivileged` gives `per-job` when the runner is root.
///
/// # Errors
/// A value that is not one, or users to switch to when the runner cannot switch.
pub(super) fn terraform_user(default_unprivileged: bool) -> Result<Who, ConfigError> {
    user_from(
        var("TERRACE_TERRAFORM_USER").as_deref(),
        default_unprivileged,
        nix::unistd::geteuid().as_raw(),
    )
}

/// [`terraform_user`] for the setting `value` and a runner running as `euid`.
pub(super) fn user_from(
    value: Option<&str>,
    default_unprivileged: bool,
    euid: u32,
) -> Result<Who, ConfigError> {
    let root = euid == 0;
    let Some(value) = value else {
        return Ok(if default_unprivileged && root {
            Who::PerJob
        } else {
            Who::Runner
        });
    };
    let value = value.trim();
    let who = match value {
        "root" => return Ok(Who::Runner),
        "per-job" => Who::PerJob,
        _ => {
            let malformed = || ConfigError::Malformed {
                name: "TERRACE_TERRAFORM_USER".into(),
                value: value.to_owned(),
                expected: "per-job, UID[:GID] (e.g. 65534:65534), or root",
            };
            let (uid, gid) = match value.split_once(':') {
                Some((u, g)) => (
                    u.parse().map_err(|_| malformed())?,
                    g.parse().map_err(|_| malformed())?,
                ),
                None => {
                    let uid = value.parse().map_err(|_| malformed())?;
                    (uid, uid)
                }
            };
            if uid == 0 {
                return Ok(Who::Runner);
            }
            Who::One(RunAs { uid, gid })
        }
    };
    if !root {
        return Err(format!(
            "TERRACE_TERRAFORM_USER={value} needs the runner to run as root, to switch users; it runs as uid {euid}: unset it (terraform runs as the runner's own, unprivileged user)"
        )
        .into());
    }
    Ok(who)
}

impl TerraformConfig {
    /// How a runner that serves jobs, of several tenants, runs terraform: as
    /// `TERRACE_TERRAFORM_USER` says, by default as a user of each job's own when the runner
    /// is root; jobs that share a user run one at a time, and what each leaves running is
    /// killed before the next starts ([`crate::run::terraform::JobUser`]). `sole_user`: nothing but
    /// the runner runs as its uid here (a cloud function's container), so every other process
    /// of that uid counts as a job's leftover when the runner is not root.
    ///
    /// # Errors
    /// A malformed `TERRACE_TERRAFORM_USER`, or users to switch to when the runner cannot.
    pub fn serve_jobs(&mut self, sole_user: bool) -> Result<(), ConfigError> {
        self.set_user(terraform_user(true)?);
        self.shared_user = crate::run::terraform::SharedUser::OneAtATime {
            sole_user: sole_user && !nix::unistd::geteuid().is_root(),
        };
        Ok(())
    }

    /// How `terrace run` (one job, the machine's user's own) runs terraform: as
    /// `TERRACE_TERRAFORM_USER` says, by default as the runner's own user, root included: the
    /// job is its user's, with their credentials. Where a root CLI runs templates it does not
    /// trust, `per-job` gives the job a user of its own, as `serve` does by default.
    ///
    /// # Errors
    /// A malformed `TERRACE_TERRAFORM_USER`, or users to switch to when the runner cannot.
    pub fn run_one(&mut self) -> Result<(), ConfigError> {
        self.set_user(terraform_user(false)?);
        Ok(())
    }

    /// The user this job's terraform runs as, taken: a user of its own
    /// ([`JobUser::claim`](crate::run::terraform::JobUser::claim)) or its turn for the shared one
    /// ([`JobUser::take_turn`](crate::run::terraform::JobUser::take_turn)); given back, with what
    /// still runs as it killed, when the last copy of this configuration goes.
    ///
    /// # Errors
    /// Why the job cannot have a user now, as a sentence: every user taken, the lock folder,
    /// or what the job before left that cannot be killed.
    pub async fn take_user(&mut self) -> Result<(), String> {
        use crate::run::terraform::{JobUser, SharedUser};
        let user = if self.per_job_users {
            match JobUser::claim() {
                Ok(Some(user)) => user,
                Ok(None) => {
                    return Err("every terraform user of this host is taken by a job".into());
                }
                Err(e) => return Err(format!("cannot give terraform a user of its own: {e}")),
            }
        } else {
            let sole_user = match self.shared_user {
                SharedUser::OneAtATime { sole_user } => sole_user,
                SharedUser::Unguarded => false,
            };
            JobUser::take_turn(self.user, sole_user)
                .await
                .map_err(|survivors| survivors.to_string())?
        };
        self.user = user.run_as;
        self.job_user = Some(std::sync::Arc::new(user));
        Ok(())
    }

    pub(super) fn set_user(&mut self, who: Who) {
        (self.user, self.per_job_users) = match who {
            Who::Runner => (None, false),
            Who::One(user) => (Some(user), false),
            Who::PerJob => (None, true),
        };
    }
}

/// `TERRACE_JOB_MEMORY` (address space per process: `8g`, `512m`, bytes, or `off`; default 8
/// GiB) and `TERRACE_JOB_CPU_SECONDS` (CPU time per process, or `off`; default 3600): what each
/// process of a job may use.
///
/// # Errors
/// A value that is none of these, named.
pub fn job_limits() -> Result<crate::run::terraform::Limits, ConfigError> {
    let mut limits = crate::run::terraform::Limits::default();
    if let Some(v) = var("TERRACE_JOB_MEMORY") {
        limits.memory_bytes = memory_limit(&v).map_err(|expected| ConfigError::Malformed {
            name: "TERRACE_JOB_MEMORY".into(),
            value: v.clone(),
            expected,
        })?;
    }
    if let Some(v) = var("TERRACE_JOB_CPU_SECONDS") {
        limits.cpu_seconds = cpu_limit(&v).map_err(|expected| ConfigError::Malformed {
            name: "TERRACE_JOB_CPU_SECONDS".into(),
            value: v.clone(),
            expected,
        })?;
    }
    Ok(limits)
}

/// A memory limit: `4g`, `512m`, `65536k` or bytes, at least 64 MiB (less cannot start
/// terraform); `off` for none.
///
/// # Errors
/// What is expected, when `text` is not one.
pub fn memory_limit(text: &str) -> Result<Option<u64>, &'static str> {
    let text = text.trim().to_ascii_lowercase();
    if text == "off" {
        return Ok(None);
    }
    let (number, shift) = match text.as_bytes().last() {
        Some(b'k') => (&text[..text.len() - 1], 10),
        Some(b'm') => (&text[..text.len() - 1], 20),
        Some(b'g') => (&text[..text.len() - 1], 30),
        _ => (text.as_str(), 0),
    };
    number
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|b| *b >= 64 << 20)
        .map(Some)
        .ok_or("at least 64 MiB, as bytes or a number with k, m or g (e.g. 4g), or off")
}

/// A CPU time limit in seconds; `off` for none.
///
/// # Errors
/// What is expected, when `text` is not one.
pub fn cpu_limit(text: &str) -> Result<Option<u64>, &'static str> {
    match text.trim() {
        "off" => Ok(None),
        n => n
            .parse()
            .ok()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or("a number of seconds, or off"),
    }
}
