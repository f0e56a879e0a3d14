#!/usr/bin/env bash
# The demo's self-hosted part, run by scripts/demo.sh under scripts/with-rabbitmq.sh: two
# `terrace serve --queue amqps://…` workers share three jobs sent with `terrace submit --to
# amqps://…` (TLS, the node's certificate signed by a CA made for the run, which
# TERRACE_AMQP_CA_FILE names), each workspace leased in the demo's store. Prints which worker
# ran which job.
set -euo pipefail
demo="$1"
# shellcheck source=/dev/null
. "$demo/env"
export TERRACE_AMQP_USER="$TERRACE_TEST_AMQP_USER" TERRACE_AMQP_PASSWORD="$TERRACE_TEST_AMQP_PASSWORD"
export TERRACE_AMQP_CA_FILE="$TERRACE_TEST_AMQP_CA"
url="$TERRACE_TEST_AMQPS/?jobs=demo.jobs&results=demo.results&logs=demo.logs"
as_you=()
[[ "$(id -u)" == 0 ]] && as_you=(env TERRACE_TERRAFORM_USER=root)
workers=()
stop() {
    for pid in "${workers[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${workers[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
for n in 1 2; do
    "${as_you[@]}" terrace serve --queue "$url" --declare --concurrency 1 2> "$demo/worker-$n.log" &
    workers+=("$!")
done
echo "\$ export TERRACE_AMQP_CA_FILE=ca.pem   # the CA that signed the broker's TLS certificate"
echo "\$ terrace serve --queue 'amqps://localhost:PORT/?jobs=demo.jobs' --declare   # twice: workers 1 and 2"
for n in 1 2; do
    until grep -q "^serving queue" "$demo/worker-$n.log"; do
        kill -0 "${workers[$((n - 1))]}" 2>/dev/null || { cat "$demo/worker-$n.log" >&2; exit 1; }
        sleep 0.1
    done
done
jobs=()
for team in a b c; do
    id="demo-team-$team"
    sed -e "s/^id: demo-apply-1/id: $id/" -e "s/^workspace: demo/workspace: team-$team/" \
        -e "s/cluster_name: demo/cluster_name: team-$team/" -e '/^sequence:/d' \
        examples/demo-job.yaml > "$demo/$id.yaml"
    echo "\$ terrace submit $id.yaml --to 'amqps://localhost:PORT/?jobs=demo.jobs'"
    terrace submit "$demo/$id.yaml" --to "$url" 2>/dev/null
    jobs+=("$id")
done
for id in "${jobs[@]}"; do
    ws="acme/team-${id#demo-team-}"
    for _ in $(seq 1 600); do
        code=0
        terrace result "$id" -w "$ws" > /dev/null 2>&1 || code=$?
        [[ "$code" == 66 || "$code" == 75 ]] || break
        sleep 0.1
    done
    if ! status="$(terrace result "$id" -w "$ws" --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>/dev/null)"; then
        echo "$id has no result after 60 s; the workers said:" >&2
        tail -n 20 "$demo"/worker-*.log >&2
        exit 1
    fi
    ran_on="$(grep -l "^\[$id\]" "$demo"/worker-*.log | sed 's/.*worker-\([0-9]*\)\.log/worker \1/' | paste -sd, -)"
    echo "$id: $status on $ran_on"
done
