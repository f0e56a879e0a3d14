#!/usr/bin/env bash
# terraform's own `s3` backend (with `dynamodb_table` locking) versus terraform through
# Terrace's state server on the S3 + DynamoDB store, against the same moto, same run,
# interleaved, N runs each (default 5). Both run the demo template from an empty workspace with
# the same steps: init, plan -out, show -json, apply of the plan, output -json. The Terrace side
# is a whole job (`terrace-aws task`): two AssumeRole calls, the lease, validation of every state
# write, a new version per write, the log and the result in the bucket. Prints the medians, the
# ratio (target <= 1.0) and the number of AWS calls per run, from moto's request log.
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

bin="$repo_root/target/$PROFILE/terrace-aws"
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

native() {
    local d="$work/native-$1"
    mkdir -p "$d" "$work/cloud-native-$1"
    cp templates/demo/1.0.0/*.tf "$d/"
    echo "$vars" > "$d/terraform.tfvars.json"
    cat > "$d/backend_override.tf" <<HCL
terraform {
  backend "s3" {
    bucket                      = "$bucket"
    key                         = "native/ws-$1/terraform.tfstate"
    region                      = "us-east-1"
    dynamodb_table              = "$table"
    endpoint                    = "$TERRACE_TEST_MOTO"
    dynamodb_endpoint           = "$TERRACE_TEST_MOTO"
    sts_endpoint                = "$TERRACE_TEST_MOTO"
    force_path_style            = true
    skip_credentials_validation = true
    skip_metadata_api_check     = true
    skip_region_validation      = true
  }
}
HCL
    (
        cd "$d"
        export TESTCLOUD_ROOT="$work/cloud-native-$1"
        "$tf" init -input=false -no-color >/dev/null
        "$tf" plan -input=false -no-color -out=p.tfplan >/dev/null
        "$tf" show -json -no-color p.tfplan >/dev/null
        "$tf" apply -input=false -no-color p.tfplan >/dev/null
        "$tf" output -json -no-color >/dev/null
    ) 2>>"$work/native.err"
}

terrace() {
    mkdir -p "$work/cloud-terrace-$1"
    local job
    job=$(cat <<JSON
{"job": {"id": "bench-$1", "tenant": "bench", "workspace": "ws-$1", "operation": "apply",
         "template": {"name": "demo", "version": "1.0.0"}, "variables": $vars},
 "target": {"role_arn": "arn:aws:iam::123456789012:role/terrace", "external_id": "bench",
            "bucket": "$bucket", "prefix": "terrace", "lease_table": "$table-leases", "region": "us-east-1"}}
JSON
)
    TERRACE_JOB="$job" AWS_ENDPOINT_URL="$TERRACE_TEST_MOTO" TERRACE_S3_FORCE_PATH_STYLE=1 \
        TERRACE_TEMPLATES="$repo_root/templates" TERRACE_TERRAFORM="$tf" \
        TERRACE_TF_CLI_CONFIG="$TF_CLI_CONFIG_FILE" TERRACE_PASS_ENV=TESTCLOUD_ROOT \
        TESTCLOUD_ROOT="$work/cloud-terrace-$1" TERRACE_LOG=warn \
        "$bin" task >/dev/null 2>>"$work/terrace.err"
}

: > "$work/native.ms"; : > "$work/terrace.ms"; : > "$work/native.calls"; : > "$work/terrace.calls"
native warmup; terrace warmup
for i in $(seq 1 "$N"); do
    c0=$(requests); t0=$(now_ms); native "$i"; t1=$(now_ms); c1=$(requests)
    echo $((t1 - t0)) >> "$work/native.ms"; echo $((c1 - c0)) >> "$work/native.calls"
    c0=$(requests); t0=$(now_ms); terrace "$i"; t1=$(now_ms); c1=$(requests)
    echo $((t1 - t0)) >> "$work/terrace.ms"; echo $((c1 - c0)) >> "$work/terrace.calls"
done

python3 - "$work" "$N" "$PROFILE" <<'PY'
import statistics, sys
w, n, profile = sys.argv[1], sys.argv[2], sys.argv[3]
read = lambda f: [int(x) for x in open(f"{w}/{f}")]
nat, ter = read("native.ms"), read("terrace.ms")
nc, tc = read("native.calls"), read("terrace.calls")
mn, mt = statistics.median(nat), statistics.median(ter)
print(f"runs: {n} each, interleaved; terrace-aws {profile} build")
print(f"native s3 backend + DynamoDB lock: median {mn:.0f} ms  {nat}")
print(f"terrace (state server, S3 + DynamoDB store, whole job): median {mt:.0f} ms  {ter}")
print(f"ratio terrace/native: {mt / mn:.2f} (target <= 1.0)")
print(f"AWS calls per run (moto's request log): native median {statistics.median(nc):.0f}, terrace median {statistics.median(tc):.0f}")
PY
