#!/usr/bin/env bash
# Concurrency: N demo jobs (each on its own workspace, a create that takes DELAY_MS in the test
# cloud) run by one `terrace serve --concurrency N --once` over a queue folder, versus the same
# N applies as bare terraform processes started all at once (init, plan -out, apply of the
# plan, local backend). For each N in LEVELS (default "1 8 64"; 256 needs ~20 GB of memory for
# the 256 terraform processes, so it is asked for: LEVELS="1 8 64 256"), ROUNDS interleaved
# rounds (default 1); prints the wall time of each side, the throughput ratio and the runner's
# own peak memory (VmHWM of the serve process: terraform and its providers are other
# processes), in all and per job, and the CPU time per job of each side (terraform and its
# providers included). Targets: <= 0.5 MB per job at 256; throughput within 5 % of
# bare parallel terraform. PROFILE=release (default) or debug.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
LEVELS="${LEVELS:-1 8 64}"
ROUNDS="${ROUNDS:-1}"
DELAY_MS="${DELAY_MS:-5000}"
PROFILE="${PROFILE:-release}"
scripts/install-tools.sh
if [[ "$PROFILE" == release ]]; then cargo build --quiet --release -p local; else cargo build --quiet -p local; fi
terrace="$repo_root/target/$PROFILE/terrace"
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
export TESTCLOUD_CREATE_DELAY_MS="$DELAY_MS"
vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'

now_ms() { date +%s%3N; }
# CPU seconds (user + system) of this shell's finished children so far: each side's processes,
# terraform and its providers included, once waited for.
# (`times` runs in this shell: in a pipe or `$(…)` it would report a subshell's children.)
cpu_s() {
    times > "$work/times"
    tail -1 "$work/times" | python3 -c 'import re,sys; print(sum(float(m)*60+float(s) for m,s in re.findall(r"(\d+)m([\d.]+)s", sys.stdin.read())))'
}

# N bare applies at once; prints the wall time in ms.
bare() {
    local n="$1" round="$2" base="$work/bare-$1-$2" pids=() failed=0
    local t0; t0=$(now_ms)
    for i in $(seq 1 "$n"); do
        (
            d="$base/ws-$i"
            mkdir -p "$d" "$base/cloud-$i"
            cp templates/demo/1.0.0/*.tf "$d/"
            echo "$vars" > "$d/terraform.tfvars.json"
            cd "$d"
            export TESTCLOUD_ROOT="$base/cloud-$i"
            "$tf" init -input=false -no-color >/dev/null
            "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
            "$tf" apply -input=false -no-color p.tfplan >/dev/null
        ) 2>>"$work/bare.err" &
        pids+=("$!")
    done
    for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
    local t1; t1=$(now_ms)
    if ((failed)); then
        echo "bare: $failed of $n applies failed; see below" >&2
        tail -20 "$work/bare.err" >&2
        exit 1
    fi
    echo $((t1 - t0))
}

# N jobs through one serve; prints "wall_ms peak_kb".
through_terrace() {
    local n="$1" round="$2" base="$work/terrace-$1-$2"
    mkdir -p "$base/queue" "$base/cloud"
    for i in $(seq 1 "$n"); do
        local job_vars="${vars/\"cluster_name\":\"bench\"/\"cluster_name\":\"bench-$i\"}"
        cat > "$base/queue/job-$i.yaml" <<JOB
id: bench-$n-$round-$i
tenant: bench
workspace: ws-$i
operation: apply
template: { name: demo, version: 1.0.0 }
variables: $job_vars
JOB
    done
    local t0; t0=$(now_ms)
    # One test cloud for the process, as one cloud account: each job names its cluster
    # (`bench-<i>`), so their resources do not collide.
    TESTCLOUD_ROOT="$base/cloud" TERRACE_PASS_ENV=TESTCLOUD_ROOT,TESTCLOUD_CREATE_DELAY_MS \
        TERRACE_STORE="$base/store" TERRACE_TEMPLATES="$repo_root/templates" \
        TERRACE_TERRAFORM="$tf" TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" \
        TERRACE_CACHE_DIR="$work/cache" \
        "$terrace" serve --queue "$base/queue" --concurrency "$n" --once --poll-ms 100 \
        >"$base/serve.out" 2>"$base/serve.err" &
    local pid=$! peak=0 hwm own=0 ticks
    while kill -0 "$pid" 2>/dev/null; do
        hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        [[ -n "$hwm" ]] && ((hwm > peak)) && peak=$hwm
        # The runner's own CPU (utime + stime, in clock ticks), its children's not included.
        ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || true)
        [[ -n "$ticks" ]] && own=$ticks
        sleep 0.05
    done
    wait "$pid" || { echo "serve failed:" >&2; tail -20 "$base/serve.err" >&2; exit 1; }
    local t1; t1=$(now_ms)
    local done_count; done_count=$(find "$base/queue/done" -name '*.yaml' 2>/dev/null | wc -l)
    if ((done_count != n)); then
        echo "terrace: $done_count of $n jobs succeeded; failed/:" >&2
        ls "$base/queue/failed" >&2 || true
        tail -20 "$base/serve.err" >&2
        exit 1
    fi
    echo "$((t1 - t0)) $peak $((own * 1000 / $(getconf CLK_TCK)))"
}

: > "$work/rows"
# Warm both sides once (terraform's version cache, the page cache).
bare 1 warm >/dev/null
through_terrace 1 warm >/dev/null
for n in $LEVELS; do
    for round in $(seq 1 "$ROUNDS"); do
        cpu_s > "$work/c0"
        b=$(bare "$n" "$round")
        cpu_s > "$work/c1"
        through_terrace "$n" "$round" > "$work/t"
        cpu_s > "$work/c2"
        read -r t kb own < "$work/t"
        c0=$(cat "$work/c0") c1=$(cat "$work/c1") c2=$(cat "$work/c2")
        bcpu=$(python3 -c "print(round(($c1 - $c0) * 1000))")
        tcpu=$(python3 -c "print(round(($c2 - $c1) * 1000))")
        echo "$n $round $b $t $kb $bcpu $tcpu $own" | tee -a "$work/rows" >&2
        rm -rf "$work/bare-$n-$round" "$work/terrace-$n-$round"
    done
done

python3 - "$work/rows" "$DELAY_MS" "$PROFILE" <<'PY'
import statistics, sys
rows = [tuple(int(x) for x in l.split()) for l in open(sys.argv[1])]
print(f"concurrency: demo jobs with a {sys.argv[2]} ms create each, terrace built {sys.argv[3]}")
print("| jobs | bare terraform, all at once | terrace serve --concurrency N | throughput (bare time / terrace time) | CPU per job, bare / terrace (of which the runner's own) | runner peak RSS | per job |")
print("|---|---|---|---|---|---|---|")
for n in sorted({r[0] for r in rows}):
    mine = [r for r in rows if r[0] == n]
    b = statistics.median(r[2] for r in mine)
    t = statistics.median(r[3] for r in mine)
    kb = max(r[4] for r in mine)
    bc = statistics.median(r[5] for r in mine) / n
    tc = statistics.median(r[6] for r in mine) / n
    oc = statistics.median(r[7] for r in mine) / n
    print(f"| {n} | {b / 1000:.1f} s | {t / 1000:.1f} s | {b / t:.3f} | {bc:.0f} / {tc:.0f} ms ({oc:.0f} ms) | {kb / 1024:.1f} MB | {kb / 1024 / n:.2f} MB |")
print("targets: throughput within 5 % of bare parallel terraform (ratio >= 0.95); <= 0.5 MB per job at 256")
PY
