#!/usr/bin/env bash
# Runs a command with the cloud emulators the tests need running on loopback, and stops them
# afterwards whatever happens. Installs them first (idempotent). Exports:
#   TERRACE_TEST_MOTO      http://127.0.0.1:PORT  (moto: S3, DynamoDB, SQS, STS, KMS, ECS)
#   TERRACE_TEST_MOTO_LOG  its request log (one line per request)
#   TERRACE_TEST_GCS       http://127.0.0.1:PORT  (fake-gcs-server: GCS's JSON API)
#   TERRACE_TEST_AZURE_BLOB   http://127.0.0.1:PORT/terrace  (Azurite's Blob service)
#   TERRACE_TEST_AZURE_QUEUE  http://127.0.0.1:PORT/terrace  (Azurite's Queue service)
#   TERRACE_TEST_AZURE_ACCOUNT, TERRACE_TEST_AZURE_KEY  its account, with a key made at start
#   TERRACE_TEST_PUBSUB    http://127.0.0.1:PORT  (gcloud's Pub/Sub emulator: topics, push
#                          subscriptions with dead-letter policies)
#   and what scripts/with-rabbitmq.sh exports (TERRACE_TEST_AMQP…: a RabbitMQ node)
# Usage: scripts/with-emulators.sh COMMAND [ARGS...]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
logs="$repo_root/.cache/emulators"
mkdir -p "$logs"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until URL answers (any HTTP status), or fails after 60 s.
wait_for() {
    local name="$1" url="$2" pid="$3"
    python3 - "$name" "$url" "$pid" <<'PY'
import os, sys, time, urllib.request, urllib.error
name, url, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.time() + 60
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"{name} exited during start-up; see its log in .cache/emulators/")
    try:
        urllib.request.urlopen(url, timeout=2)
        sys.exit(0)
    except urllib.error.HTTPError:
        sys.exit(0)
    except Exception:
        time.sleep(0.2)
sys.exit(f"{name} did not answer on {url} within 60 s")
PY
}

pids=()
stop() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap stop EXIT


moto_server="$("$repo_root/scripts/install-moto.sh")"
moto_port="$(free_port)"
# moto_server, with DynamoDB's conditional writes made atomic as in AWS (see the script).
"$(dirname "$moto_server")/python" "$repo_root/scripts/moto-server.py" 127.0.0.1 "$moto_port" \
    >"$logs/moto-$moto_port.log" 2>&1 &
pids+=("$!")
wait_for moto "http://127.0.0.1:$moto_port/moto-api/" "${pids[-1]}"
export TERRACE_TEST_MOTO="http://127.0.0.1:$moto_port"
export TERRACE_TEST_MOTO_LOG="$logs/moto-$moto_port.log"

fake_gcs="$("$repo_root/scripts/install-fake-gcs.sh")"
gcs_port="$(free_port)"
"$fake_gcs" -scheme http -host 127.0.0.1 -port "$gcs_port" -backend memory \
    -external-url "http://127.0.0.1:$gcs_port" -public-host "127.0.0.1:$gcs_port" \
    -log-level warn >"$logs/fake-gcs-$gcs_port.log" 2>&1 &
pids+=("$!")
wait_for fake-gcs-server "http://127.0.0.1:$gcs_port/storage/v1/b" "${pids[-1]}"
export TERRACE_TEST_GCS="http://127.0.0.1:$gcs_port"

azurite="$("$repo_root/scripts/install-azurite.sh")"
# An account of our own, with a key made now, instead of the emulator's well-known one.
azure_account="terrace"
azure_key="$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(64)).decode())')"
blob_port="$(free_port)"
queue_port="$(free_port)"
AZURITE_ACCOUNTS="$azure_account:$azure_key" "$azurite" --silent --inMemoryPersistence --disableTelemetry --skipApiVersionCheck --loose \
    --blobHost 127.0.0.1 --blobPort "$blob_port" --queueHost 127.0.0.1 --queuePort "$queue_port" \
    --tableHost 127.0.0.1 --tablePort "$(free_port)" \
    >"$logs/azurite-$blob_port.log" 2>&1 &
pids+=("$!")
wait_for azurite "http://127.0.0.1:$blob_port/$azure_account?comp=list" "${pids[-1]}"
wait_for azurite-queue "http://127.0.0.1:$queue_port/$azure_account?comp=list" "${pids[-1]}"
export TERRACE_TEST_AZURE_BLOB="http://127.0.0.1:$blob_port/$azure_account"
export TERRACE_TEST_AZURE_QUEUE="http://127.0.0.1:$queue_port/$azure_account"
export TERRACE_TEST_AZURE_ACCOUNT="$azure_account"
export TERRACE_TEST_AZURE_KEY="$azure_key"

pubsub="$("$repo_root/scripts/install-pubsub-emulator.sh")"
pubsub_port="$(free_port)"
# Started directly (not through `gcloud beta emulators`), so stopping it stops its JVM.
"$pubsub" --host=127.0.0.1 --port="$pubsub_port" >"$logs/pubsub-$pubsub_port.log" 2>&1 &
pids+=("$!")
wait_for pubsub "http://127.0.0.1:$pubsub_port/" "${pids[-1]}"
export TERRACE_TEST_PUBSUB="http://127.0.0.1:$pubsub_port"


echo "emulators: moto on $TERRACE_TEST_MOTO, fake-gcs-server on $TERRACE_TEST_GCS, azurite on $TERRACE_TEST_AZURE_BLOB and $TERRACE_TEST_AZURE_QUEUE, Pub/Sub on $TERRACE_TEST_PUBSUB" >&2

"$repo_root/scripts/with-rabbitmq.sh" "$@"
