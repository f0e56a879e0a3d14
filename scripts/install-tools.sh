#!/usr/bin/env bash
# Installs everything the demo and the tests need, idempotently, into .cache/ (git-ignored):
# protoc (to build the testcloud provider), age, a check that the machine's terraform is a supported
# client (scripts/install-terraform.sh), the testcloud provider in a filesystem mirror, a
# terraform CLI config using it, RabbitMQ (Debian's rabbitmq-server) and the cloud emulators
# (moto, fake-gcs-server, Azurite, the Pub/Sub emulator). `--demo`: only what the demo needs
# (no cloud emulators).
set -euo pipefail
demo_only=false
[[ "${1:-}" == "--demo" ]] && demo_only=true
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

if ! command -v protoc >/dev/null 2>&1; then
    echo "installing protoc (protobuf-compiler) with apt-get" >&2
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq protobuf-compiler >&2
fi

# age (age, age-keygen): a platform's key for sealed sensitive outputs (docs/outputs.md); the
# demo makes one and the tests open sealed outputs with the real `age -d`.
if ! command -v age-keygen >/dev/null 2>&1; then
    echo "installing age with apt-get" >&2
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq age >&2
fi

tf="$(scripts/install-terraform.sh)"
mirror="$(scripts/install-testcloud-provider.sh)"
cat > .cache/terraformrc <<HCL
provider_installation {
  filesystem_mirror {
    path = "$mirror"
  }
}
HCL
# The demo's self-hosted workers share a RabbitMQ node (Debian's rabbitmq-server).
scripts/install-rabbitmq.sh >/dev/null
if $demo_only; then
    echo "demo tools ready: terraform $tf, provider mirror $mirror, rabbitmq-server" >&2
    exit 0
fi
scripts/install-moto.sh >/dev/null
scripts/install-fake-gcs.sh >/dev/null
scripts/install-azurite.sh >/dev/null
scripts/install-pubsub-emulator.sh >/dev/null
echo "tools ready: terraform $tf, provider mirror $mirror, moto in .cache/moto, fake-gcs-server in .cache/fake-gcs, azurite in .cache/azurite, the Pub/Sub emulator, rabbitmq-server" >&2
