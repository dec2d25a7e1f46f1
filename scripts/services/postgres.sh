# shellcheck shell=bash
# postgres: PostgreSQL from Debian's package, a fresh cluster on a free port with a database
# `dedup` (DEDUP_POSTGRES_URL). Its helpers (start_postgres_in, stop_postgres_in, ...) also
# serve postgres-tls.sh and postgres-replica.sh.

pg_bindir() {
    local dirs=()
    shopt -s nullglob
    dirs=(/usr/lib/postgresql/*/bin)
    shopt -u nullglob
    ((${#dirs[@]})) || return 1
    # Newest major version wins when several are installed.
    printf '%s\n' "${dirs[@]}" | sort -V | tail -n 1
}

# Print the PostgreSQL bin dir, or die.
pg_bin() { pg_bindir || die "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin"; }

postgres_packages() { pg_bindir >/dev/null || echo postgresql; }
postgres_user() { echo postgres; }

# Wait (bounded by WAIT_SECONDS) until PostgreSQL answers on $2; $1 is its bin dir.
wait_postgres() { retry $((WAIT_SECONDS * 5)) 0.2 "$1/pg_isready" -q -h "$HOST" -p "$2"; }

postgres_alive() {
    local dir=$STATE_DIR/postgres bin
    [[ -f $dir/port ]] && bin=$(pg_bindir) || return 1
    "$bin/pg_isready" -q -h "$HOST" -p "$(<"$dir/port")"
}

# start_postgres_in DIR [postgresql.conf lines...]: a fresh cluster in DIR, on a free port
# (left in DIR/port), with a database `dedup`.
start_postgres_in() {
    local dir=$1 bin port
    shift
    bin=$(pg_bin)
    mkdir -p "$dir/run"
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    # The data dir must belong to the user the server runs as.
    give_to postgres "$dir"
    # Trust auth is fine: the server only listens on loopback and a socket in our state dir.
    as_user postgres "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=trust \
        --encoding=UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1 ||
        { show_log "$dir/initdb.log"; die "initdb failed"; }
    write_postgres_conf "$dir" "$port" "$@"
    run_postgres_in "$dir" "$bin" ||
        { show_log "$dir/data/server.log"; die "PostgreSQL did not become ready on port $port"; }
    # Through the socket: the TLS-only server refuses plain TCP.
    "$bin/createdb" -h "$dir/run" -p "$port" -U postgres dedup
}

# write_postgres_conf DIR PORT [LINE...]: our settings at the end of DIR's postgresql.conf,
# then the LINEs (later lines win).
write_postgres_conf() {
    local dir=$1 port=$2
    shift 2
    {
        cat <<EOF

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
        if (($#)); then printf '%s\n' "$@"; fi
    } >>"$dir/data/postgresql.conf"
}

# run_postgres_in DIR BIN: start DIR's server and wait until it answers on DIR/port.
run_postgres_in() {
    local dir=$1 bin=$2
    # setsid: a Ctrl-C in the calling terminal must not kill the server before `stop` runs.
    as_user postgres setsid "$bin/pg_ctl" -D "$dir/data" -l "$dir/data/server.log" -W start >/dev/null
    wait_postgres "$bin" "$(<"$dir/port")"
}

postgres_start() {
    local dir=$STATE_DIR/postgres
    start_postgres_in "$dir"
    write_url postgres DEDUP_POSTGRES_URL "postgres://postgres@$HOST:$(<"$dir/port")/dedup"
}

postgres_stop() { stop_postgres_in "$STATE_DIR/postgres"; }

stop_postgres_in() {
    local dir=$1 bin
    [[ -d $dir/data ]] || return 0
    if [[ -f $dir/data/postmaster.pid ]] && bin=$(pg_bindir); then
        as_user postgres "$bin/pg_ctl" -D "$dir/data" -m fast -t 30 stop >/dev/null 2>&1 || true
    fi
    kill_pidfile "$dir/data/postmaster.pid"
}

# postgres_crash_restart [DOWN]: stop in immediate mode (no shutdown checkpoint; WAL replay
# on start), stay down DOWN seconds (default 0), start again on the same port and data.
postgres_crash_restart() {
    local down=${1:-0} dir=$STATE_DIR/postgres bin
    [[ -f $dir/port && -d $dir/data ]] || die "PostgreSQL is not running in $STATE_DIR"
    bin=$(pg_bindir) || die "PostgreSQL binaries not found"
    [[ $down =~ ^[0-9]+$ ]] || die "crash-restart: DOWN must be whole seconds, got '$down'"
    as_user postgres "$bin/pg_ctl" -D "$dir/data" -m immediate -t 30 stop >/dev/null 2>&1 || true
    sleep "$down"
    run_postgres_in "$dir" "$bin" ||
        { show_log "$dir/data/server.log"; die "PostgreSQL did not come back on port $(<"$dir/port")"; }
    log "postgres crash-restarted"
}
