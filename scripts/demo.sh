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

bin="$(scripts/target-dir.sh)/debug"
terrace="$bin/terrace"
terraform="$(scripts/install-terraform.sh)"
# The demo's settings, kept for the commands a person runs next, by hand. The test cloud's
# "credentials" are the folder it keeps resources in, passed to terraform only.
cat > "$demo/env" <<ENV
export TERRACE_STORE="$demo/store"
export TERRACE_TEMPLATES="$repo_root/templates"
export TERRACE_TERRAFORM="$terraform"
export TERRACE_TF_CLI_CONFIG="$repo_root/.cache/terraformrc"
export TESTCLOUD_ROOT="$demo/cloud"
export TERRACE_PASS_ENV=TESTCLOUD_ROOT
export PATH="$bin:\$PATH"
ENV
# shellcheck source=/dev/null
. "$demo/env"

# The platform's key (age): the job's sensitive outputs are sealed to it in the result.
age-keygen -o "$demo/platform.key" 2>/dev/null
recipient="$(sed -n 's/^# public key: //p' "$demo/platform.key")"

echo "== terrace run examples/demo-job.yaml (sensitive outputs sealed to the platform's age key)"
TERRACE_OUTPUTS_RECIPIENT="$recipient" "$terrace" run examples/demo-job.yaml
echo
echo "== the platform opens the sealed outputs with its identity"
echo "\$ terrace result demo-apply-1 --identity .terrace-demo/platform.key"
"$terrace" result demo-apply-1 --identity "$demo/platform.key"
echo
echo "== an older request (sequence 1) arrives after demo-apply-1 (sequence 2) ran"
sed -e 's/^id: demo-apply-1/id: demo-apply-0/' -e 's/^sequence: 2/sequence: 1/' \
    -e 's/node_count: 3/node_count: 5/' examples/demo-job.yaml > "$demo/older-request.yaml"
code=0
"$terrace" run -q "$demo/older-request.yaml" || code=$?
if [[ "$code" != 1 ]]; then
    echo "the older request should have been superseded (exit 1); it exited $code" >&2
    exit 1
fi
echo
echo "== a plan for approval: examples/demo-plan.yaml (what it changes, what it costs)"
"$terrace" run --json -q examples/demo-plan.yaml > "$demo/plan-result.json" || {
    echo "the plan job failed: $(cat "$demo/plan-result.json")" >&2
    exit 1
}
"$terrace" result demo-plan-1 -w acme/demo
# The plan's own key is in the result as it is delivered (here, run's output), stored nowhere.
key="$(sed -n 's/.*"key": *"\([A-Za-z0-9_-]*\)".*/\1/p' "$demo/plan-result.json")"
cat > "$demo/approved-apply.yaml" <<JOB
# The approved plan, applied exactly as it was shown: terraform plans nothing again.
id: demo-approved-1
tenant: acme
workspace: demo
operation: apply
template: { name: demo, version: 1.0.0 }
plan: demo-plan-1
plan_key: $key
JOB
echo
echo "== the approved plan applied ($demo/approved-apply.yaml)"
"$terrace" run "$demo/approved-apply.yaml"
echo
echo "== the same plan once more: refused, nothing runs"
sed -e 's/^id: demo-approved-1/id: demo-approved-2/' "$demo/approved-apply.yaml" > "$demo/approved-again.yaml"
code=0
"$terrace" run "$demo/approved-again.yaml" || code=$?
if [[ "$code" != 1 ]]; then
    echo "a plan applied twice should be refused (exit 1); it exited $code" >&2
    exit 1
fi
echo
echo "== policies on plans: every plan held to policies/demo before anything is applied (docs/policy.md)"
for nodes in 12 3; do
    sed -e "s/^id: demo-apply-1/id: demo-policy-$nodes/" -e 's/^workspace: demo/workspace: policy/' \
        -e 's/cluster_name: demo/cluster_name: policy/' -e "s/node_count: 3/node_count: $nodes/" \
        -e '/sequence/d' examples/demo-job.yaml > "$demo/policy-$nodes.yaml"
done
echo "\$ terrace run --policies policies/demo policy-12.yaml    # a cluster of 12 nodes"
code=0
"$terrace" run -q --policies policies/demo "$demo/policy-12.yaml" || code=$?
if [[ "$code" != 1 ]]; then
    echo "the plan that breaks the policy should have been stopped (exit 1); it exited $code" >&2
    exit 1
fi
echo
echo "\$ terrace run --policies policies/demo policy-3.yaml     # 3 small nodes: warned, applied"
"$terrace" run -q --policies policies/demo "$demo/policy-3.yaml"
echo
echo "== signed jobs: tenant acme takes only jobs its platform's key signed (docs/signing.md)"
echo "\$ terrace keygen --out .terrace-demo/sender.pem"
"$terrace" keygen --out "$demo/sender.pem" > "$demo/sender.pub" 2>/dev/null
printf 'acme: [%s]\n' "$(cat "$demo/sender.pub")" > "$demo/senders.yaml"
mkdir -p "$demo/queue"
sed -e 's/^id: demo-apply-1/id: demo-signed-1/' -e 's/^workspace: demo/workspace: signed/' \
    -e 's/cluster_name: demo/cluster_name: signed/' -e 's/^sequence: 2/sequence: 1/' \
    examples/demo-job.yaml > "$demo/signed-job.yaml"
sed -e 's/^id: demo-signed-1/id: demo-unsigned-1/' "$demo/signed-job.yaml" > "$demo/unsigned-job.yaml"
echo "\$ terrace submit unsigned-job.yaml --to .terrace-demo/queue"
"$terrace" submit "$demo/unsigned-job.yaml" --to "$demo/queue" 2>/dev/null
echo "\$ terrace submit signed-job.yaml --to .terrace-demo/queue --sign .terrace-demo/sender.pem"
"$terrace" submit "$demo/signed-job.yaml" --to "$demo/queue" --sign "$demo/sender.pem" 2>/dev/null
echo "\$ terrace serve --queue .terrace-demo/queue --once --senders .terrace-demo/senders.yaml"
# Run as root, serve gives each job's terraform a user of its own, which a checkout in a
# private folder hides the provider's mirror from (`make test` opens the path for it): the
# demo's jobs are yours, so they run as you.
as_you=()
[[ "$(id -u)" == 0 ]] && as_you=(env TERRACE_TERRAFORM_USER=root)
"${as_you[@]}" "$terrace" serve -q --queue "$demo/queue" --once --senders "$demo/senders.yaml" 2> "$demo/serve.log" || {
    cat "$demo/serve.log" >&2
    exit 1
}
unsigned="$demo/queue/failed/demo-unsigned-1.json.result.json"
signed="$demo/queue/done/demo-signed-1.json.result.json"
if [[ ! -f "$unsigned" || ! -f "$signed" ]]; then
    echo "the unsigned job should be refused and the signed one run" >&2
    exit 1
fi
python3 - "$unsigned" "$signed" <<'PY'
import json, sys
refused, ran = (json.load(open(p)) for p in sys.argv[1:3])
error = refused["errors"][0]
print(f"demo-unsigned-1: {refused['status']}: {error['field']} {error['problem']}")
print(f"demo-signed-1:   {ran['status']}")
PY
echo
echo "== self-hosted workers on RabbitMQ over TLS: two share three jobs (docs/self-hosted.md)"
scripts/with-rabbitmq.sh scripts/demo-workers.sh "$demo" 2> "$demo/rabbitmq.log" || {
    cat "$demo/rabbitmq.log" >&2
    exit 1
}
echo
echo "== terrace cancel demo-apply-1 (a finished job: nothing changes)"
"$terrace" cancel demo-apply-1
echo
echo "== terrace state versions acme/demo"
"$terrace" state versions acme/demo
echo
echo "== the test cloud now holds:"
find "$demo/cloud" -name '*.json' | sort | sed "s|$repo_root/||"
cat <<TXT

Next, with the demo's store, templates and test cloud in your shell:
  . .terrace-demo/env
change node_count in examples/demo-job.yaml (a new id, and a sequence above 2: a job
with an older one than the workspace's last never runs), then
  terrace run examples/demo-job.yaml
  terrace state versions acme/demo
  terrace state restore acme/demo --version 1
and see what happened to the workspace:
  terrace status acme/demo
  terrace runs acme/demo
  terrace logs acme/demo          # --follow while a job runs
  terrace cancel JOB -w acme/demo # a queued job never runs, a running one stops
and plan for approval: edit examples/demo-plan.yaml (its id too), run it, then apply the
plan it kept with a job naming it (see .terrace-demo/approved-apply.yaml, docs/approval.md);
hold a plan to policies before it is applied (docs/policy.md, policies/examples/):
  terrace run --policies policies/demo examples/demo-job.yaml
send a job to a runner as a platform would (README: "Driving a deployed runner"):
  terrace submit JOB_FILE --to QUEUE --follow   # sqs://, pubsub://, azqueue://, amqp[s]:// or a serve folder
  terrace submit JOB_FILE --to QUEUE --sign .terrace-demo/sender.pem   # signed (docs/signing.md)
  terrace schema                                # the records a platform reads (docs/schema/)
(make demo starts again from nothing.)
TXT
