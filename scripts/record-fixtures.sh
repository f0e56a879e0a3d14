#!/usr/bin/env bash
# Re-records the terraform output the unit tests read (shared/tests/fixtures/{ui,errors}) by
# running the real terraform on this machine against the test cloud, with the testcloud
# provider's injected faults. Nothing in these files is written by hand.
#
# Usage: scripts/record-fixtures.sh   (after `make tools`; TERRACE_TERRAFORM picks the binary)
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tf="$("$repo_root/scripts/install-terraform.sh")"
ui="$repo_root/shared/tests/fixtures/ui"
errors="$repo_root/shared/tests/fixtures/errors"
mkdir -p "$ui" "$errors"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export TF_CLI_CONFIG_FILE="$repo_root/.cache/terraformrc" CHECKPOINT_DISABLE=1 TF_IN_AUTOMATION=1
export TESTCLOUD_ROOT="$work/cloud"
mkdir -p "$TESTCLOUD_ROOT" "$work/tf"
cd "$work/tf"
cp "$repo_root"/templates/demo/1.0.0/*.tf .
vars() {
    printf '{"cluster_name":"demo","region":"eu-west-1","node_count":%s,"instance_type":"small","cidr":"10.0.0.0/16","admin_password":"hunter22","ha":false}\n' "$1" >terrace.auto.tfvars.json
}
faults() { printf '%s\n' "$1" >"$TESTCLOUD_ROOT/faults.json"; }
plan() { "$tf" plan -json -input=false -no-color -out=p.tfplan "$@" || true; }
apply() { "$tf" apply -json -input=false -no-color p.tfplan || true; }

vars 3
"$tf" init -input=false -no-color >/dev/null
plan >"$ui/plan-create.jsonl"
TESTCLOUD_CREATE_DELAY_MS=11000 apply >"$ui/apply-create.jsonl"

# Faults on the cluster's update: each fires once.
for kind in quota transient auth; do
    vars 4
    faults "[{\"resource\":\"testcloud_cluster\",\"op\":\"update\",\"kind\":\"$kind\",\"times\":1}]"
    plan >/dev/null
    apply >"$errors/apply-$kind.jsonl"
done
cp "$errors/apply-quota.jsonl" "$ui/apply-quota.jsonl"

# A create the cloud carries out but reports as failed, then the next create meets it.
faults '[{"resource":"testcloud_network","op":"create","kind":"false-failure","times":1}]'
sed -i 's/"demo"/"demo2"/' terrace.auto.tfvars.json
rm -f "$TESTCLOUD_ROOT/faults.json"
"$tf" apply -json -input=false -no-color -auto-approve -replace=testcloud_network.main >/dev/null || true
faults '[{"resource":"testcloud_network","op":"create","kind":"false-failure","times":1}]'
"$tf" apply -json -input=false -no-color -auto-approve -replace=testcloud_network.main >"$errors/apply-false-failure.jsonl" || true
rm -f "$TESTCLOUD_ROOT/faults.json"
"$tf" apply -json -input=false -no-color -auto-approve -replace=testcloud_network.main >"$errors/apply-already-exists.jsonl" || true

# Drift: the cluster changed in the cloud, seen by a refresh-only plan.
vars 3
"$tf" apply -json -input=false -no-color -auto-approve >/dev/null
cluster="$(ls "$TESTCLOUD_ROOT"/cluster/*.json | head -n 1)"
python3 - "$cluster" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); d["instance_type"] = "large"; json.dump(d, open(sys.argv[1], "w"))
PY
plan -refresh-only >"$ui/plan-refresh-only-drift.jsonl"
"$tf" show -json p.tfplan >"$ui/show-refresh-only-drift.json"

# Configuration errors.
echo 'output "bad" { value = var.nope }' >bad.tf
plan >"$errors/plan-undeclared-variable.jsonl"
rm bad.tf
mkdir -p "$work/missing" && cd "$work/missing"
printf 'terraform {\n  required_providers {\n    nope = { source = "terrace/nope", version = "1.0.0" }\n  }\n}\n' >main.tf
"$tf" init -input=false -no-color >"$errors/init-provider-missing.stdout" 2>&1 || true
sed -i "s|$repo_root|REPO|g" "$errors/init-provider-missing.stdout"

echo "recorded with $("$tf" version | head -n 1) into $ui and $errors" >&2
