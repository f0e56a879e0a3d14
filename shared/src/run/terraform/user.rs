//! Who terraform runs as: a user of each job's own when the runner is root ([`JobUser::claim`]),
//! or the one user jobs share, one job at a time ([`JobUser::take_turn`]); either way, what a
//! job leaves running is killed before the user is given to the next.

use std::path::Path;

use crate::run::leftovers::{self, Leftovers, Survivors};

/// What a runner does between jobs that share a user.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SharedUser {
    /// Nothing: jobs run side by side, and what one leaves may meet the next.
    #[default]
    Unguarded,
    /// One job at a time; what a job leaves is killed before the next starts. `sole_user`:
    /// nothing but the runner runs as its uid on this machine (a cloud function's sandbox when
    /// it is not root, as on Lambda), so every other process of that uid is a job's leftover;
    /// otherwise the runner's descendants are.
    OneAtATime { sole_user: bool },
}

/// The users jobs take, one each at a time: `FIRST_JOB_UID` and the next `JOB_USERS - 1`,
/// each with a group of the same number. (Within 65536, so they exist in a container's user
/// namespace too.)
pub const FIRST_JOB_UID: u32 = 61000;

pub const JOB_USERS: usize = 64;

/// The user a job's terraform runs as, held for as long as the job runs: what it leaves
/// running is killed when it is given back, and again before the next job may take it (see
/// [`crate::run::leftovers`]). Either a user of the job's own, from the [`FIRST_JOB_UID`] range
/// ([`JobUser::claim`], the runner is root), or this runner's one turn for a user every job
/// shares ([`JobUser::take_turn`]: the runner's own, or `TERRACE_TERRAFORM_USER`'s), since
/// jobs of one user cannot be kept apart while they run side by side.
#[derive(Debug)]
pub struct JobUser {
    /// `None`: the runner's own user.
    pub run_as: Option<RunAs>,
    leftovers: Leftovers,
    _held: Held,
}

/// What keeps a [`JobUser`] to one job.
#[derive(Debug)]
enum Held {
    /// A user of the job's own: a lock file per user, in the temp folder, machine-wide (several
    /// runners may share a machine), which the kernel frees if the runner dies.
    Lock(#[allow(dead_code, reason = "held for its lock, never read")] std::fs::File),
    /// A shared user: the runner's turn, one job at a time.
    Turn(
        #[allow(dead_code, reason = "held for its turn, never read")]
        tokio::sync::OwnedMutexGuard<()>,
    ),
}

/// The one turn of this process's jobs that share a user.
static TURN: std::sync::LazyLock<std::sync::Arc<tokio::sync::Mutex<()>>> =
    std::sync::LazyLock::new(Default::default);

impl JobUser {
    /// A free user of the job's own, or `None` when [`JOB_USERS`] jobs run on this machine
    /// already. A user whose leftovers (a dead runner's job's) cannot all be killed is passed
    /// over.
    ///
    /// # Errors
    /// When the users' lock folder cannot be made.
    pub fn claim() -> std::io::Result<Option<Self>> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join("terrace-job-users");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        for slot in 0..JOB_USERS {
            let id = FIRST_JOB_UID + u32::try_from(slot).unwrap_or(0);
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(format!("{id}.lock")))?;
            if lock.try_lock().is_err() {
                continue;
            }
            let leftovers = Leftovers::User(id);
            if let Err(e) = leftovers::kill_all(leftovers, leftovers::WAIT) {
                tracing::error!(uid = id, error = %e, "a job's user is passed over");
                continue;
            }
            return Ok(Some(Self {
                run_as: Some(RunAs { uid: id, gid: id }),
                leftovers,
                _held: Held::Lock(lock),
            }));
        }
        Ok(None)
    }

    /// This runner's turn to run a job as `user` (`None`: its own), which every job shares:
    /// waits for the job before to be done, then kills what it left. `sole_user`: nothing but
    /// the runner runs as its own uid here, so every other process of that uid is a leftover.
    ///
    /// # Errors
    /// [`Survivors`] when what the job before left cannot all be killed: no job may run then.
    pub async fn take_turn(user: Option<RunAs>, sole_user: bool) -> Result<Self, Survivors> {
        let turn = TURN.clone().lock_owned().await;
        let leftovers = match user {
            Some(user) => Leftovers::User(user.uid),
            None => Leftovers::Mine {
                whole_uid: sole_user,
            },
        };
        // Walked here, as `claim` and the drop do: a /proc walk, blocking only while something
        // is still dying.
        leftovers::kill_all(leftovers, leftovers::WAIT)?;
        Ok(Self {
            run_as: user,
            leftovers,
            _held: Held::Turn(turn),
        })
    }
}

impl Drop for JobUser {
    fn drop(&mut self) {
        // The user (or the turn) goes with `self` after this; the next taker kills again, and
        // runs nothing while anything survives.
        let whose = match self.run_as {
            Some(user) => format!("uid {}", user.uid),
            None => "the runner's user".to_owned(),
        };
        match leftovers::kill_all(self.leftovers, leftovers::WAIT) {
            Ok(0) => {}
            Ok(n) => tracing::info!("killed {n} process(es) the job left running as {whose}"),
            Err(e) => tracing::error!(error = %e, "the job left processes running as {whose}"),
        }
    }
}

/// An unprivileged user and group terraform runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
}

impl RunAs {
    /// `nobody:nogroup` on Debian and most images.
    pub const NOBODY: RunAs = RunAs {
        uid: 65534,
        gid: 65534,
    };

    /// Gives `path`, and everything under it, to this user (symbolic links themselves, never
    /// what they point to), except the names in `keep`.
    ///
    /// # Errors
    /// The first file that cannot be given.
    pub fn give(self, path: &Path, keep: &[&str]) -> std::io::Result<()> {
        // Deepest first: a folder stays the runner's (and closed to the user) until everything
        // in it is given, so the user cannot swap an entry for a link while it is walked.
        if std::fs::symlink_metadata(path)?.is_dir() {
            for entry in std::fs::read_dir(path)? {
                let entry = entry?;
                if keep.iter().any(|k| entry.file_name() == *k) {
                    continue;
                }
                self.give(&entry.path(), &[])?;
            }
        }
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
    }
}
