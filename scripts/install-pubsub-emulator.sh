#!/usr/bin/env bash
# Finds gcloud's Pub/Sub emulator (Debian package google-cloud-cli-pubsub-emulator, from the
# Google Cloud CLI apt repository; it needs Java 17), installing it with apt-get where that
# repository is configured. Prints the emulator's start script. The emulator is not on PyPI or
# npm: where apt cannot reach it, this says so in one line and fails.
set -euo pipefail
find_emulator() {
    local sdk
    for sdk in "${CLOUDSDK_ROOT_DIR:-}" /usr/lib/google-cloud-sdk /usr/share/google-cloud-sdk \
        "$(dirname "$(dirname "$(readlink -f "$(command -v gcloud 2>/dev/null || echo /nonexistent)")")")"; do
        [[ -n "$sdk" && -x "$sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator" ]] || continue
        echo "$sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"
        return 0
    done
    return 1
}
if emulator="$(find_emulator)"; then
    echo "$emulator"
    exit 0
fi
sudo=""
[[ "$(id -u)" == 0 ]] || sudo="sudo"
if apt-cache policy google-cloud-cli-pubsub-emulator 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "installing google-cloud-cli-pubsub-emulator with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq google-cloud-cli-pubsub-emulator default-jre-headless >&2
    if emulator="$(find_emulator)"; then
        echo "$emulator"
        exit 0
    fi
fi
echo "the Pub/Sub emulator is missing: install the Debian package google-cloud-cli-pubsub-emulator (Google Cloud CLI apt repository) and Java 17" >&2
exit 1
