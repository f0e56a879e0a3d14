//! Enqueue to terraform's first output on a trigger (`benches/start-latency.sh`): each
//! trigger's test file has an ignored `start_latency` that queues jobs one at a time through the
//! real trigger and emulator, and reports with [`Samples`].
//!
//! Terraform's first output is read from the job's stored log (the `ts` of its first line on
//! terraform's stdout or stderr), the runner's share from the job's metrics record on the
//! function's stderr (`to_terraform_ms`: from asking for the lease to terraform's first command
//! starting). Both clocks are this machine's.

use std::time::SystemTime;

use serde_json::Value;
use shared::run::logs::{Stream, read_log};
use state_backends::{StateStore, WorkspaceId};
use time::OffsetDateTime;

/// How many jobs to time (`TERRACE_BENCH_N`, default 100), after one warm-up.
pub fn jobs() -> usize {
    std::env::var("TERRACE_BENCH_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

/// Milliseconds from `queued` to the first line terraform printed in the job's stored log.
///
/// # Panics
/// When the log cannot be read or has no line of terraform's.
pub async fn first_output_ms(
    store: &dyn StateStore,
    ws: &WorkspaceId,
    job_id: &str,
    queued: SystemTime,
) -> f64 {
    let lines = read_log(store, ws, job_id)
        .await
        .unwrap_or_else(|e| panic!("{job_id}'s log: {e}"));
    let first = lines
        .iter()
        .find(|l| l.stream != Stream::Runner)
        .unwrap_or_else(|| panic!("{job_id}'s log has no line of terraform's: {lines:?}"));
    let queued = OffsetDateTime::from(queued);
    (first.ts - queued).as_seconds_f64() * 1000.0
}

/// The runner's share of a job's start, from the job's metrics record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Lease asked -> terraform's first command (`to_terraform_ms`).
    pub to_terraform: u64,
    /// Lease asked -> held (`lease_wait_ms`).
    pub lease: u64,
    /// Lease held -> the reads under it done (`reads_ms`).
    pub reads: u64,
}

/// The job's share of its start from the metrics records among `stderr`'s lines.
///
/// # Panics
/// When there is no record for the job, or it lacks one of the figures.
pub fn share(stderr: &str, job_id: &str) -> Share {
    let record = stderr
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["metric"] == "terrace.job" && r["job_id"] == job_id)
        .unwrap_or_else(|| panic!("no metrics record for {job_id}"));
    let ms = |name: &str| {
        record[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{job_id}'s metrics record has no {name}: {record}"))
    };
    Share {
        to_terraform: ms("to_terraform_ms"),
        lease: ms("lease_wait_ms"),
        reads: ms("reads_ms"),
    }
}

/// The samples of one trigger.
#[derive(Default)]
pub struct Samples {
    first_output: Vec<f64>,
    runner: Vec<Share>,
}

impl Samples {
    pub fn add(&mut self, first_output_ms: f64, runner: Share) {
        self.first_output.push(first_output_ms);
        self.runner.push(runner);
    }

    /// Prints the percentiles, with `trigger` naming the path and `rest` saying what of the
    /// start is the trigger's.
    pub fn report(&self, trigger: &str, rest: &str) {
        let first: Vec<f64> = self.first_output.clone();
        let part = |f: fn(&Share) -> u64| -> Vec<f64> {
            self.runner.iter().map(|s| f(s) as f64).collect()
        };
        let runner = part(|s| s.to_terraform);
        println!("{trigger}: {} jobs one at a time", first.len());
        println!(
            "  enqueue -> terraform's first output: p50 {:.0} ms, p99 {:.0} ms, min {:.0}, max {:.0}",
            percentile(&first, 50.0),
            percentile(&first, 99.0),
            min(&first),
            max(&first)
        );
        println!(
            "  the runner's share (lease asked -> terraform's first command): p50 {:.0} ms, p99 {:.0} ms, max {:.0}",
            percentile(&runner, 50.0),
            percentile(&runner, 99.0),
            max(&runner)
        );
        for (name, values) in [
            ("the lease (asked -> held)", part(|s| s.lease)),
            ("the reads under it", part(|s| s.reads)),
            (
                "the rest (state server, workdir, checks)",
                part(|s| s.to_terraform.saturating_sub(s.lease + s.reads)),
            ),
        ] {
            println!(
                "    {name}: p50 {:.0} ms, p99 {:.0} ms, max {:.0}",
                percentile(&values, 50.0),
                percentile(&values, 99.0),
                max(&values)
            );
        }
        println!("  the rest: {rest}");
    }
}

/// The nearest-rank percentile `p` of `values`.
///
/// # Panics
/// When `values` is empty.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    assert!(!values.is_empty(), "no samples");
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[rank.min(v.len() - 1)]
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_over_sorted_samples() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
    }

    #[test]
    fn the_runners_share_is_read_from_the_jobs_own_record() {
        let stderr = "{\"level\":\"INFO\"}\nnot json\n\
            {\"metric\":\"terrace.job\",\"job_id\":\"a\",\"to_terraform_ms\":4,\"lease_wait_ms\":1,\"reads_ms\":2}\n\
            {\"metric\":\"terrace.job\",\"job_id\":\"b\",\"to_terraform_ms\":9,\"lease_wait_ms\":3,\"reads_ms\":4}\n";
        assert_eq!(
            share(stderr, "b"),
            Share {
                to_terraform: 9,
                lease: 3,
                reads: 4
            }
        );
    }
}
