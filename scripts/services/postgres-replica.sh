# shellcheck shell=bash
# postgres-replica (opt-in: a bare `start` skips it): a PostgreSQL primary and a streaming
# standby of it (pg_basebackup -R), for the failover runs (DEDUP_POSTGRES_PRIMARY_URL,
# DEDUP_POSTGRES_STANDBY_URL). Replication is asynchronous as started;
# `ALTER SYSTEM SET synchronous_standby_names = 'standby1'` (and
# `synchronous_commit = on | remote_apply`) on the primary makes it synchronous.
# `promote postgres-replica` SIGKILLs every process of the primary and promotes the standby.
# Uses postgres.sh.

postgres_replica_packages() { postgres_packages; }
postgres_replica_user() { echo postgres; }

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

postgres_replica_start() {
    local dir=$STATE_DIR/postgres-replica bin primary_port port
    bin=$(pg_bin)
    # Later lines win over start_postgres_in's speed settings: a failover run measures what
    # a commit acknowledged by the primary promises, so the primary flushes its WAL.
    start_postgres_in "$dir/primary" "wal_level = replica" "max_wal_senders = 10" \
        "wal_keep_size = 256MB" "hot_standby = on" "synchronous_commit = on"
    primary_port=$(<"$dir/primary/port")
    start_standby "$dir/standby" "$bin" "$primary_port"
    port=$(<"$dir/standby/port")
    retry $((WAIT_SECONDS * 5)) 0.2 standby_streams "$bin" "$primary_port" ||
        { show_log "$dir/standby/data/server.log"; die "the standby does not stream from the primary"; }
    {
        printf "export DEDUP_POSTGRES_PRIMARY_URL='postgres://postgres@%s:%s/dedup'\n" "$HOST" "$primary_port"
        printf "export DEDUP_POSTGRES_STANDBY_URL='postgres://postgres@%s:%s/dedup'\n" "$HOST" "$port"
    } >"$dir/url.env"
}

# start_standby DIR BIN PRIMARY_PORT: a base backup of the primary in DIR, started as its
# standby on a free port (left in DIR/port).
start_standby() {
    local dir=$1 bin=$2 primary_port=$3 port
    mkdir -p "$dir/run"
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    give_to postgres "$dir"
    as_user postgres "$bin/pg_basebackup" -h "$HOST" -p "$primary_port" -U postgres \
        -D "$dir/data" -R -X stream -c fast --no-sync >"$dir/basebackup.log" 2>&1 ||
        { show_log "$dir/basebackup.log"; die "pg_basebackup of the primary failed"; }
    # The copied postgresql.conf names the primary's port and socket folder; these lines
    # come after them. postgresql.auto.conf (written by -R) names the standby to the primary.
    cat >>"$dir/data/postgresql.conf" <<CONF
# --- dedup scripts/services.sh: the standby ---
port = $port
unix_socket_directories = '$dir/run'
CONF
    echo "primary_conninfo = 'host=$HOST port=$primary_port user=postgres application_name=standby1'" \
        >>"$dir/data/postgresql.auto.conf"
    give_to postgres "$dir"
    run_postgres_in "$dir" "$bin" ||
        { show_log "$dir/data/server.log"; die "the standby did not become ready on port $port"; }
}

# standby_streams BIN PRIMARY_PORT: whether the primary sees standby1 streaming.
standby_streams() {
    [[ $("$1/psql" -h "$HOST" -p "$2" -U postgres -Atqc \
        "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'standby1' AND state = 'streaming'" \
        2>/dev/null || true) == 1 ]]
}

postgres_replica_stop() {
    local dir=$STATE_DIR/postgres-replica
    stop_postgres_in "$dir/standby"
    stop_postgres_in "$dir/primary"
}

# SIGKILL every process of the primary (no shutdown, no last WAL sent), then promote the
# standby and wait until it takes writes.
postgres_replica_promote() {
    local dir=$STATE_DIR/postgres-replica bin pid
    [[ -f $dir/standby/port ]] || die "postgres-replica is not running in $STATE_DIR"
    bin=$(pg_bindir) || die "PostgreSQL binaries not found"
    if [[ ! -f $dir/promoted ]]; then
        pid=$(pid_in "$dir/primary/data/postmaster.pid")
        for pid in $(process_tree "$pid"); do kill -KILL "$pid" 2>/dev/null || true; done
        touch "$dir/promoted"
    fi
    as_user postgres "$bin/pg_ctl" -D "$dir/standby/data" -W promote >/dev/null 2>&1 || true
    if retry $((WAIT_SECONDS * 10)) 0.1 writable "$bin" "$(<"$dir/standby/port")"; then
        log "standby promoted"
        return 0
    fi
    show_log "$dir/standby/data/server.log"
    die "the standby did not leave recovery"
}

# writable BIN PORT: whether the server on PORT has left recovery.
writable() {
    [[ $("$1/psql" -h "$HOST" -p "$2" -U postgres -Atqc "SELECT pg_is_in_recovery()" 2>/dev/null || true) == f ]]
}
