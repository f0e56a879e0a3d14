#!/usr/bin/env bash
# What terraform's own `http` backend costs, without Terrace: the demo template planned and
# applied by bare terraform with its local backend versus with the `http` backend pointed at a
# trivial in-memory server (Python's standard library, no checks, no disk), same machine, same
# run, interleaved, N runs each (default 15). Prints the medians of plan and apply.
# This is the floor under `benches/overhead.sh`: the part of Terrace's overhead that is
# terraform talking to any http backend rather than to a file.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-15}"
scripts/install-tools.sh >/dev/null
tf="$(scripts/install-terraform.sh)"
work="$(mktemp -d)"
server_pid=""
trap '[[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null; rm -rf "$work"' EXIT

cat > "$work/server.py" <<'PY'
import http.server, sys
state = {}
class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""
    def answer(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        data = state.get(self.path)
        self.answer(200, data) if data else self.answer(204)
    def do_POST(self):
        state[self.path.split("?")[0]] = self.body()
        self.answer(200)
    def do_LOCK(self):
        self.body()
        self.answer(200)
    def do_UNLOCK(self):
        self.body()
        self.answer(200)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
print(server.server_address[1], flush=True)
server.serve_forever()
PY
coproc SERVER { exec python3 "$work/server.py"; }
server_pid=$SERVER_PID
read -r port <&"${SERVER[0]}"

export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'
now_ms() { date +%s%3N; }

one() {
    local kind="$1" i="$2" d="$work/$1-$2"
    mkdir -p "$d" "$work/cloud-$1-$2"
    cp templates/demo/1.0.0/*.tf "$d/"
    echo "$vars" > "$d/terraform.tfvars.json"
    if [[ "$kind" == http ]]; then
        cat > "$d/backend_override.tf" <<HCL
terraform {
  backend "http" {
    address        = "http://127.0.0.1:$port/$i"
    lock_address   = "http://127.0.0.1:$port/$i"
    unlock_address = "http://127.0.0.1:$port/$i"
  }
}
HCL
    fi
    (
        cd "$d"
        export TESTCLOUD_ROOT="$work/cloud-$1-$2"
        "$tf" init -input=false -no-color >/dev/null
        local a b c
        a=$(now_ms); "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
        b=$(now_ms); "$tf" apply -input=false -no-color p.tfplan >/dev/null
        c=$(now_ms)
        echo "$kind $((b - a)) $((c - b))" >> "$work/times"
    )
}

one local warmup; one http warmup; : > "$work/times"
for i in $(seq 1 "$N"); do one local "$i"; one http "$i"; done

python3 - "$work/times" "$N" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    kind, plan, apply = line.split()
    runs.setdefault(kind, []).append((int(plan), int(apply)))
med = {k: (statistics.median(p for p, _ in v), statistics.median(a for _, a in v)) for k, v in runs.items()}
print(f"runs: {sys.argv[2]} each, interleaved; medians in ms")
for kind in ("local", "http"):
    print(f"{kind:5} backend: plan {med[kind][0]:.0f}, apply {med[kind][1]:.0f}")
print(f"the http backend costs terraform: plan {med['http'][0] - med['local'][0]:+.0f}, "
      f"apply {med['http'][1] - med['local'][1]:+.0f} ms")
PY
