#!/usr/bin/env bash
# Finds Debian's rabbitmq-server (AMQP 0-9-1 broker, with Erlang), installing it with apt-get
# where it is missing. Prints the path of `rabbitmq-server`. The package's own service is never
# started (a policy-rc.d refusing starts is put in place for the install when the machine has
# none): scripts/with-emulators.sh runs a node of its own on loopback.
set -euo pipefail
if command -v rabbitmq-server >/dev/null 2>&1 && command -v rabbitmqctl >/dev/null 2>&1; then
    command -v rabbitmq-server
    exit 0
fi
sudo=""
[[ "$(id -u)" == 0 ]] || sudo="sudo"
echo "installing rabbitmq-server with apt-get" >&2
placed=false
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# placed by terrace scripts/install-rabbitmq.sh for one install\nexit 101\n' |
        $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod 755 /usr/sbin/policy-rc.d
    placed=true
fi
status=0
{ $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq rabbitmq-server; } >&2 || status=$?
if $placed; then
    $sudo rm -f /usr/sbin/policy-rc.d
fi
if ((status != 0)) || ! command -v rabbitmq-server >/dev/null 2>&1; then
    echo "could not install rabbitmq-server with apt-get (exit $status): the RabbitMQ tests need Debian's package" >&2
    exit 1
fi
command -v rabbitmq-server
