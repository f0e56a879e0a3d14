//! A state terraform could not save to the backend (`errored.tfstate`): kept in the store as it
//! is, then pushed as the next state version, each tried again while the store fails.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use state_backends::StoreError;

use crate::run::records::ERRORED_STATE;
use crate::run::result::UnsavedState;
use crate::run::retry::Tries;

use super::Runner;
use super::report::Report;
use super::steps::Steps;

impl Runner {
    /// `errored.tfstate`, if terraform left one. The workdir is terraform's (its user's, when
    /// it has one): what is there is read as terraform left it, never through a link it made,
    /// never beyond a state's size.
    async fn read_unsaved(&self, path: &std::path::Path, s: &Steps<'_>) -> Option<Bytes> {
        let read = {
            let (path, cap) = (path.to_owned(), self.config.max_state_bytes);
            tokio::task::spawn_blocking(move || read_own_file(&path, cap)).await
        };
        match read {
            Ok(Ok(Some(data))) => Some(Bytes::from(data)),
            Ok(Ok(None)) | Err(_) => None,
            Ok(Err(why)) => {
                s.logger
                    .runner("apply", &format!("{ERRORED_STATE} is not kept: {why}"))
                    .await;
                None
            }
        }
    }

    /// Terraform's own copy of a state it could not save (`errored.tfstate`): kept as a run
    /// artifact first, then pushed as a new version with the checks and the fence of any write
    /// from terraform. True when it is now the workspace's current state.
    pub(super) async fn keep_unsaved_state(&self, s: &Steps<'_>, report: &mut Report) -> bool {
        let path = s.dir.join(ERRORED_STATE);
        let Some(data) = self.read_unsaved(&path, s).await else {
            return false;
        };
        let mut unsaved = UnsavedState {
            artifact: format!("runs/{}/{ERRORED_STATE}", s.job_id),
            pushed_as: None,
            error: None,
        };
        s.logger
            .runner(
                "apply",
                &format!(
                    "terraform could not save its state ({} bytes in {ERRORED_STATE}); keeping it and pushing it",
                    data.len()
                ),
            )
            .await;
        let mut errors = Vec::new();
        // While the job runs, every wait; once it is stopped, 3 tries in all, so that a store
        // that does not answer cannot hold a stopped job much longer.
        let tries = Tries::after(&UNSAVED_WAITS).until(s.stop, 3);
        let kept = tries
            .run(
                "could not keep the unsaved state",
                StoreError::is_retryable,
                || {
                    self.store
                        .put_artifact(s.ws, s.job_id, ERRORED_STATE, data.clone())
                },
            )
            .await;
        if let Err(e) = kept {
            // The workdir is kept so the file is not lost with it.
            errors.push(format!(
                "cannot keep it in the store ({e}); it stays in {}",
                path.display()
            ));
            unsaved.artifact = path.display().to_string();
            report.keep_workdir = true;
        }
        let push = || async {
            s.server
                .push(data.clone())
                .await
                .map_err(|(why, retryable)| Refused { why, retryable })
        };
        let pushed = match tries
            .run("could not push the unsaved state", |e| e.retryable, push)
            .await
        {
            Ok(version) => {
                unsaved.pushed_as = version;
                let saved = version.map_or_else(
                    || "it was already the current state".to_owned(),
                    |v| format!("saved as state version {v}"),
                );
                s.logger
                    .runner("apply", &format!("the unsaved state is {saved}"))
                    .await;
                true
            }
            Err(Refused { why, .. }) => {
                errors.push(format!("cannot push it: {why}"));
                s.logger
                    .runner(
                        "apply",
                        &format!(
                            "the unsaved state cannot be pushed ({why}); it is kept as {}",
                            unsaved.artifact
                        ),
                    )
                    .await;
                false
            }
        };
        if errors.is_empty() || pushed {
            // Handled: a later step in this workdir must not see it again.
            let _ = tokio::fs::remove_file(&path).await;
        }
        unsaved.error = (!errors.is_empty()).then(|| errors.join("; "));
        report.unsaved_state = Some(unsaved);
        pushed
    }
}

/// Whether a diagnostic is terraform failing to save its state (and nothing else).
pub(super) fn is_state_save_error(message: &str) -> bool {
    let m = message.to_lowercase();
    [
        "failed to persist state",
        "failed to save state",
        "error saving state",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// A regular file in a workdir, read without following a link and only up to `cap` bytes;
/// `None` when there is none.
///
/// # Errors
/// Why it is not read: a link, a special file (a FIFO would hang the job), too large.
pub(super) fn read_own_file(path: &Path, cap: usize) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open it as a plain file: {e}")),
    };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    let mut data = Vec::new();
    file.take(u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    if data.len() > cap {
        return Err(format!("it is larger than {cap} bytes"));
    }
    Ok(Some(data))
}

/// The waits between tries of keeping and of pushing a state terraform could not save, while
/// the store fails: 31 s in all, enough to ride out a short outage of the store. A stopped job
/// (its deadline, a shutdown, its lease lost) makes 3 tries in all, without waiting.
const UNSAVED_WAITS: [Duration; 5] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(16),
];

/// The state server's refusal of a pushed state.
struct Refused {
    why: String,
    retryable: bool,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_failure_to_save_the_state_counts_as_one() {
        assert!(is_state_save_error("Failed to save state: HTTP error: 409"));
        assert!(is_state_save_error("Error saving state: context deadline"));
        assert!(is_state_save_error("Failed to persist state to backend"));
        assert!(!is_state_save_error("Error acquiring the state lock"));
        assert!(!is_state_save_error(
            "Error: creating network: quota exceeded"
        ));
    }

    #[test]
    fn a_file_terraform_left_is_read_only_as_a_plain_file_of_bounded_size() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("errored.tfstate");
        assert_eq!(read_own_file(&file, 10).unwrap(), None, "none there");
        std::fs::write(&file, b"{}").unwrap();
        assert_eq!(
            read_own_file(&file, 10).unwrap().as_deref(),
            Some(&b"{}"[..])
        );
        assert!(
            read_own_file(&file, 1)
                .unwrap_err()
                .contains("larger than 1 bytes")
        );
        // A link to a file of the runner's (its environment, say) is not followed.
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"runner-secret").unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(&secret, &file).unwrap();
        let e = read_own_file(&file, 1024).unwrap_err();
        assert!(e.contains("cannot open it as a plain file"), "{e}");
        // A FIFO would block the job forever: refused at once.
        std::fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(
            read_own_file(&file, 1024)
                .unwrap_err()
                .contains("not a regular file")
        );
    }
}
