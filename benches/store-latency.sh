#!/usr/bin/env bash
# A job's critical path under a store's latency. Every store request of both sides goes through
# a proxy that holds it DELAY ms before it reaches the emulator (tests/examples/latency_proxy.rs,
# the tests' fault proxy with no fault), as a cloud store in the same region answers in some
# 10-30 ms where an emulator on loopback answers in about 1. Sides, interleaved, N runs each
# (default 7), at each delay of DELAYS (default "0 20 100"):
#   s3-lockfile   terraform's `s3` backend, `use_lockfile = true`      (moto)
#   s3-dynamodb   terraform's `s3` backend, `dynamodb_table`           (moto)
#   terrace-s3    `terrace run --store s3://…`, the lease a lock object (moto)
#   terrace-s3-table  the same, the lease in DynamoDB (`?lease_table=`) (moto)
#   gcs           terraform's `gcs` backend                            (fake-gcs-server)
#   terrace-gcs   `terrace run --store gs://…`                         (fake-gcs-server)
#   terrace-azure `terrace run --store http://…/ACCOUNT/CONTAINER/…`   (Azurite, a SAS)
# Azure has no native side: terraform's `azurerm` backend cannot reach Azurite (it reaches
# storage accounts only through Azure's management API; docs/BENCHMARKS.md).
# Each run applies the demo template to an empty workspace: natively init, plan -out and apply
# of the plan; through Terrace a whole apply job (lease, checked and versioned state writes,
# log, lifecycle record, result, release).
#
# Per side and delay it prints the median wall time, the ratio to the native side(s), the
# requests and bytes per job (from the proxy's log), and the round trips the job waited on one
# after the other: (median at the highest delay - median at 0) / that delay. SIDES picks sides;
# PROFILE=release (default debug) uses the release build of terrace. Terrace runs without price
# books (COST=off, the default), as the native sides estimate nothing: a plan's estimate is a
# fourth terraform process (`show -json`, some 100 ms of CPU, no store request; measured by
# `make bench-concurrency`). COST=on prices the plans with the repository's books.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-7}"
DELAYS="${DELAYS:-0 20 100}"
PROFILE="${PROFILE:-debug}"
SIDES="${SIDES:-s3-lockfile s3-dynamodb terrace-s3 terrace-s3-table gcs terrace-gcs terrace-azure}"
COST="${COST:-off}"

if [[ -z "${TERRACE_TEST_MOTO:-}" ]]; then
    scripts/install-tools.sh
    if [[ "$PROFILE" == release ]]; then cargo build --quiet --release -p local; else cargo build --quiet -p local; fi
    cargo build --quiet -p tests --example latency_proxy
    exec scripts/with-emulators.sh "$0" "$@"
fi

target="$(scripts/target-dir.sh)"
bin="$target/$PROFILE/terrace"
proxy_bin="$target/debug/examples/latency_proxy"
tf="$(scripts/install-terraform.sh)"
py="$repo_root/.cache/moto/bin/python"
work="$(mktemp -d)"
proxies=()
finish() {
    local rc=$?
    for pid in "${proxies[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [[ $rc -ne 0 ]]; then
        for f in "$work"/*.err; do
            [[ -s "$f" ]] && { echo "--- tail of $(basename "$f")" >&2; tail -n 30 "$f" >&2; }
        done
    fi
    rm -rf "$work"
}
trap finish EXIT
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
stamp="$(date +%s)"
bucket="bench-$stamp"
table="bench-locks-$stamp"
# The Azure side's SAS (account-wide, a day, signed with the key Azurite was started with) is
# given to terrace in AZURE_STORAGE_SAS_TOKEN, never in a URL.
sas_file="$work/azure.sas"
"$py" - "$TERRACE_TEST_MOTO" "$TERRACE_TEST_GCS" "$bucket" "$table" "$TERRACE_TEST_AZURE_BLOB" \
    "$TERRACE_TEST_AZURE_ACCOUNT" "$sas_file" <<'PY'
import base64, datetime, hashlib, hmac, json, os, sys, urllib.parse, urllib.request, boto3
moto, gcs, bucket, table, azure, account, sas_file = sys.argv[1:]
boto3.client("s3", endpoint_url=moto).create_bucket(Bucket=bucket)
ddb = boto3.client("dynamodb", endpoint_url=moto)
# Terraform's s3 backend locks with key LockID; Terrace's lease table has key pk.
ddb.create_table(TableName=table, AttributeDefinitions=[{"AttributeName": "LockID", "AttributeType": "S"}],
                 KeySchema=[{"AttributeName": "LockID", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
ddb.create_table(TableName=table + "-leases", AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                 KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
req = urllib.request.Request(f"{gcs}/storage/v1/b?project=bench", data=json.dumps({"name": bucket}).encode(),
                             headers={"content-type": "application/json"}, method="POST")
urllib.request.urlopen(req, timeout=10).read()
expiry = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
version, services, types, permissions, protocols = "2025-11-05", "b", "sco", "rwdxlacuptfiy", "https,http"
to_sign = f"{account}\n{permissions}\n{services}\n{types}\n\n{expiry}\n\n{protocols}\n{version}\n\n"
key = base64.b64decode(os.environ["TERRACE_TEST_AZURE_KEY"])
sig = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
sas = urllib.parse.urlencode({"sv": version, "ss": services, "srt": types, "sp": permissions, "se": expiry,
                              "spr": protocols, "sig": sig})
urllib.request.urlopen(urllib.request.Request(f"{azure}/{bucket}?restype=container&{sas}", method="PUT"),
                       timeout=10).read()
with open(sas_file, "w") as f:
    f.write(sas)
PY

price_books="$repo_root/price-books"
[[ "$COST" == off ]] && price_books="$work/no-price-books"
vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'
now_ms() { date +%s%3N; }

# start_proxy UPSTREAM CLOUD DELAY LOG: the proxy's URL in $proxy_url.
start_proxy() {
    local fifo="$work/proxy-$RANDOM.url"
    mkfifo "$fifo"
    "$proxy_bin" "$1" "$2" "$3" "$4" >"$fifo" 2>>"$work/proxy.err" &
    proxies+=($!)
    read -r proxy_url <"$fifo"
    rm -f "$fifo"
}

# native_s3 LOCK RUN (LOCK: lockfile or dynamodb) and native_gcs RUN, through $s3 / $gcs.
native() {
    local side="$1" run="$2" d="$work/$1-$2"
    mkdir -p "$d" "$work/cloud-$1-$2"
    cp templates/demo/1.0.0/*.tf "$d/"
    echo "$vars" > "$d/terraform.tfvars.json"
    case "$side" in
        gcs) cat > "$d/backend_override.tf" <<HCL
terraform {
  backend "gcs" {
    bucket                  = "$bucket"
    prefix                  = "native/$side-$run"
    storage_custom_endpoint = "$gcs/storage/v1/"
    access_token            = "x" # a dummy: the emulator checks no credentials
  }
}
HCL
        ;;
        *)
            local locking='use_lockfile = true'
            [[ "$side" == s3-dynamodb ]] && locking="dynamodb_table = \"$table\""
            cat > "$d/backend_override.tf" <<HCL
terraform {
  backend "s3" {
    bucket                      = "$bucket"
    key                         = "native/$side-$run/terraform.tfstate"
    region                      = "us-east-1"
    $locking
    endpoints = {
      s3       = "$s3"
      dynamodb = "$s3"
      sts      = "$s3"
    }
    use_path_style              = true
    skip_credentials_validation = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
    skip_requesting_account_id  = true
  }
}
HCL
        ;;
    esac
    (
        cd "$d"
        export TESTCLOUD_ROOT="$work/cloud-$side-$run"
        "$tf" init -input=false -no-color >/dev/null
        "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
        "$tf" apply -input=false -no-color p.tfplan >/dev/null
    ) 2>>"$work/native.err"
}

terrace() {
    local side="$1" run="$2" store
    mkdir -p "$work/cloud-$side-$run"
    cat > "$work/job-$side-$run.yaml" <<JOB
id: bench-$side-$run
tenant: bench
workspace: $side-$run
operation: apply
template: { name: demo, version: 1.0.0 }
variables: $vars
JOB
    case "$side" in
        terrace-s3) store="s3://$bucket/terrace" ;;
        terrace-s3-table) store="s3://$bucket/terrace?lease_table=$table-leases" ;;
        terrace-gcs) store="gs://$bucket/terrace" ;;
        terrace-azure) store="$azure/$bucket/terrace" ;;
    esac
    AZURE_STORAGE_SAS_TOKEN="$(cat "$sas_file")" TERRACE_STORE="$store" AWS_ENDPOINT_URL="$s3" TERRACE_S3_FORCE_PATH_STYLE=1 \
        TERRACE_GCS_ENDPOINT="$gcs" TERRACE_GCS_ANONYMOUS=1 \
        TERRACE_TEMPLATES="$repo_root/templates" TERRACE_TERRAFORM="$tf" \
        TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" TERRACE_CACHE_DIR="$work/terrace-cache" \
        TERRACE_PRICE_BOOKS="$price_books" \
        TERRACE_PASS_ENV=TESTCLOUD_ROOT TESTCLOUD_ROOT="$work/cloud-$side-$run" TERRACE_LOG=warn \
        "$bin" run -q "$work/job-$side-$run.yaml" >/dev/null 2>>"$work/terrace.err"
}

run_side() {
    case "$1" in
        terrace-*) terrace "$1" "$2" ;;
        *) native "$1" "$2" ;;
    esac
}

: > "$work/runs.tsv"
for delay in $DELAYS; do
    start_proxy "$TERRACE_TEST_MOTO" aws "$delay" "$work/requests.jsonl"; s3="$proxy_url"
    start_proxy "$TERRACE_TEST_GCS" gcs "$delay" "$work/requests.jsonl"; gcs="$proxy_url"
    # Azurite's origin; the account is the first segment of the path.
    start_proxy "${TERRACE_TEST_AZURE_BLOB%/*}" azure "$delay" "$work/requests.jsonl"
    azure="$proxy_url/${TERRACE_TEST_AZURE_BLOB##*/}"
    for side in $SIDES; do run_side "$side" "warmup-$delay"; done
    for i in $(seq 1 "$N"); do
        for side in $SIDES; do
            t0=$(now_ms); run_side "$side" "$delay-$i"; t1=$(now_ms)
            printf '%s\t%s\t%s\t%s\n' "$side" "$delay" "$t0" "$t1" >> "$work/runs.tsv"
        done
    done
    for pid in "${proxies[@]}"; do kill "$pid" 2>/dev/null || true; done
    proxies=()
done

python3 - "$work" "$N" "$PROFILE" "$("$tf" version -json | python3 -c 'import json,sys; print(json.load(sys.stdin)["terraform_version"])')" <<'PY'
import collections, json, os, statistics, sys
w, n, profile, version = sys.argv[1:5]
runs = [line.split("\t") for line in open(f"{w}/runs.tsv").read().splitlines()]
requests = [json.loads(line) for line in open(f"{w}/requests.jsonl")]
requests.sort(key=lambda r: r["start_ms"])
ms = collections.defaultdict(list)
per_run = collections.defaultdict(list)
for side, delay, t0, t1 in runs:
    t0, t1 = int(t0), int(t1)
    ms[(side, int(delay))].append(t1 - t0)
    mine = [r for r in requests if t0 <= r["start_ms"] <= t1 + 1]
    per_run[(side, int(delay))].append(
        (len(mine), sum(r["sent"] for r in mine), sum(r["received"] for r in mine), mine))
delays = sorted({d for _, d in ms})
sides = list(dict.fromkeys(s for s, _ in ms))
native_of = {"terrace-s3": ["s3-lockfile", "s3-dynamodb"], "terrace-s3-table": ["s3-lockfile", "s3-dynamodb"],
             "terrace-gcs": ["gcs"]}
med = {k: statistics.median(v) for k, v in ms.items()}
print(f"runs: {n} each, interleaved; terraform {version}; terrace {profile} build, cost estimate "
      f"{os.environ.get('COST', 'off')}; delays {delays} ms per store request")
for d in delays:
    print(f"\n-- {d} ms added to every store request")
    for s in sides:
        ratios = "; ".join(f"{med[(s, d)] / med[(b, d)]:.2f}x {b}" for b in native_of.get(s, []) if (b, d) in med)
        counts = per_run[(s, d)]
        print(f"{s:17} median {med[(s, d)]:6.0f} ms  {ratios:34}  requests {statistics.median(c[0] for c in counts):4.0f}"
              f"  sent {statistics.median(c[1] for c in counts) / 1024:6.1f} KiB  received {statistics.median(c[2] for c in counts) / 1024:6.1f} KiB"
              f"  {sorted(ms[(s, d)])}")
# What a job costs in store requests, by the clouds' billing classes, at the list prices in
# PRICES (USD; defaults: S3 Standard and DynamoDB on-demand in us-east-1, GCS Standard in a
# region, Blob Storage hot LRS: check the providers' pages for yours). DELETE is free on all.
prices = {"s3-write": 0.005 / 1000, "s3-read": 0.0004 / 1000, "ddb-write": 0.625 / 1e6,
          "ddb-read": 0.125 / 1e6, "gcs-a": 0.005 / 1000, "gcs-b": 0.0004 / 1000,
          "az-write": 0.05 / 10000, "az-list": 0.05 / 10000, "az-read": 0.004 / 10000,
          "az-other": 0.004 / 10000}
for pair in os.environ.get("PRICES", "").split(","):
    if "=" in pair:
        k, v = pair.split("=", 1)
        prices[k.strip()] = float(v)
def billing_class(side, what):
    method, path = (what.split(" ", 1) + [""])[:2]
    if "(" in path:  # DynamoDB: POST / (Operation)
        op = path.split("(")[1].rstrip(")")
        return "ddb-read" if op in ("GetItem", "Query", "Scan") else "ddb-write"
    if "azure" in side:
        # Blob Storage's classes (hot tier): writes (Put Blob, Put Block List, Copy Blob),
        # listings, reads (Get Blob), and all other operations (properties, leases, metadata).
        query = path.split("?", 1)[1] if "?" in path else ""
        if method == "DELETE":
            return "free"
        if "comp=list" in query:
            return "az-list"
        if "comp=lease" in query or "comp=metadata" in query or method == "HEAD":
            return "az-other"
        if method in ("PUT", "POST"):
            return "az-write"
        return "az-read"
    if "gcs" in side:
        if method == "DELETE":
            return "free"
        if method == "POST" or path.rstrip("/").endswith("/o"):
            return "gcs-a"  # uploads, rewrites (copies), listings
        return "gcs-b"
    if method == "DELETE":
        return "free"
    if method in ("PUT", "POST") or path.count("/") <= 2 and path.endswith("/") or "/" not in path.strip("/"):
        return "s3-write"  # writes, copies, listings (a GET of the bucket itself)
    return "s3-read"
print(f"\n-- store requests per job by billing class, and what 1,000 jobs cost in them (USD, {delays[0]} ms runs)")
for s in sides:
    counts = per_run[(s, delays[0])]
    classes = collections.Counter()
    for c in counts:
        for r in c[3]:
            classes[billing_class(s, r["what"])] += 1
    per_job = {k: v / len(counts) for k, v in classes.items()}
    cost = sum(prices.get(k, 0) * v for k, v in per_job.items()) * 1000
    print(f"{s:17} " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_job.items())) + f"  -> ${cost:.4f} per 1,000 jobs")
top = delays[-1]
if top > 0:
    print(f"\n-- round trips waited one after the other: (median at {top} ms - median at 0) / {top} ms")
    for s in sides:
        if (s, 0) in med and (s, top) in med:
            print(f"{s:17} {(med[(s, top)] - med[(s, 0)]) / top:5.1f}")
    print(f"\n-- the requests of one run at {top} ms (start ms from the run's first request, wait in ms)")
    for s in sides:
        counts = per_run[(s, top)]
        mine = counts[len(counts) // 2][3]
        if not mine:
            continue
        first = mine[0]["start_ms"]
        print(f"{s}:")
        for r in mine:
            print(f"  {r['start_ms'] - first:7.0f} {r['end_ms'] - r['start_ms']:5.0f}  {r['what']}")
PY
