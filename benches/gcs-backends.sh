#!/usr/bin/env bash
# terraform's own `gcs` backend (state object plus a `.tflock` object written with
# ifGenerationMatch=0) versus a whole job through `terrace run` on a GCS store: the same
# fake-gcs-server, the same run, interleaved, N runs each (default 5). Both sides apply the demo
# template to an empty workspace the way a reviewed plan is applied: init, plan -out, apply of
# the plan (Terrace reads the changes and outputs from the -json messages of the same two
# commands). The Terrace side is a whole job: the lease, the previous-result check, validation
# of every state write, a new version per write, the log and the result in the bucket.
#
# The `gcs` backend is pointed at the emulator with `storage_custom_endpoint` and a dummy
# `access_token` (fake-gcs-server checks no credentials; real GCS would need a real token, as
# Terrace would need application default credentials). Terrace reaches it as the tests do:
# TERRACE_GCS_ENDPOINT with TERRACE_GCS_ANONYMOUS=1.
#
# Timed runs go to scripts/with-emulators.sh's fake-gcs-server (log level warn: no request
# log). Requests are counted afterwards, untimed, in COUNT_N more runs per side (default 3)
# against a second fake-gcs-server this script starts at log level info, which logs one line per
# request. Prints the medians, the ratio and the GCS requests per job.
# PROFILE=release (default debug) uses the release build of terrace.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-5}"
COUNT_N="${COUNT_N:-3}"
PROFILE="${PROFILE:-debug}"

if [[ -z "${TERRACE_TEST_GCS:-}" ]]; then
    scripts/install-tools.sh
    if [[ "$PROFILE" == release ]]; then cargo build --quiet --release -p local; else cargo build --quiet -p local; fi
    exec scripts/with-emulators.sh "$0" "$@"
fi

bin="$(scripts/target-dir.sh)/$PROFILE/terrace"
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
counter_pid=""
finish() {
    local rc=$?
    if [[ -n "$counter_pid" ]]; then kill "$counter_pid" 2>/dev/null || true; wait "$counter_pid" 2>/dev/null || true; fi
    if [[ $rc -ne 0 ]]; then
        for f in "$work"/native.err "$work"/terrace.err; do
            [[ -s "$f" ]] && { echo "--- tail of $(basename "$f")" >&2; tail -n 30 "$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap finish EXIT
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
bucket="bench-$(date +%s)"

make_bucket() { # ENDPOINT
    python3 - "$1" "$bucket" <<'PY'
import json, sys, urllib.request
url, bucket = sys.argv[1:]
req = urllib.request.Request(f"{url}/storage/v1/b?project=bench", data=json.dumps({"name": bucket}).encode(),
                             headers={"content-type": "application/json"}, method="POST")
urllib.request.urlopen(req, timeout=10).read()
PY
}
make_bucket "$TERRACE_TEST_GCS"

vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'
now_ms() { date +%s%3N; }

# native ENDPOINT RUN
native() {
    local d="$work/native-$2"
    mkdir -p "$d" "$work/cloud-native-$2"
    cp templates/demo/1.0.0/*.tf "$d/"
    echo "$vars" > "$d/terraform.tfvars.json"
    cat > "$d/backend_override.tf" <<HCL
terraform {
  backend "gcs" {
    bucket                  = "$bucket"
    prefix                  = "native/ws-$2"
    storage_custom_endpoint = "$1/storage/v1/"
    access_token            = "x" # a dummy: the emulator checks no credentials
  }
}
HCL
    (
        cd "$d"
        export TESTCLOUD_ROOT="$work/cloud-native-$2"
        "$tf" init -input=false -no-color >/dev/null
        "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
        "$tf" apply -input=false -no-color p.tfplan >/dev/null
    ) 2>>"$work/native.err"
}

# terrace ENDPOINT RUN
terrace() {
    mkdir -p "$work/cloud-terrace-$2"
    cat > "$work/job-$2.yaml" <<JOB
id: bench-$2
tenant: bench
workspace: ws-$2
operation: apply
template: { name: demo, version: 1.0.0 }
variables: $vars
JOB
    TERRACE_STORE="gs://$bucket/terrace" TERRACE_GCS_ENDPOINT="$1" TERRACE_GCS_ANONYMOUS=1 \
        TERRACE_TEMPLATES="$repo_root/templates" TERRACE_TERRAFORM="$tf" \
        TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" TERRACE_CACHE_DIR="$work/terrace-cache" \
        TERRACE_PASS_ENV=TESTCLOUD_ROOT TESTCLOUD_ROOT="$work/cloud-terrace-$2" TERRACE_LOG=warn \
        "$bin" run -q "$work/job-$2.yaml" >/dev/null 2>>"$work/terrace.err"
}

sides=(native terrace)
for side in "${sides[@]}"; do : > "$work/$side.ms"; done
for side in "${sides[@]}"; do "$side" "$TERRACE_TEST_GCS" warmup; done
for i in $(seq 1 "$N"); do
    for side in "${sides[@]}"; do
        t0=$(now_ms); "$side" "$TERRACE_TEST_GCS" "$i"; t1=$(now_ms)
        echo $((t1 - t0)) >> "$work/$side.ms"
    done
done

# Counting: a fake-gcs-server of our own at log level info (one line per request).
fake_gcs="$(scripts/install-fake-gcs.sh)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
counted="http://127.0.0.1:$port"
log="$work/fake-gcs-counted.log"
"$fake_gcs" -scheme http -host 127.0.0.1 -port "$port" -backend memory -external-url "$counted" \
    -public-host "127.0.0.1:$port" -log-level info >>"$log" 2>&1 &
counter_pid=$!
for _ in $(seq 1 100); do
    curl -s -o /dev/null "$counted/storage/v1/b" && break
    sleep 0.1
done
make_bucket "$counted"
requests() { grep -cE ' HTTP/[0-9.]+\\" ' "$log" || true; }
settled() { # waits until the log stops growing (a line is written after its response)
    local a b
    a=$(requests)
    while sleep 0.2; b=$(requests); [[ "$a" != "$b" ]]; do a=$b; done
    echo "$b"
}
for side in "${sides[@]}"; do : > "$work/$side.calls"; done
for i in $(seq 1 "$COUNT_N"); do
    for side in "${sides[@]}"; do
        c0=$(settled)
        echo "== $side count-$i" >> "$log"
        "$side" "$counted" "count-$i"
        c1=$(settled)
        echo $((c1 - c0)) >> "$work/$side.calls"
    done
done

python3 - "$work" "$N" "$COUNT_N" "$PROFILE" "$("$tf" version -json | python3 -c 'import json,sys; print(json.load(sys.stdin)["terraform_version"])')" <<'PY'
import collections, re, statistics, sys
w, n, count_n, profile, version = sys.argv[1:6]
read = lambda f: [int(x) for x in open(f"{w}/{f}")]
ms = {s: read(f"{s}.ms") for s in ("native", "terrace")}
calls = {s: read(f"{s}.calls") for s in ms}
med = {s: statistics.median(v) for s, v in ms.items()}
# Requests by method, per side, over the counted runs (then divided by their number).
kinds = {s: collections.Counter() for s in ms}
side = None
for line in open(f"{w}/fake-gcs-counted.log"):
    if line.startswith("== "):
        side = line.split()[1]
        continue
    m = re.search(r'\\"([A-Z]+) (\S+) HTTP/[0-9.]+\\" (\d+)', line)
    if m and side:
        kinds[side][m.group(1)] += 1
print(f"runs: {n} each, interleaved; terraform {version}; terrace {profile} build; fake-gcs-server")
print(f"native gcs backend:              median {med['native']:.0f} ms  {ms['native']}")
print(f"terrace (whole job, GCS store):  median {med['terrace']:.0f} ms  {ms['terrace']}")
paired = statistics.median(t - b for b, t in zip(ms["native"], ms["terrace"]))
print(f"ratio terrace/native: {med['terrace'] / med['native']:.2f} (target <= 0.9); "
      f"median of paired differences {paired:+.0f} ms")
print(f"GCS requests per job (fake-gcs-server's request log, {count_n} untimed runs each), median: "
      + ", ".join(f"{s} {statistics.median(c):.0f} {c}" for s, c in calls.items()))
for s, k in kinds.items():
    print(f"  {s} by method, per job: " + ", ".join(
        f"{m} {c / int(count_n):.1f}" for m, c in sorted(k.items())))
PY
