//! Replays the checked-in fuzz inputs (`fuzz/seeds/<target>/`, named seeds and regressions, and
//! `fuzz/corpus/<target>/`, what the fuzzer kept) through each target's checks, on stable:
//! every one stays a test. `make fuzz` grows the corpus.

use std::path::PathBuf;

fn replay(target: &str, check: fn(&[u8])) {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut inputs: Vec<PathBuf> = Vec::new();
    for kind in ["seeds", "corpus"] {
        let dir = fuzz.join(kind).join(target);
        let found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            found.len() >= 5,
            "{}: {} inputs",
            dir.display(),
            found.len()
        );
        inputs.extend(found);
    }
    inputs.sort();
    for input in inputs {
        let data = std::fs::read(&input).unwrap();
        let outcome = std::panic::catch_unwind(|| check(&data));
        assert!(
            outcome.is_ok(),
            "{target}: {} fails its check",
            input.display()
        );
    }
}

#[test]
fn the_job_corpus_passes() {
    replay("job", fuzz_targets::job);
}

#[test]
fn the_tfstate_corpus_passes() {
    replay("tfstate", fuzz_targets::tfstate);
}

#[test]
fn the_state_server_corpus_passes() {
    replay("state_server", fuzz_targets::state_server);
}
