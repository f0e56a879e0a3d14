#!/usr/bin/env bash
# Cold start of each function binary against its floor, built the same way:
# - aws: `terrace-aws` to its first call of the Lambda Runtime API (`GET
#   /2018-06-01/runtime/invocation/next`) vs a minimal `lambda_runtime` function that echoes its
#   event (`functions/aws/examples/floor.rs`); a Runtime API of the script's own (Python's
#   standard library) records the first call;
# - gcp: `terrace-gcp` (the Cloud Run service) to its first HTTP answer on `PORT` (the script
#   asks every millisecond) vs a minimal axum service (`functions/gcp/examples/gcp_floor.rs`);
# - azure: `terrace-azure` (the Container Apps job) to its first request to the jobs queue (a
#   Storage Queue of the script's own records it) vs a minimal job that makes one receive with
#   the same SDK (`functions/azure/examples/azure_floor.rs`).
# Then the process is stopped. N runs each (default 15), interleaved; prints the medians, the
# spread and the binaries' sizes. FUNCTIONS picks (default "aws gcp azure").
#
# Each function starts as its cloud starts it: its settings in the environment, templates in a
# folder, static test credentials or a SAS (no network call before the first poll).
# PROFILE=release (default debug) builds optimised (about 15 minutes per function on 2 cores).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-15}"
PROFILE="${PROFILE:-debug}"
FUNCTIONS="${FUNCTIONS:-aws gcp azure}"

scripts/install-tools.sh >/dev/null
flags=(--quiet)
for f in $FUNCTIONS; do
    case "$f" in
        aws) flags+=(-p aws --bin terrace-aws --example floor) ;;
        gcp) flags+=(-p gcp --bin terrace-gcp --example gcp_floor) ;;
        azure) flags+=(-p azure --bin terrace-azure --example azure_floor) ;;
        *) echo "FUNCTIONS: unknown function $f (aws, gcp, azure)" >&2; exit 2 ;;
    esac
done
[[ "$PROFILE" == release ]] && flags+=(--release)
cargo build "${flags[@]}"

dir="$(scripts/target-dir.sh)/$PROFILE"
terraform="$(scripts/install-terraform.sh)"
python3 - "$N" "$FUNCTIONS" "$dir" "$terraform" "$repo_root" <<'PY'
import http.server, json, os, socket, statistics, subprocess, sys, tempfile, threading, time

n, functions, bindir, terraform, repo = int(sys.argv[1]), sys.argv[2].split(), sys.argv[3], sys.argv[4], sys.argv[5]
first = {}
lock = threading.Lock()
polled = threading.Event()

class Recorder(http.server.BaseHTTPRequestHandler):
    """The Lambda Runtime API and the Storage Queue: records the first request, holds it."""
    def record(self):
        with lock:
            first.setdefault("at", time.monotonic())
        polled.set()
        # Hold the request open: the process is stopped before it would get an answer.
        time.sleep(5)
    do_GET = do_PUT = do_POST = do_DELETE = record

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
server.daemon_threads = True
threading.Thread(target=server.serve_forever, daemon=True).start()
api = f"127.0.0.1:{server.server_address[1]}"

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def answered(port):
    """Whether an HTTP request to the port gets any answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(16).startswith(b"HTTP/")
    except OSError:
        return False

work = tempfile.mkdtemp()
templates = os.path.join(work, "templates")
os.makedirs(templates)
os.symlink(os.path.join(repo, "templates", "demo"), os.path.join(templates, "demo"))
base = {"PATH": os.environ["PATH"]}
terrace_common = {
    "TERRACE_TEMPLATES": templates,
    "TERRACE_TERRAFORM": terraform,
    "TERRACE_CACHE_DIR": os.path.join(work, "cache"),
    "TERRACE_TEMPLATE_CACHE": os.path.join(work, "template-cache"),
}
lambda_env = dict(base, **{
    "AWS_LAMBDA_RUNTIME_API": api,
    "AWS_LAMBDA_FUNCTION_NAME": "terrace",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "2048",
    "AWS_LAMBDA_FUNCTION_VERSION": "1",
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
})
aws_env = dict(lambda_env, **terrace_common, **{
    "TERRACE_TENANTS": json.dumps({"acme": {"role_arn": "arn:aws:iam::123456789012:role/terrace",
                                            "external_id": "ext-1", "bucket": "b", "prefix": "states"}}),
    "TERRACE_RESULTS_QUEUE_URL": "http://127.0.0.1:9/results",
})
gcp_env = dict(base, **terrace_common, **{
    "TERRACE_PUSH_AUDIENCE": "https://terrace.example",
    "TERRACE_PUSH_SERVICE_ACCOUNTS": "pusher@acme-prod.iam.gserviceaccount.com",
    "TERRACE_TENANTS": json.dumps({"acme": {"service_account": "terrace@acme-prod.iam.gserviceaccount.com",
                                            "bucket": "acme-states"}}),
    "TERRACE_GCS_ENDPOINT": "http://127.0.0.1:9",
    "TERRACE_GCS_ANONYMOUS": "1",
})
queue = f"http://{api}/devstoreaccount1/jobs"
sas = "sv=2025-11-05&ss=q&srt=sco&sp=rp&se=2099-01-01T00:00:00Z&sig=bench"
azure_env = dict(base, **terrace_common, **{
    "TERRACE_QUEUE_URL": queue,
    "TERRACE_RESULTS_QUEUE_URL": f"http://{api}/devstoreaccount1/results",
    "TERRACE_AZURE_SAS": sas,
    "TERRACE_TENANTS": json.dumps({"acme": {"container_url": f"http://{api}/devstoreaccount1/states",
                                            "prefix": "states"}}),
})
azure_floor_env = dict(base, TERRACE_QUEUE_URL=f"{queue}?{sas}")

def once(binary, env, ready):
    """ms from start to `ready`: "polled" (the recorder's first request) or "answers" (HTTP on PORT)."""
    with lock:
        first.clear()
        polled.clear()
    env = dict(env)
    port = None
    if ready == "answers":
        port = free_port()
        env["PORT"] = str(port)
    started = time.monotonic()
    p = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            if ready == "polled" and polled.wait(0.05):
                with lock:
                    return (first["at"] - started) * 1000
            if ready == "answers" and answered(port):
                return (time.monotonic() - started) * 1000
            if p.poll() is not None:
                sys.exit(f"{binary} exited with {p.returncode} before it was ready: {p.stderr.read().decode()}")
            if time.monotonic() - started > 30:
                sys.exit(f"{binary} was not ready within 30 s")
            if ready == "answers":
                time.sleep(0.001)
    finally:
        p.kill()
        p.wait()

# The images name the CA bundle (SSL_CERT_FILE): the TLS roots are read from that one file,
# not also from every file of /etc/ssl/certs. terrace-aws is measured both ways.
bundle = "/etc/ssl/certs/ca-certificates.crt"
with_bundle = (lambda env: dict(env, SSL_CERT_FILE=bundle)) if os.path.exists(bundle) else (lambda env: env)
groups = []
if "aws" in functions:
    sides = [("aws floor", f"{bindir}/examples/floor", lambda_env, "polled"),
             ("terrace-aws", f"{bindir}/terrace-aws", aws_env, "polled")]
    if os.path.exists(bundle):
        sides.append(("terrace-aws, SSL_CERT_FILE", f"{bindir}/terrace-aws", with_bundle(aws_env), "polled"))
    groups.append(("aws: to the first Runtime API poll", sides))
if "gcp" in functions:
    groups.append(("gcp: to the first HTTP answer", [
        ("gcp floor", f"{bindir}/examples/gcp_floor", base, "answers"),
        ("terrace-gcp, SSL_CERT_FILE", f"{bindir}/terrace-gcp", with_bundle(gcp_env), "answers"),
    ]))
if "azure" in functions:
    groups.append(("azure: to the first queue request", [
        ("azure floor", f"{bindir}/examples/azure_floor", with_bundle(azure_floor_env), "polled"),
        ("terrace-azure, SSL_CERT_FILE", f"{bindir}/terrace-azure", with_bundle(azure_env), "polled"),
    ]))
print(f"cold start, N={n} interleaved, {os.path.basename(bindir)} build:")
for title, sides in groups:
    # One of each first, unmeasured (the page cache).
    for _, binary, env, ready in sides:
        once(binary, env, ready)
    runs = {name: [] for name, _, _, _ in sides}
    for _ in range(n):
        for name, binary, env, ready in sides:
            runs[name].append(once(binary, env, ready))
    print(f" {title}")
    floor = statistics.median(runs[sides[0][0]])
    for name, binary, _, _ in sides:
        xs = sorted(runs[name])
        gap = statistics.median(xs) - floor
        print(f"  {name:28} median {statistics.median(xs):6.1f} ms  min {xs[0]:6.1f}  max {xs[-1]:6.1f}  above the floor {gap:5.1f} ms (target <= 5)  binary {os.path.getsize(binary) / 1e6:.1f} MB")
PY
