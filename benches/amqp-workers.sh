#!/usr/bin/env bash
# Self-hosted workers on RabbitMQ: throughput and enqueue to terraform's first output with 1, 2
# and 3 `terrace serve --queue amqp://…` workers (`--concurrency 1` each) sharing N jobs (default
# 30, each the demo apply on a workspace of its own, all queued at once, after one warm-up job
# per worker), against the RabbitMQ node scripts/with-emulators.sh starts and the folder store.
# The first output is the `ts` of terraform's first line in each job's stored log; with all jobs
# queued at once, it includes the wait for a free worker. PROFILE=release uses release builds.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-30}"
PROFILE="${PROFILE:-debug}"
profile_flag=()
[[ "$PROFILE" == release ]] && profile_flag=(--release)
scripts/install-tools.sh >/dev/null
cargo build --quiet "${profile_flag[@]}" -p local
TERRACE_BENCH_N="$N" scripts/with-emulators.sh cargo test --quiet "${profile_flag[@]}" -p tests \
    --test amqp -- --ignored --exact workers_throughput --nocapture --test-threads 1 |
    grep -v -e '^running ' -e '^test result' -e '^$' -e '^[.i]*$'
