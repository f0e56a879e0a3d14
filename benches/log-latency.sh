#!/usr/bin/env bash
# Log latency: a job whose apply runs a `local-exec` provisioner that prints LINES lines (default
# 400), one every 10 ms, each carrying the time it was printed (ns). `terrace run` (fs store) is
# read as it runs: each line's arrival on the runner's stderr (the console sink, what a
# function's log shows) and its first appearance in a stored log chunk (the store sink, what
# `terrace logs --follow` and a platform read; polled every 5 ms) are compared with the time in
# it. The same provisioner under bare `terraform apply -json` gives terraform's own part: the
# time from the shell's echo to terraform's stdout. Prints p50 / p99 / max of each. The chunk
# latency is bounded by the store sink's period (a chunk per second while lines arrive).
# PROFILE=release (default) or debug.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
LINES="${LINES:-400}"
PROFILE="${PROFILE:-release}"
scripts/install-tools.sh
if [[ "$PROFILE" == release ]]; then cargo build --quiet --release -p local; else cargo build --quiet -p local; fi
terrace="$(scripts/target-dir.sh)/$PROFILE/terrace"
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"

mkdir -p "$work/templates/latency/1.0.0" "$work/bare"
cat > "$work/templates/latency/1.0.0/template.yaml" <<'YAML'
description: Prints timed lines from a provisioner, for the log latency bench
variables: {}
YAML
cat > "$work/templates/latency/1.0.0/main.tf" <<HCL
resource "terraform_data" "lines" {
  provisioner "local-exec" {
    command = "i=0; while [ \$i -lt $LINES ]; do echo \"LAT \$(date +%s%N)\"; sleep 0.01; i=\$((i+1)); done"
  }
}
HCL
cp "$work/templates/latency/1.0.0/main.tf" "$work/bare/"
cat > "$work/job.yaml" <<'JOB'
id: latency-1
tenant: bench
workspace: latency
operation: apply
template: { name: latency, version: 1.0.0 }
JOB
(cd "$work/bare" && "$tf" init -input=false -no-color >/dev/null)

python3 - "$terrace" "$tf" "$work" <<'PY'
import glob, json, os, re, statistics, subprocess, sys, threading, time
terrace, tf, work = sys.argv[1:]
pat = re.compile(r"LAT (\d{19})")

def read_stream(stream, seen):
    for raw in stream:
        now = time.time_ns()
        m = pat.search(raw.decode(errors="replace"))
        if m:
            seen.setdefault(int(m.group(1)), now)

def poll_chunks(folder, seen, done):
    sizes = {}
    while True:
        finished = done.is_set()
        for path in sorted(glob.glob(f"{folder}/**/log/*.ndjson", recursive=True)):
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if sizes.get(path) == size:
                continue
            now = time.time_ns()
            sizes[path] = size
            with open(path, "rb") as f:
                for line in f:
                    m = pat.search(json.loads(line).get("text", ""))
                    if m:
                        seen.setdefault(int(m.group(1)), now)
        if finished:
            return
        time.sleep(0.005)

def summary(name, seen):
    lat = sorted((arrived - printed) / 1e6 for printed, arrived in seen.items())
    if not lat:
        sys.exit(f"{name}: no timed line arrived")
    p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]
    print(f"| {name} | {len(lat)} | {p(0.50):.2f} ms | {p(0.99):.2f} ms | {lat[-1]:.2f} ms |")

# terraform alone: the provisioner's lines on its -json stdout.
bare = {}
env = dict(os.environ)
p = subprocess.Popen([tf, "apply", "-json", "-auto-approve", "-input=false"], cwd=f"{work}/bare",
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
read_stream(p.stdout, bare)
if p.wait() != 0:
    sys.exit("bare terraform apply failed")

# terrace run: stderr (the console sink) and the stored chunks.
console, chunks, done = {}, {}, threading.Event()
store = f"{work}/store"
os.makedirs(store, exist_ok=True)
env.update(TERRACE_STORE=store, TERRACE_TEMPLATES=f"{work}/templates", TERRACE_TERRAFORM=tf,
           TERRACE_CACHE_DIR=f"{work}/cache")
poller = threading.Thread(target=poll_chunks, args=(store, chunks, done))
poller.start()
p = subprocess.Popen([terrace, "run", f"{work}/job.yaml"], stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, env=env)
read_stream(p.stderr, console)
rc = p.wait()
done.set()
poller.join()
if rc != 0:
    sys.exit(f"terrace run failed ({rc})")

print("| from the provisioner's echo to | lines | p50 | p99 | max |")
print("|---|---|---|---|---|")
summary("bare terraform's stdout (terraform's own part)", bare)
summary("the runner's stderr (console sink)", console)
summary("a stored log chunk (store sink, fs store)", chunks)
PY
