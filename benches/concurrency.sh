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
# COST=off runs the jobs without price books (no cost estimate). CPU_BY_COMMAND=1 also runs each side's terraform under GNU time (a shim that passes every
# argument through unchanged) and prints the CPU per job of each terraform command, its providers
# included: where the difference between the sides goes.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
LEVELS="${LEVELS:-1 8 64}"
ROUNDS="${ROUNDS:-1}"
DELAY_MS="${DELAY_MS:-5000}"
PROFILE="${PROFILE:-release}"
scripts/install-tools.sh
if [[ "$PROFILE" == release ]]; then cargo build --quiet --release -p local; else cargo build --quiet -p local; fi
terrace="$(scripts/target-dir.sh)/$PROFILE/terrace"
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
tf_bare="$tf" tf_terrace="$tf"
# COST=off: no price books, so no cost estimate (each estimate is a `terraform show -json` of
# the plan, which the bare side does not run).
price_books="$repo_root/price-books"
[[ "${COST:-on}" == off ]] && price_books="$work/no-price-books"
if [[ "${CPU_BY_COMMAND:-}" == 1 ]]; then
    [[ -x /usr/bin/time ]] || { apt-get install -y -q time >/dev/null || { echo "CPU_BY_COMMAND needs GNU time (apt-get install time)" >&2; exit 1; }; }
    # The runner gives terraform a scrubbed environment: the shim's settings are written in it.
    for side in bare terrace; do
        printf '#!/bin/bash\nexec /usr/bin/time -f "%%U %%S %%C" -a -o %q %q "$@"\n' \
            "$work/cpu-$side.log" "$tf" > "$work/tf-$side"
        chmod +x "$work/tf-$side"
    done
    tf_bare="$work/tf-bare" tf_terrace="$work/tf-terrace"
fi

export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
export TESTCLOUD_CREATE_DELAY_MS="$DELAY_MS"
vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'

now_ms() { date +%s%3N; }
# CPU seconds (user + system) of this shell's finished children so far: the bare side's
# processes, terraform and its providers included, once waited for (and the subshells that
# start them).
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
            "$tf_bare" init -input=false -no-color >/dev/null
            "$tf_bare" plan -input=false -no-color -out=p.tfplan >/dev/null
            "$tf_bare" apply -input=false -no-color p.tfplan >/dev/null
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
        TERRACE_TERRAFORM="$tf_terrace" TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" \
        TERRACE_CACHE_DIR="$work/cache" TERRACE_PRICE_BOOKS="$price_books" \
        "$terrace" serve --queue "$base/queue" --concurrency "$n" --once --poll-ms 100 \
        >"$base/serve.out" 2>"$base/serve.err" &
    local pid=$! peak=0 hwm own=0 all=0 ticks
    while kill -0 "$pid" 2>/dev/null; do
        hwm=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        [[ -n "$hwm" ]] && ((hwm > peak)) && peak=$hwm
        # In clock ticks: the runner's own CPU (utime + stime), and with what it ran and waited
        # for (cutime + cstime: terraform and its providers). Read from the process itself, so
        # this loop's own CPU is not counted; the last 50 ms before it exits are missed.
        ticks=$(awk '{print $14 + $15, $14 + $15 + $16 + $17}' "/proc/$pid/stat" 2>/dev/null || true)
        [[ -n "$ticks" ]] && read -r own all <<< "$ticks"
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
    local tick_ms=$((1000 / $(getconf CLK_TCK)))
    echo "$((t1 - t0)) $peak $((own * tick_ms)) $((all * tick_ms))"
}

: > "$work/rows"
# Warm both sides once (terraform's version cache, the page cache).
bare 1 warm >/dev/null
through_terrace 1 warm >/dev/null
rm -f "$work"/cpu-*.log
for n in $LEVELS; do
    for round in $(seq 1 "$ROUNDS"); do
        cpu_s > "$work/c0"
        b=$(bare "$n" "$round")
        cpu_s > "$work/c1"
        through_terrace "$n" "$round" > "$work/t"
        read -r t kb own tcpu < "$work/t"
        c0=$(cat "$work/c0") c1=$(cat "$work/c1")
        bcpu=$(python3 -c "print(round(($c1 - $c0) * 1000))")
        echo "$n $round $b $t $kb $bcpu $tcpu $own" | tee -a "$work/rows" >&2
        for side in bare terrace; do
            [[ -f "$work/cpu-$side.log" ]] && mv "$work/cpu-$side.log" "$work/cpu-$side-$n-$round.log"
        done
        rm -rf "$work/bare-$n-$round" "$work/terrace-$n-$round"
    done
done

python3 - "$work/rows" "$DELAY_MS" "$PROFILE" <<'PY'
import statistics, sys
rows = [tuple(int(x) for x in l.split()) for l in open(sys.argv[1])]
print(f"concurrency: demo jobs with a {sys.argv[2]} ms create each, terrace built {sys.argv[3]}")
print("| jobs | bare terraform, all at once | terrace serve --concurrency N | throughput (bare time / terrace time) | CPU per job, bare (its subshells included) / terrace (the runner and what it ran; of which the runner's own) | runner peak RSS | per job |")
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

if [[ "${CPU_BY_COMMAND:-}" == 1 ]]; then
    python3 - "$work" $LEVELS <<'PY'
import collections, glob, os, re, sys
work, levels = sys.argv[1], [int(n) for n in sys.argv[2:]]
print("CPU per job by terraform command, its providers included (user + system, GNU time):")
print("| jobs | command | runs per job, bare / terrace | CPU per job, bare / terrace |")
print("|---|---|---|---|")
for n in levels:
    by = {}
    for side in ("bare", "terrace"):
        cpu, runs = collections.Counter(), collections.Counter()
        logs = glob.glob(os.path.join(work, f"cpu-{side}-{n}-*.log"))
        rounds = len(logs)
        for log in logs:
            for line in open(log):
                m = re.match(r"([\d.]+) ([\d.]+) \S+ (.*)", line)
                if not m:
                    continue  # "Command exited with non-zero status" and the like
                # The first word that is not an option: the command (init, plan, apply, ...).
                words = [w for w in m.group(3).split() if not w.startswith("-")]
                command = words[0] if words else "?"
                cpu[command] += (float(m.group(1)) + float(m.group(2))) / (n * rounds)
                runs[command] += 1 / (n * rounds)
        by[side] = (cpu, runs)
    for command in sorted(set(by["bare"][0]) | set(by["terrace"][0])):
        (bc, br), (tc, tr) = by["bare"], by["terrace"]
        print(f"| {n} | {command} | {br[command]:.1f} / {tr[command]:.1f} | {bc[command] * 1000:.0f} / {tc[command] * 1000:.0f} ms |")
PY
fi
