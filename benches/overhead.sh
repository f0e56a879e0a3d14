#!/usr/bin/env bash
# Runner overhead: the demo template applied by bare terraform (local backend) versus through
# `terrace run` (state served by the runner from the fs store), same machine, same run,
# interleaved, N runs each (default 15). Bare terraform runs what a person runs to apply a
# reviewed plan: init, plan -out, apply of the plan (its outputs print at the end); Terrace runs
# init, plan -json -out, apply -json of the plan and reads changes and outputs from the -json
# messages. Each run starts from an empty workspace and an empty cloud.
# Prints the medians and the overhead. Targets: <= 2% and <= 25 ms per job.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-15}"
scripts/install-tools.sh
cargo build --quiet --release -p local
terrace="$(scripts/target-dir.sh)/release/terrace"
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'

now_ms() { date +%s%3N; }

bare() {
    local d="$work/bare-$1"
    mkdir -p "$d" "$work/cloud-bare-$1"
    cp templates/demo/1.0.0/*.tf "$d/"
    echo "$vars" > "$d/terraform.tfvars.json"
    (
        cd "$d"
        export TESTCLOUD_ROOT="$work/cloud-bare-$1"
        "$tf" init -input=false -no-color >/dev/null
        "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
        "$tf" apply -input=false -no-color p.tfplan >/dev/null
    ) 2>>"$work/bare.err"
}

through_terrace() {
    mkdir -p "$work/cloud-terrace-$1"
    cat > "$work/job-$1.yaml" <<JOB
id: bench-$1
tenant: bench
workspace: ws-$1
operation: apply
template: { name: demo, version: 1.0.0 }
variables: $vars
JOB
    TESTCLOUD_ROOT="$work/cloud-terrace-$1" TERRACE_PASS_ENV=TESTCLOUD_ROOT \
        TERRACE_STORE="$work/store" TERRACE_TEMPLATES="$repo_root/templates" \
        TERRACE_TERRAFORM="$tf" TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" \
        "$terrace" run -q "$work/job-$1.yaml" >/dev/null
}

: > "$work/bare.ms"
: > "$work/terrace.ms"
bare warmup >/dev/null
through_terrace warmup
for i in $(seq 1 "$N"); do
    t0=$(now_ms); bare "$i"; t1=$(now_ms); echo $((t1 - t0)) >> "$work/bare.ms"
    t0=$(now_ms); through_terrace "$i"; t1=$(now_ms); echo $((t1 - t0)) >> "$work/terrace.ms"
done

python3 - "$work/bare.ms" "$work/terrace.ms" "$N" "$work/store" <<'PY'
import glob, json, statistics, sys
bare = [int(x) for x in open(sys.argv[1])]
ter = [int(x) for x in open(sys.argv[2])]
mb, mt = statistics.median(bare), statistics.median(ter)
# The runner's own time: the process's wall time minus the time terraform's steps took.
own = []
for i, wall in enumerate(ter, start=1):
    r = json.load(open(f"{sys.argv[4]}/bench/ws-{i}/runs/bench-{i}/result.json"))
    own.append(wall - sum(s["duration_ms"] for s in r["steps"]))
print(f"runs: {sys.argv[3]} each, interleaved (ms): bare {bare}  terrace {ter}")
print(f"median bare terraform (local backend): {mb:.0f} ms")
print(f"median terrace run (http backend, fs store): {mt:.0f} ms")
# Runs are paired (bare i, then terrace i): the median of the pairs' differences is steadier
# than the difference of the medians when the machine's speed drifts during the run.
paired = statistics.median(t - b for b, t in zip(bare, ter))
print(f"overhead: {mt - mb:+.0f} ms per job ({(mt - mb) / mb * 100:+.1f}%); median of paired "
      f"differences {paired:+.0f} ms ({paired / mb * 100:+.1f}%)  targets: <= 25 ms and <= 2%")
print(f"of which outside terraform (validation, lease, workdir, state server, log, result): "
      f"median {statistics.median(own):.0f} ms, max {max(own)} ms")
PY
