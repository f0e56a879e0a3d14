#!/usr/bin/env bash
# Runs a command with a RabbitMQ node of its own on loopback (Debian's rabbitmq-server, installed
# by scripts/install-rabbitmq.sh), and stops it afterwards whatever happens. Its data lives in a
# temporary folder, deleted afterwards; the node has its own name, ports and epmd. Exports:
#   TERRACE_TEST_AMQP           amqp://127.0.0.1:PORT
#   TERRACE_TEST_AMQPS          amqps://localhost:PORT, the same node over TLS, its certificate
#                               signed by a CA made at start:
#   TERRACE_TEST_AMQP_CA        that CA's certificate (PEM)
#   TERRACE_TEST_AMQP_USER, TERRACE_TEST_AMQP_PASSWORD  a user made at start (no guest)
#   TERRACE_TEST_RABBITMQ_NODE, TERRACE_TEST_RABBITMQ_HOME, ERL_EPMD_PORT  for
#                               HOME=$TERRACE_TEST_RABBITMQ_HOME rabbitmqctl -n $TERRACE_TEST_RABBITMQ_NODE
#   TERRACE_TEST_RABBITMQ_START a script that starts the node again (after `rabbitmqctl stop`),
#                               same name, ports and data; it stays in the foreground
# Usage: scripts/with-rabbitmq.sh COMMAND [ARGS...]
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
logs="$repo_root/.cache/emulators"
mkdir -p "$logs"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

rabbit_base=""
stop() {
    if [[ -n "$rabbit_base" ]]; then
        # Stopping the start script does not stop the broker: the node and its epmd are stopped
        # by name.
        rabbitmq_ctl stop >/dev/null 2>&1 || true
        wait "$rabbit_pid" 2>/dev/null || true
        epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 || true
        rm -rf "$rabbit_base"
    fi
}
trap stop EXIT

rabbitmq_ctl() {
    HOME="$rabbit_base" rabbitmqctl -q -n "$TERRACE_TEST_RABBITMQ_NODE" "$@"
}

"$repo_root/scripts/install-rabbitmq.sh" >/dev/null
rabbit_base="$(mktemp -d /tmp/terrace-rabbitmq.XXXXXX)"
chmod 755 "$rabbit_base"
mkdir -p "$rabbit_base/mnesia" "$rabbit_base/log"
echo "[]." >"$rabbit_base/enabled_plugins"
# A CA of the run's own and the node's certificate for localhost, signed by it, for the TLS
# listener.
tls="$rabbit_base/tls"
mkdir -p "$tls"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=terrace test CA" \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
    -keyout "$tls/server.key" -out "$tls/server.csr" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$tls/ext"
openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 2 -extfile "$tls/ext" -out "$tls/server.pem" 2>/dev/null
rm -f "$tls/ca.key" "$tls/server.csr"
chmod 644 "$tls/ca.pem"
amqps_port="$(free_port)"
cat >"$rabbit_base/rabbitmq.conf" <<CONF
listeners.ssl.1 = 127.0.0.1:$amqps_port
ssl_options.cacertfile = $tls/ca.pem
ssl_options.certfile = $tls/server.pem
ssl_options.keyfile = $tls/server.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
CONF
rabbit_user=()
if [[ "$(id -u)" == 0 ]]; then
    # As root, rabbitmq-server switches to the rabbitmq user: its folders must be that user's.
    chown -R rabbitmq:rabbitmq "$rabbit_base"
elif [[ "$(id -un)" != rabbitmq ]]; then
    rabbit_user=(sudo -u rabbitmq)
    sudo chown -R rabbitmq:rabbitmq "$rabbit_base"
fi
amqp_port="$(free_port)"
export ERL_EPMD_PORT="$(free_port)"
export TERRACE_TEST_RABBITMQ_NODE="terrace-$$@localhost"
export TERRACE_TEST_RABBITMQ_HOME="$rabbit_base"
# The node's start, kept as a script so that a test can start it again after stopping it.
start_node="$rabbit_base/start-node"
node_env=(RABBITMQ_NODENAME="$TERRACE_TEST_RABBITMQ_NODE"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$amqp_port"
    RABBITMQ_DIST_PORT="$(free_port)" ERL_EPMD_PORT="$ERL_EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1
    RABBITMQ_MNESIA_BASE="$rabbit_base/mnesia"
    RABBITMQ_FEATURE_FLAGS_FILE="$rabbit_base/mnesia/feature_flags"
    RABBITMQ_LOG_BASE="$rabbit_base/log" RABBITMQ_ENABLED_PLUGINS_FILE="$rabbit_base/enabled_plugins"
    RABBITMQ_CONFIG_FILE="$rabbit_base/rabbitmq.conf"
    HOME="$rabbit_base")
{
    echo '#!/usr/bin/env bash'
    printf 'exec'
    printf ' %q' "${rabbit_user[@]}" env "${node_env[@]}" rabbitmq-server
    printf ' >>%q 2>&1\n' "$logs/rabbitmq-$amqp_port.log"
} >"$start_node"
chmod 755 "$start_node"
export TERRACE_TEST_RABBITMQ_START="$start_node"
: >"$logs/rabbitmq-$amqp_port.log"
"$start_node" &
rabbit_pid="$!"

# Ready when it answers the AMQP 0-9-1 header with Connection.Start (a method frame).
python3 - "$amqp_port" "$rabbit_pid" <<'PY'
import os, socket, sys, time
port, pid = int(sys.argv[1]), int(sys.argv[2])
deadline = time.time() + 90
while time.time() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("rabbitmq-server exited during start-up; see its log in .cache/emulators/")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"AMQP\x00\x00\x09\x01")
            if s.recv(1) == b"\x01":
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.3)
sys.exit(f"rabbitmq-server did not answer AMQP on port {port} within 90 s")
PY
export TERRACE_TEST_AMQP="amqp://127.0.0.1:$amqp_port"
export TERRACE_TEST_AMQPS="amqps://localhost:$amqps_port"
export TERRACE_TEST_AMQP_CA="$tls/ca.pem"
export TERRACE_TEST_AMQP_USER="terrace"
TERRACE_TEST_AMQP_PASSWORD="$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
export TERRACE_TEST_AMQP_PASSWORD
rabbitmq_ctl add_user "$TERRACE_TEST_AMQP_USER" "$TERRACE_TEST_AMQP_PASSWORD" >/dev/null
rabbitmq_ctl set_permissions "$TERRACE_TEST_AMQP_USER" '.*' '.*' '.*' >/dev/null
rabbitmq_ctl delete_user guest >/dev/null

echo "RabbitMQ on $TERRACE_TEST_AMQP and $TERRACE_TEST_AMQPS" >&2

"$@"
