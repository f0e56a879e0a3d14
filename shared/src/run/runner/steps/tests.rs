//! Unit tests of `steps`.

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

fn step_error(message: &str, category: Category) -> JobError {
    JobError {
        category,
        step: "apply".into(),
        address: Some("testcloud_cluster.main".into()),
        message: message.into(),
        hint: String::new(),
        retryable: false,
    }
}

#[test]
fn a_stopped_job_says_why_where_and_what_terraform_left() {
    let graceful = step_error("interrupted by the user", Category::Provider);
    let (status, e) = stopped_error(&StopReason::Timeout, graceful.clone());
    let e = e.unwrap();
    assert_eq!(status, Status::TimedOut);
    assert_eq!(e.category, Category::Timeout);
    assert_eq!(e.step, "apply");
    assert_eq!(e.address.as_deref(), Some("testcloud_cluster.main"));
    assert!(
        e.message.contains("past its timeout during apply"),
        "{}",
        e.message
    );
    assert!(e.message.contains("stopped gracefully"), "{}", e.message);

    let (status, e) = stopped_error(&StopReason::Shutdown, graceful.clone());
    assert_eq!(
        status,
        Status::Interrupted,
        "a host's shutdown is not final"
    );
    assert!(e.unwrap().retryable);

    let (status, e) = stopped_error(&StopReason::Cancelled, graceful.clone());
    assert_eq!(status, Status::Cancelled);
    assert_eq!(e.unwrap().category, Category::Cancelled);

    let (status, e) = stopped_error(&StopReason::LeaseLost("taken over".into()), graceful);
    let e = e.unwrap();
    assert_eq!(status, Status::Failed);
    assert_eq!(e.category, Category::StateConflict);
    assert!(e.message.contains("taken over"), "{}", e.message);

    let killed = step_error(
        &format!("{}: after the grace period", crate::run::classify::KILLED),
        Category::Internal,
    );
    let (_, e) = stopped_error(&StopReason::Timeout, killed);
    assert!(
        e.unwrap()
            .message
            .contains("may exist in the cloud without being in the state"),
        "a killed terraform may have left objects"
    );
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
