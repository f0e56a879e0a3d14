//! What went wrong, from terraform's exit and its diagnostics: a category the caller can branch
//! on, the step, the resource where terraform names one, a one-line message and a hint.
//! Reads the structured diagnostics of terraform's machine-readable UI where the step has them
//! (plan, apply: summary, detail, the resource's address), its `Error:` lines otherwise (init,
//! import). Unit-tested on real terraform output (`tests/fixtures/errors`, recorded by
//! `scripts/record-fixtures.sh`).

use crate::run::result::{Category, JobError};
use crate::run::terraform::{Interrupted, Outcome};

/// The message of a step whose terraform did not stop within the grace period.
pub const KILLED: &str = "terraform did not stop within the grace period and was killed";

/// Diagnostics that say only that terraform stopped.
const GENERIC: [&str; 2] = ["Error: execution halted", "Error: operation canceled"];

/// Classifies a failed terraform step from its exit and its error lines.
pub fn classify(step: &str, outcome: &Outcome) -> JobError {
    classify_after(step, outcome, 0)
}

/// Classifies a failed terraform step during which the runner's state server answered
/// `store_failures` of terraform's requests with 503, because the workspace's store failed with
/// an error that may pass. When terraform's error is then its backend giving up (`GET …/state
/// giving up after 3 attempt(s)`, `Failed to lock`), which reads like a broken configuration
/// or a held lock, it is the store's: transient. Any other error (a provider's, a state
/// terraform could not save) keeps its own category.
pub fn classify_after(step: &str, outcome: &Outcome, store_failures: u64) -> JobError {
    // Terraform adds its own "execution halted" to an interrupted run's diagnostics, before or
    // after the provider's: the provider's says more.
    let index = outcome
        .errors
        .iter()
        .position(|e| !GENERIC.iter().any(|g| e.starts_with(g)))
        .or((!outcome.errors.is_empty()).then_some(0));
    let first = index.map(|i| outcome.errors[i].clone());
    // `errors` starts with the UI's error diagnostics, in order: the chosen one's own address.
    let address = index
        .and_then(|i| outcome.events.errors().nth(i))
        .and_then(crate::run::ui::Diagnostic::resource_address)
        .or_else(|| first.as_deref().and_then(resource_address));
    let message = match (outcome.interrupted, first) {
        (Some(Interrupted::Killed), Some(first)) => {
            format!("{KILLED}; its last error: {first}")
        }
        (Some(Interrupted::Killed), None) => KILLED.to_owned(),
        (_, Some(first)) => first,
        (Some(Interrupted::Gracefully), None) => "terraform was interrupted".into(),
        (None, None) => format!("terraform {step} exited with code {:?}", outcome.exit_code),
    };
    let text = outcome.errors.join(" ").to_lowercase();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    let (category, hint, retryable) = if has(&[
        "failed to persist state",
        "failed to save state",
        "error saving state",
    ]) {
        (
            Category::StateConflict,
            "terraform could not save its state; the runner keeps terraform's own copy (errored.tfstate) in the run's folder and pushes it when the lease still allows",
            false,
        )
    } else if has(&["saved plan is stale"]) {
        (
            Category::StateConflict,
            "the workspace's state changed after the plan was made, so it was not applied and nothing was written; run the job again to plan again from the current state",
            true,
        )
    } else if store_failures > 0
        && has(&[
            "giving up after",
            "failed to get state",
            "failed to lock",
            "failed to unlock",
        ])
    {
        (
            Category::Transient,
            "the workspace's state store failed while terraform read, locked or wrote its state through the runner (the runner's log has the store's error); running the job again may succeed",
            true,
        )
    } else if has(CONFLICT_WORDS) {
        (
            Category::ProviderConflict,
            "the object already exists in the cloud but not in the workspace's state (a create that failed after the cloud made it, or an object made outside terraform): import it into the state, or delete it, then run the job again",
            false,
        )
    } else if has(&[
        "state lock",
        "locking state",
        "lease of",
        "lease lost",
        "is leased",
    ]) {
        (
            Category::StateConflict,
            "the workspace's state is locked by another run; wait for it or break a stale lease with `terrace state unlock`",
            true,
        )
    } else if has(&[
        "memoryerror",
        "cannot allocate memory",
        "out of memory",
        "failed to reserve page summary memory",
        "cpu time limit exceeded",
        "bad_alloc",
    ]) {
        (
            Category::ResourceLimit,
            "a process of the job (terraform, a provider or a provisioner) went over the runner's per-process limits, TERRACE_JOB_MEMORY and TERRACE_JOB_CPU_SECONDS: give the job less to do, or raise the limits",
            false,
        )
    } else if has(TRANSIENT_WORDS) {
        (
            Category::Transient,
            "a temporary failure of the cloud API; running the job again may succeed",
            true,
        )
    } else if has(&["quota", "limit exceeded", "limit reached"]) {
        (
            Category::Quota,
            "a quota of the cloud account is exhausted; raise it or use fewer resources",
            false,
        )
    } else if has(&[
        "unauthorized",
        "forbidden",
        "access denied",
        "accessdenied",
        "credentials",
        "not authorized",
    ]) {
        (
            Category::Auth,
            "the credentials terraform uses cannot do this; check the role or service account granted to the runner",
            false,
        )
    } else if step == "init" {
        (
            Category::Validation,
            "terraform could not initialise: check the template's providers and modules (sources and versions) and that the runner reaches their registry or mirror",
            false,
        )
    } else if has(&[
        "unsupported argument",
        "missing required argument",
        "invalid value",
        "reference to undeclared",
        "invalid reference",
    ]) {
        (
            Category::Validation,
            "the template's terraform configuration is invalid for these variables; fix the template or the job's variables",
            false,
        )
    } else {
        (
            Category::Provider,
            "the provider reported an error; read the message and the log of the step",
            false,
        )
    };
    JobError::new(category, step, message, hint, retryable).at(address)
}

/// What a provider's "the object already exists" says, lowercased.
pub const CONFLICT_WORDS: &[&str] = &[
    "already exists",
    "alreadyexists",
    "already own",
    "409 conflict",
    "error 409",
];

/// What a temporary failure of a cloud API says, lowercased: the request may or may not have
/// been carried out.
pub const TRANSIENT_WORDS: &[&str] = &[
    "throttl",
    "rate exceeded",
    "requestlimitexceeded",
    "503",
    "please retry",
    "timeout",
    "timed out",
    "internalerror",
    "internal error",
    "connection reset",
];

/// The resource a diagnostic is about: `with ADDRESS,` (terraform 0.15.4 and later, with the
/// instance key), else `in resource "TYPE" "NAME"` (the resource block, without a key).
pub fn resource_address(message: &str) -> Option<String> {
    if let Some(rest) = message.split(" — with ").nth(1) {
        let address = rest.split([',', ' ']).next().unwrap_or_default();
        if !address.is_empty() {
            return Some(address.to_owned());
        }
    }
    let rest = message.split("in resource \"").nth(1)?;
    let mut parts = rest.split('"');
    let (type_name, _, name) = (parts.next()?, parts.next()?, parts.next()?);
    Some(format!("{type_name}.{name}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::run::terraform;

    /// Real terraform output (Terraform v1.11.4 with the testcloud provider's injected faults),
    /// as recorded in `tests/fixtures/errors` by `scripts/record-fixtures.sh`.
    fn classify_fixture(step: &str, text: &str) -> JobError {
        let (errors, events) = terraform::read_output(text);
        let outcome = Outcome {
            exit_code: Some(1),
            stdout: Vec::new(),
            errors,
            events,
            interrupted: None,
            duration: Duration::ZERO,
        };
        classify(step, &outcome)
    }

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../tests/fixtures/errors/", $name))
        };
    }

    #[test]
    fn failures_are_classified_from_real_terraform_output() {
        let cases = [
            (
                "apply",
                fixture!("apply-transient.jsonl"),
                Category::Transient,
                true,
                "RequestLimitExceeded",
            ),
            (
                "apply",
                fixture!("apply-quota.jsonl"),
                Category::Quota,
                false,
                "vCPU limit 32",
            ),
            (
                "apply",
                fixture!("apply-auth.jsonl"),
                Category::Auth,
                false,
                "AccessDenied",
            ),
            (
                "apply",
                fixture!("apply-already-exists.jsonl"),
                Category::ProviderConflict,
                false,
                "already exists",
            ),
            (
                "apply",
                fixture!("apply-false-failure.jsonl"),
                Category::Transient,
                true,
                "InternalError",
            ),
            (
                "plan",
                fixture!("plan-undeclared-variable.jsonl"),
                Category::Validation,
                false,
                "undeclared input variable",
            ),
            (
                "init",
                fixture!("init-provider-missing.stdout"),
                Category::Validation,
                false,
                "provider packages",
            ),
        ];
        assert!(
            classify_fixture("init", fixture!("init-provider-missing.stdout"))
                .hint
                .contains("providers and modules")
        );
        for (step, text, category, retryable, words) in cases {
            let e = classify_fixture(step, text);
            assert_eq!(
                (e.category, e.retryable),
                (category, retryable),
                "{words}: {e:?}"
            );
            assert!(
                e.message.starts_with("Error: ") && e.message.contains(words),
                "{e:?}"
            );
            assert_eq!(e.step, step);
            assert!(!e.hint.is_empty());
            if step == "apply" {
                // Named by terraform's diagnostic, not parsed from text.
                let resource = if words == "already exists" || words == "InternalError" {
                    "testcloud_network.main"
                } else {
                    "testcloud_cluster.main"
                };
                assert_eq!(e.address.as_deref(), Some(resource), "{e:?}");
            }
        }
    }

    #[test]
    fn the_message_carries_the_location_line_after_the_error() {
        let e = classify_fixture("apply", fixture!("apply-quota.jsonl"));
        assert!(e.message.contains("on main.tf line 19"), "{}", e.message);
    }

    #[test]
    fn a_provider_error_is_preferred_to_terraforms_execution_halted() {
        let outcome = Outcome {
            exit_code: Some(1),
            stdout: Vec::new(),
            errors: vec![
                "Error: execution halted".into(),
                "Error: create cancelled — on main.tf line 19, in resource \"t\" \"x\":".into(),
            ],
            events: Default::default(),
            interrupted: Some(Interrupted::Gracefully),
            duration: Duration::ZERO,
        };
        let e = classify("apply", &outcome);
        assert!(e.message.starts_with("Error: create cancelled"), "{e:?}");
        assert_eq!(e.address.as_deref(), Some("t.x"));
    }

    #[test]
    fn a_backend_that_gave_up_because_the_store_failed_is_transient() {
        let failed = |error: &str| Outcome {
            exit_code: Some(1),
            stdout: Vec::new(),
            errors: vec![error.into()],
            events: Default::default(),
            interrupted: None,
            duration: Duration::ZERO,
        };
        // terraform 1.11.4's words when the http backend's retries ran out.
        let read = failed(
            "Error: Error refreshing state: Failed to get state: GET http://127.0.0.1:44473/state giving up after 3 attempt(s)",
        );
        let lock = failed(
            "Error: Error acquiring the state lock — Error message: Failed to lock: LOCK http://127.0.0.1:33331/state giving up after 3 attempt(s)",
        );
        // Without store failures the words alone decide (a broken init, a held lock).
        assert_eq!(classify("init", &read).category, Category::Validation);
        assert_eq!(classify("plan", &lock).category, Category::StateConflict);
        for (step, outcome) in [("init", &read), ("plan", &lock)] {
            let e = classify_after(step, outcome, 2);
            assert_eq!(e.category, Category::Transient, "{e:?}");
            assert!(e.retryable);
            assert!(e.hint.contains("state store failed"), "{}", e.hint);
        }
        // A provider's error after a 503 terraform got past keeps its category.
        let conflict = failed(
            "Error: resource already exists: testcloud_network \"c\" (id net-1) — on main.tf line 17, in resource \"testcloud_network\" \"n\":",
        );
        let e = classify_after("apply", &conflict, 1);
        assert_eq!(e.category, Category::ProviderConflict, "{e:?}");
        let denied = failed("Error: AccessDenied: not authorized to create the bucket");
        assert_eq!(classify_after("apply", &denied, 1).category, Category::Auth);
        // A state terraform could not save keeps its own handling (errored.tfstate).
        let save = failed("Error: Failed to save state: HTTP error: 503");
        let e = classify_after("apply", &save, 3);
        assert_eq!(e.category, Category::StateConflict);
        assert!(!e.retryable);
    }

    #[test]
    fn the_address_comes_from_the_with_line_when_terraform_prints_one() {
        let newer =
            "Error: creating bucket: BucketAlreadyExists — with aws_s3_bucket.logs[\"eu\"],";
        assert_eq!(
            resource_address(newer).as_deref(),
            Some("aws_s3_bucket.logs[\"eu\"]")
        );
        let older = "Error: boom — on main.tf line 7, in resource \"testcloud_network\" \"net\":";
        assert_eq!(
            resource_address(older).as_deref(),
            Some("testcloud_network.net")
        );
        assert_eq!(
            resource_address("Error: Failed to load plugin schemas"),
            None
        );
    }

    /// What terraform says when a process of the job met its resource limits: a provisioner's
    /// allocation refused, a process stopped at its CPU time.
    #[test]
    fn a_process_over_its_limits_is_a_resource_limit_never_a_quota() {
        for said in [
            "Error: local-exec provisioner error: Error running command: exit status 1. Output: MemoryError",
            "Error: local-exec provisioner error: Error running command: signal: CPU time limit exceeded",
            "fatal error: runtime: out of memory",
        ] {
            let outcome = Outcome {
                exit_code: Some(1),
                stdout: Vec::new(),
                errors: vec![said.to_owned()],
                events: Default::default(),
                interrupted: None,
                duration: Duration::ZERO,
            };
            let e = classify("apply", &outcome);
            assert_eq!(e.category, Category::ResourceLimit, "{said}");
            assert!(!e.retryable);
        }
    }
}
