#!/usr/bin/env bash
# The demo: apply the demo template (a network and a cluster in the test cloud) through the
# local runner, print its outputs, then the workspace's state versions. Starts from a clean
# demo folder each time: .terrace-demo/{store,cloud}.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
cargo build --quiet -p local
demo="$repo_root/.terrace-demo"
rm -rf "$demo"
mkdir -p "$demo/cloud"

export TERRACE_STORE="$demo/store"
export TERRACE_TEMPLATES="$repo_root/templates"
export TERRACE_TERRAFORM="$(scripts/install-terraform.sh)"
export TERRACE_TF_CLI_CONFIG="$repo_root/.cache/terraformrc"
# The test cloud's "credentials": the folder it keeps resources in, passed to terraform only.
export TESTCLOUD_ROOT="$demo/cloud"
export TERRACE_PASS_ENV=TESTCLOUD_ROOT
terrace="$(scripts/target-dir.sh)/debug/terrace"

echo "== terrace run examples/demo-job.yaml"
"$terrace" run examples/demo-job.yaml
echo
echo "== terrace state versions acme/demo"
"$terrace" state versions acme/demo
echo
echo "== the test cloud now holds:"
find "$demo/cloud" -name '*.json' | sort | sed "s|$repo_root/||"
cat <<TXT

Next: change node_count in examples/demo-job.yaml (and its id), run it again, then
  TERRACE_STORE=$demo/store $terrace state versions acme/demo
  TERRACE_STORE=$demo/store $terrace state restore acme/demo --version 1
and see what happened to the workspace:
  TERRACE_STORE=$demo/store $terrace status acme/demo
  TERRACE_STORE=$demo/store $terrace runs acme/demo
  TERRACE_STORE=$demo/store $terrace logs acme/demo          # --follow while a job runs
TXT
