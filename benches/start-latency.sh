#!/usr/bin/env bash
# Enqueue to terraform's first output, per trigger (TRIGGERS, default "serve lambda pubsub
# azure"): N jobs each (default 100, after one warm-up), one at a time, each the demo apply on
# a workspace of its own. For each job: from the moment it is queued to the first line terraform
# prints, and the runner's own share of that start (`to_terraform_ms` in the job's metrics
# record: from asking for the lease to terraform's first command starting). What is neither is
# the trigger's.
# - serve: `terrace serve`'s folder queue, the `fs` store. Each job is linked into the folder at
#   a random moment after the one before has finished, so none waits behind another; the folder
#   is scanned every POLL_MS (default 500, serve's own default). The first output is the line
#   read from serve's console as it is written.
# - lambda, pubsub, azure: the real function binaries through moto's SQS and the Lambda runtime
#   API, the Pub/Sub emulator's push subscription, and Azurite's queue (the `start_latency`
#   benchmark in tests/tests/{aws_lambda,gcp_service,azure_job}.rs, under
#   scripts/with-emulators.sh). The first output is the `ts` of terraform's first line in the
#   job's stored log.
# PROFILE=release (default debug) uses release builds.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-100}"
POLL_MS="${POLL_MS:-500}"
PROFILE="${PROFILE:-debug}"
TRIGGERS="${TRIGGERS:-serve lambda pubsub azure}"
profile_flag=()
[[ "$PROFILE" == release ]] && profile_flag=(--release)

cloud_tests=()
for trigger in $TRIGGERS; do
  case "$trigger" in
    serve) ;;
    lambda) cloud_tests+=(--test aws_lambda) ;;
    pubsub) cloud_tests+=(--test gcp_service) ;;
    azure) cloud_tests+=(--test azure_job) ;;
    *) echo "TRIGGERS: unknown trigger $trigger (serve, lambda, pubsub, azure)" >&2; exit 2 ;;
  esac
done
if ((${#cloud_tests[@]})); then
  scripts/install-tools.sh >/dev/null
  cargo build --quiet "${profile_flag[@]}" -p local -p aws -p gcp -p azure
  TERRACE_BENCH_N="$N" scripts/with-emulators.sh cargo test --quiet "${profile_flag[@]}" -p tests \
    "${cloud_tests[@]}" -- --ignored --exact start_latency --nocapture --test-threads 1 |
    grep -v -e '^running ' -e '^test result' -e '^$' -e '^[.i]*$'
fi
[[ " $TRIGGERS " == *" serve "* ]] || exit 0

scripts/install-tools.sh --demo >/dev/null
cargo build --quiet "${profile_flag[@]}" -p local
bin="$(scripts/target-dir.sh)/$PROFILE/terrace"
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/queue" "$work/cloud"
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0

python3 - "$bin" "$tf" "$work" "$N" "$POLL_MS" "$repo_root" <<'PY'
import json, os, queue, random, statistics, subprocess, sys, threading, time
bin, tf, work, n, poll_ms, root = sys.argv[1:7]
n, poll_ms = int(n), int(poll_ms)
env = dict(os.environ,
           TERRACE_STORE=f"{work}/store", TERRACE_TEMPLATES=f"{root}/templates",
           TERRACE_TERRAFORM=tf, TERRACE_TF_CLI_CONFIG=f"{root}/.cache/terraformrc",
           TERRACE_CACHE_DIR=f"{work}/cache", TERRACE_PRICE_BOOKS=f"{work}/no-price-books",
           TERRACE_PASS_ENV="TESTCLOUD_ROOT", TESTCLOUD_ROOT=f"{work}/cloud",
           TERRACE_METRICS="json", TERRACE_LOG="warn")
if os.geteuid() == 0:
    # As root, serve gives each job a user of its own, which a checkout under a private
    # folder keeps from the provider mirror; here jobs run as you (as the demo's do).
    env["TERRACE_TERRAFORM_USER"] = "root"
serve = subprocess.Popen([bin, "serve", "--queue", f"{work}/queue", "--concurrency", "1",
                          "--poll-ms", str(poll_ms)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
lines = queue.Queue()
def read():
    for line in serve.stderr:
        lines.put((time.time(), line.rstrip("\n")))
    lines.put((time.time(), None))
threading.Thread(target=read, daemon=True).start()

def wait_for(match, within=120):
    deadline = time.time() + within
    while True:
        at, line = lines.get(timeout=max(0.1, deadline - time.time()))
        if line is None:
            sys.exit("terrace serve stopped")
        if match(line):
            return at, line

vars_ = {"region": "eu-west-1", "node_count": 3, "instance_type": "small",
         "cidr": "10.0.0.0/16", "ha": False, "admin_password": "bench-password-123"}
first_output, runner_share, order = [], [], []
try:
    for i in range(n + 1):  # the first is a warm-up
        job_id = f"start-{i}"
        job = {"id": job_id, "tenant": "bench", "workspace": job_id, "operation": "apply",
               "template": {"name": "demo", "version": "1.0.0"},
               "variables": dict(vars_, cluster_name=f"start-{i}")}
        aside = f"{work}/queue/.{job_id}.sending"
        with open(aside, "w") as f:
            json.dump(job, f)
        t0 = time.time()
        os.link(aside, f"{work}/queue/{job_id}.json")
        os.unlink(aside)
        prefix = f"[{job_id}] "
        # A line terraform printed: the console marks the runner's own with `==>`, terraform's
        # stderr with ` ! ` and its stdout with three spaces.
        at, _ = wait_for(lambda l: l.startswith(prefix) and l[len(prefix):len(prefix) + 4] == "    ")
        _, record = wait_for(lambda l: l.startswith("{") and f'"job_id":"{job_id}"' in l)
        record = json.loads(record)
        if record.get("outcome") != "succeeded":
            sys.exit(f"{job_id} ended {record.get('outcome')}: {record}")
        # The next job comes at a random moment, not right as this one ends (when serve
        # scans the folder anyway): the scan's wait is then what a platform sees.
        time.sleep(random.uniform(poll_ms / 1000, 2 * poll_ms / 1000))
        if i == 0:
            continue
        first_output.append((at - t0) * 1000)
        runner_share.append(record["to_terraform_ms"])
finally:
    serve.terminate()
    serve.wait(timeout=30)

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]
version = json.loads(subprocess.run([tf, "version", "-json"], capture_output=True, text=True).stdout)["terraform_version"]
print(f"terrace serve, folder queue scanned every {poll_ms} ms; {n} jobs one at a time; terraform {version}")
print(f"enqueue -> terraform's first output: p50 {pct(first_output, 50):.0f} ms, p99 {pct(first_output, 99):.0f} ms, "
      f"min {min(first_output):.0f}, max {max(first_output):.0f}")
print(f"the runner's share (lease asked -> terraform's first command): p50 {pct(runner_share, 50):.0f} ms, "
      f"p99 {pct(runner_share, 99):.0f} ms, max {max(runner_share):.0f}")
print(f"the rest: the folder scan (0-{poll_ms} ms, mean {poll_ms / 2:.0f}), reading and checking the job file, "
      f"and terraform's start-up to its first line")
PY
