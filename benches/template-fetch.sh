#!/usr/bin/env bash
# What reading templates from a bucket costs a job, against moto: `terrace validate` of a job
# naming `stack 1.0.0` (a template pinning two library modules, tests/templates) with the
# templates in a folder, in a bucket whose copy the runner already holds (warm: one listing
# read per template and module), and in a bucket read afresh (cold: the listings and every
# file, checked, into a new cache). Interleaved, N runs each (default 15); prints the medians
# and the S3 requests per run from moto's request log. `validate` is the part of a job that
# fetches: the same fetch runs before every job in every function.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-15}"

if [[ -z "${TERRACE_TEST_MOTO:-}" ]]; then
    scripts/install-tools.sh >/dev/null
    cargo build --quiet -p local
    exec scripts/with-emulators.sh "$0" "$@"
fi

bin="$(scripts/target-dir.sh)/debug/terrace"
py="$repo_root/.cache/moto/bin/python"
log="$TERRACE_TEST_MOTO_LOG"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export AWS_ENDPOINT_URL="$TERRACE_TEST_MOTO" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
: > "$work/empty"
export AWS_REGION=us-east-1 AWS_CONFIG_FILE="$work/empty" AWS_SHARED_CREDENTIALS_FILE="$work/empty"
export TERRACE_S3_FORCE_PATH_STYLE=1 TERRACE_STORE="$work/store"
bucket="bench-templates-$(date +%s)"
"$py" - "$TERRACE_TEST_MOTO" "$bucket" <<'PY'
import sys, boto3
url, bucket = sys.argv[1:]
boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
PY
url="s3://$bucket/templates"
"$bin" --templates tests/templates template publish stack 1.0.0 --to "$url" >/dev/null
cat > "$work/job.yaml" <<'YAML'
id: bench
tenant: acme
workspace: bench
operation: apply
template: { name: stack, version: 1.0.0 }
variables: { name: bench, node_count: 2 }
YAML
# The warm cache holds the published copy before the first timed run.
"$bin" --templates "$url" --template-cache "$work/warm" validate "$work/job.yaml" >/dev/null

now_ms() { date +%s%3N; }
requests() { wc -l < "$log"; }
sides=(folder warm cold)
for side in "${sides[@]}"; do : > "$work/$side.ms"; : > "$work/$side.calls"; done
for i in $(seq "$N"); do
    for side in "${sides[@]}"; do
        case "$side" in
            folder) args=(--templates tests/templates) ;;
            warm) args=(--templates "$url" --template-cache "$work/warm") ;;
            cold) args=(--templates "$url" --template-cache "$work/cold-$i") ;;
        esac
        c0=$(requests); t0=$(now_ms)
        "$bin" "${args[@]}" validate "$work/job.yaml" >/dev/null
        t1=$(now_ms); c1=$(requests)
        echo $((t1 - t0)) >> "$work/$side.ms"; echo $((c1 - c0)) >> "$work/$side.calls"
    done
done
python3 - "$work" "$N" <<'PY'
import statistics, sys
work, n = sys.argv[1], sys.argv[2]
read = lambda f: [int(x) for x in open(f"{work}/{f}").read().split()]
print(f"terrace validate of stack 1.0.0 (2 pinned modules), {n} runs each, medians:")
for side, what in [("folder", "templates in a folder"),
                   ("warm", "from S3, the runner's copy current"),
                   ("cold", "from S3, fetched afresh")]:
    ms, calls = read(f"{side}.ms"), read(f"{side}.calls")
    print(f"  {what:<36} {statistics.median(ms):5.0f} ms   S3 requests {statistics.median(calls):.0f}")
PY
