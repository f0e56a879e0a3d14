#!/usr/bin/env bash
# Cold start of the Lambda function: the time from starting `terrace-aws` to its first call
# of the Lambda Runtime API (`GET /2018-06-01/runtime/invocation/next`), against the floor: a
# minimal `lambda_runtime` function that echoes its event (`functions/aws/examples/floor.rs`),
# built the same way. A Runtime API of the script's own (Python's standard library) records
# the first call, then the process is stopped. N runs each (default 15), interleaved; prints
# the medians, the spread and the binaries' sizes.
#
# terrace-aws starts as Lambda starts it: its settings in the environment, templates in a
# folder, static test credentials (no network call before the first poll). PROFILE=release
# (default debug) builds optimised (about 15 minutes on 2 cores).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-15}"
PROFILE="${PROFILE:-debug}"

scripts/install-tools.sh >/dev/null
flags=(--quiet -p aws --bin terrace-aws --example floor)
[[ "$PROFILE" == release ]] && flags+=(--release)
cargo build "${flags[@]}"

dir="$repo_root/target/$PROFILE"
terraform="$(scripts/install-terraform.sh)"
python3 - "$N" "$dir/terrace-aws" "$dir/examples/floor" "$terraform" "$repo_root" <<'PY'
import http.server, json, os, statistics, subprocess, sys, tempfile, threading, time

n, terrace, floor, terraform, repo = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
first = {}
lock = threading.Lock()
polled = threading.Event()

class Api(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with lock:
            first.setdefault("at", time.monotonic())
        polled.set()
        # Hold the poll open: the process is stopped before it would get an event.
        time.sleep(5)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
api = f"127.0.0.1:{server.server_address[1]}"

work = tempfile.mkdtemp()
templates = os.path.join(work, "templates")
os.makedirs(templates)
os.symlink(os.path.join(repo, "templates", "demo"), os.path.join(templates, "demo"))
lambda_env = {
    "PATH": os.environ["PATH"],
    "AWS_LAMBDA_RUNTIME_API": api,
    "AWS_LAMBDA_FUNCTION_NAME": "terrace",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "2048",
    "AWS_LAMBDA_FUNCTION_VERSION": "1",
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
}
terrace_env = dict(lambda_env, **{
    "TERRACE_TENANTS": json.dumps({"acme": {"role_arn": "arn:aws:iam::123456789012:role/terrace",
                                            "external_id": "ext-1", "bucket": "b", "prefix": "states"}}),
    "TERRACE_TEMPLATES": templates,
    "TERRACE_TERRAFORM": terraform,
    "TERRACE_CACHE_DIR": os.path.join(work, "cache"),
    "TERRACE_TEMPLATE_CACHE": os.path.join(work, "template-cache"),
    "TERRACE_RESULTS_QUEUE_URL": "http://127.0.0.1:9/results",
})

def once(binary, env):
    with lock:
        first.clear()
        polled.clear()
    started = time.monotonic()
    p = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while not polled.wait(0.05):
            if p.poll() is not None:
                sys.exit(f"{binary} exited with {p.returncode} before its first poll: {p.stderr.read().decode()}")
            if time.monotonic() - started > 30:
                sys.exit(f"{binary} made no poll within 30 s")
        with lock:
            return (first["at"] - started) * 1000
    finally:
        p.kill()
        p.wait()

# The images name the CA bundle (SSL_CERT_FILE): the TLS roots are read from that one file,
# not also from every file of /etc/ssl/certs. Measured both ways.
bundle = "/etc/ssl/certs/ca-certificates.crt"
sides = [("floor", floor, lambda_env), ("terrace-aws", terrace, terrace_env)]
if os.path.exists(bundle):
    sides.append(("terrace-aws, SSL_CERT_FILE", terrace, dict(terrace_env, SSL_CERT_FILE=bundle)))
# One of each first, unmeasured (the page cache).
for _, binary, env in sides:
    once(binary, env)
runs = {name: [] for name, _, _ in sides}
for _ in range(n):
    for name, binary, env in sides:
        runs[name].append(once(binary, env))
print(f"cold start to the first Runtime API poll, N={n} interleaved, {os.path.basename(os.path.dirname(terrace))} build:")
for name, binary, _ in sides:
    xs = sorted(runs[name])
    gap = statistics.median(xs) - statistics.median(runs["floor"])
    print(f"  {name:28} median {statistics.median(xs):6.1f} ms  min {xs[0]:6.1f}  max {xs[-1]:6.1f}  above the floor {gap:5.1f} ms (target <= 5)  binary {os.path.getsize(binary) / 1e6:.1f} MB")
PY
