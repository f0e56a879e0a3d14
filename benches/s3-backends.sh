#!/usr/bin/env bash
# terraform's own `s3` backend, locked by an S3 lock file (`use_lockfile = true`, Terraform
# >= 1.10) and by a DynamoDB table (`dynamodb_table`), versus terraform through Terrace's state
# server on the S3 + DynamoDB store: the same moto, the same run, interleaved, N runs each
# (default 5). Every side applies the demo template to an empty workspace the way a reviewed
# plan is applied: init, plan -out, apply of the plan (Terrace reads the changes and outputs
# from the -json messages of the same two commands). The Terrace side is a whole job
# (`terrace-aws task`): two AssumeRole calls, the lease, validation of every state write, a new
# version per write, the log and the result in the bucket. Prints the medians, the ratios
# (target: <= 0.9 of use_lockfile) and the AWS calls per run, from moto's request log.
# PROFILE=release (default debug) builds terrace-aws optimised (about 15 minutes on 2 cores).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
N="${N:-5}"
PROFILE="${PROFILE:-debug}"

if [[ -z "${TERRACE_TEST_MOTO:-}" ]]; then
    scripts/install-tools.sh
    if [[ "$PROFILE" == release ]]; then cargo build --quiet --release -p aws; else cargo build --quiet -p aws; fi
    exec scripts/with-emulators.sh "$0" "$@"
fi

bin="$(scripts/target-dir.sh)/$PROFILE/terrace-aws"
tf="$(scripts/install-terraform.sh)"
py="$repo_root/.cache/moto/bin/python"
log="$TERRACE_TEST_MOTO_LOG"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
export CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1 TF_INPUT=0
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc"
bucket="bench-$(date +%s)"
table="bench-locks-$(date +%s)"
"$py" - "$TERRACE_TEST_MOTO" "$bucket" "$table" <<'PY'
import sys, boto3
url, bucket, table = sys.argv[1:]
boto3.client("s3", endpoint_url=url).create_bucket(Bucket=bucket)
ddb = boto3.client("dynamodb", endpoint_url=url)
# Terraform's s3 backend locks with key LockID; Terrace's lease table has key pk.
ddb.create_table(TableName=table, AttributeDefinitions=[{"AttributeName": "LockID", "AttributeType": "S"}],
                 KeySchema=[{"AttributeName": "LockID", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
ddb.create_table(TableName=table + "-leases", AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                 KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}], BillingMode="PAY_PER_REQUEST")
PY

vars='{"cluster_name":"bench","region":"eu-west-1","node_count":3,"instance_type":"small","cidr":"10.0.0.0/16","ha":false,"admin_password":"bench-password-123"}'
now_ms() { date +%s%3N; }
requests() { wc -l < "$log"; }

# native LOCK N: LOCK is "lockfile" or "dynamodb".
native() {
    local lock="$1" d="$work/native-$1-$2"
    mkdir -p "$d" "$work/cloud-native-$1-$2"
    cp templates/demo/1.0.0/*.tf "$d/"
    echo "$vars" > "$d/terraform.tfvars.json"
    local locking='use_lockfile = true'
    [[ "$lock" == dynamodb ]] && locking="dynamodb_table = \"$table\""
    cat > "$d/backend_override.tf" <<HCL
terraform {
  backend "s3" {
    bucket                      = "$bucket"
    key                         = "native-$lock/ws-$2/terraform.tfstate"
    region                      = "us-east-1"
    $locking
    endpoints = {
      s3       = "$TERRACE_TEST_MOTO"
      dynamodb = "$TERRACE_TEST_MOTO"
      sts      = "$TERRACE_TEST_MOTO"
    }
    use_path_style              = true
    skip_credentials_validation = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
    skip_requesting_account_id  = true
  }
}
HCL
    (
        cd "$d"
        export TESTCLOUD_ROOT="$work/cloud-native-$1-$2"
        "$tf" init -input=false -no-color >/dev/null
        "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
        "$tf" apply -input=false -no-color p.tfplan >/dev/null
    ) 2>>"$work/native.err"
}

terrace() {
    mkdir -p "$work/cloud-terrace-$1"
    local job
    job=$(cat <<JSON
{"job": {"id": "bench-$1", "tenant": "bench", "workspace": "ws-$1", "operation": "apply",
         "template": {"name": "demo", "version": "1.0.0"}, "variables": $vars}}
JSON
)
    local tenants
    tenants=$(cat <<JSON
{"bench": {"role_arn": "arn:aws:iam::123456789012:role/terrace", "external_id": "bench",
           "bucket": "$bucket", "prefix": "terrace", "lease_table": "$table-leases", "region": "us-east-1"}}
JSON
)
    TERRACE_JOB="$job" TERRACE_TENANTS="$tenants" AWS_ENDPOINT_URL="$TERRACE_TEST_MOTO" TERRACE_S3_FORCE_PATH_STYLE=1 \
        TERRACE_TEMPLATES="$repo_root/templates" TERRACE_TERRAFORM="$tf" \
        TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" TERRACE_PASS_ENV=TESTCLOUD_ROOT \
        TESTCLOUD_ROOT="$work/cloud-terrace-$1" TERRACE_LOG=warn \
        "$bin" task >/dev/null 2>>"$work/terrace.err"
}

sides=(lockfile dynamodb terrace)
for side in "${sides[@]}"; do : > "$work/$side.ms"; : > "$work/$side.calls"; done
run_side() {
    case "$1" in
        terrace) terrace "$2" ;;
        *) native "$1" "$2" ;;
    esac
}
for side in "${sides[@]}"; do run_side "$side" warmup; done
for i in $(seq 1 "$N"); do
    for side in "${sides[@]}"; do
        c0=$(requests); t0=$(now_ms); run_side "$side" "$i"; t1=$(now_ms); c1=$(requests)
        echo $((t1 - t0)) >> "$work/$side.ms"; echo $((c1 - c0)) >> "$work/$side.calls"
    done
done

python3 - "$work" "$N" "$PROFILE" "$("$tf" version -json | python3 -c 'import json,sys; print(json.load(sys.stdin)["terraform_version"])')" <<'PY'
import statistics, sys
w, n, profile, version = sys.argv[1:5]
read = lambda f: [int(x) for x in open(f"{w}/{f}")]
ms = {s: read(f"{s}.ms") for s in ("lockfile", "dynamodb", "terrace")}
calls = {s: read(f"{s}.calls") for s in ms}
med = {s: statistics.median(v) for s, v in ms.items()}
print(f"runs: {n} each, interleaved; terraform {version}; terrace-aws {profile} build")
print(f"native s3 backend, use_lockfile:   median {med['lockfile']:.0f} ms  {ms['lockfile']}")
print(f"native s3 backend, DynamoDB lock:  median {med['dynamodb']:.0f} ms  {ms['dynamodb']}")
print(f"terrace (whole job, S3 + DynamoDB store): median {med['terrace']:.0f} ms  {ms['terrace']}")
print(f"ratio terrace/use_lockfile: {med['terrace'] / med['lockfile']:.2f} (target <= 0.9); "
      f"terrace/DynamoDB lock: {med['terrace'] / med['dynamodb']:.2f}")
print("AWS calls per run (moto's request log), median: " + ", ".join(
    f"{s} {statistics.median(c):.0f}" for s, c in calls.items()))
PY
