# shellcheck shell=bash
# mariadb: its own mariadbd process on a free port, a data dir made by mariadb-install-db
# (never the system unit or /var/lib/mysql), TLS offered on the same port with the test CA's
# server certificate (clients choose; `ssl-mode=VERIFY_IDENTITY&ssl-ca=...` verifies), and a
# database `dedup` with a user `dedup` (password `dedup`) for the tests (DEDUP_MYSQL_URL,
# DEDUP_TLS_CA, DEDUP_TLS_OTHER_CA). Its helpers (start_mariadb_in, ...) also serve
# mariadb-replica.sh. Uses tls.sh.

# MariaDB's InnoDB buffer pool: enough for the tests. The scale bench's tables of millions
# of records need it larger than the table (e.g. DEDUP_MARIADB_BUFFER_POOL=5G for 10 M),
# or every purge batch reads its pages from disk.
readonly MARIADB_BUFFER_POOL=${DEDUP_MARIADB_BUFFER_POOL:-256M}

# The tests' database `dedup` and user `dedup` (password `dedup`).
readonly MARIADB_SETUP_SQL="
CREATE DATABASE dedup CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER 'dedup'@'%' IDENTIFIED BY 'dedup';
-- Every privilege: the tests create databases and kill connections.
GRANT ALL PRIVILEGES ON *.* TO 'dedup'@'%' WITH GRANT OPTION;"

mariadb_server_bin() {
    local bin
    for bin in /usr/sbin/mariadbd /usr/sbin/mysqld; do
        [[ -x $bin ]] && { echo "$bin"; return 0; }
    done
    return 1
}

# The server and client packages (both, when a tool of either is missing).
mariadb_server_packages() {
    { mariadb_server_bin >/dev/null && have mariadb-install-db && have mariadb-admin; } ||
        printf '%s\n' mariadb-server mariadb-client
}

mariadb_packages() {
    mariadb_server_packages
    tls_packages
}
mariadb_user() { echo mysql; }

# mariadb_ping_in DIR: whether the server of DIR answers on its socket.
mariadb_ping_in() {
    [[ -S $1/run/mysqld.sock ]] &&
        mariadb-admin --no-defaults --socket="$1/run/mysqld.sock" -uroot ping >/dev/null 2>&1
}

mariadb_alive() { [[ -f $STATE_DIR/mariadb/port ]] && mariadb_ping_in "$STATE_DIR/mariadb"; }

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
    write_mariadb_cnf "$dir" "$port" "$@"
    give_to mysql "$dir"
    install_mariadb_data_in "$dir" || install_mariadb_data_in "$dir" ||
        die "mariadb-install-db failed twice (its logs are above)"
    run_mariadbd_in "$dir"
}

# write_mariadb_cnf DIR PORT LINE...: DIR/my.cnf. Every tool gets this file alone
# (--defaults-file): the system's /etc/mysql files (socket, data dir) are not ours.
write_mariadb_cnf() {
    local dir=$1 port=$2
    shift 2
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
    local dir=$1 bin user_opt=()
    bin=$(mariadb_server_bin) || die "mariadbd not found"
    if is_root; then user_opt=(--user=mysql); fi
    spawn "$dir/stdout.log" "$bin" --defaults-file="$dir/my.cnf" "${user_opt[@]}"
    retry $((WAIT_SECONDS * 5)) 0.2 mariadb_ping_in "$dir" ||
        { show_log "$dir/error.log"; die "MariaDB did not become ready on port $(<"$dir/port")"; }
}

mariadb_start() {
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
mariadb_crash_restart() {
    local dir=$STATE_DIR/mariadb
    [[ -f $dir/port && -d $dir/data ]] || die "MariaDB is not running in $STATE_DIR"
    kill_mariadbd_in "$dir"
    run_mariadbd_in "$dir"
    log "mariadb crash-restarted"
}

# kill_mariadbd_in DIR: SIGKILL DIR's mariadbd and wait until it is gone.
kill_mariadbd_in() {
    local pid
    pid=$(pid_in "$1/run/mysqld.pid")
    if [[ $pid =~ ^[0-9]+$ ]]; then kill_now "$pid"; fi
}

mariadb_stop() { stop_mariadb_in "$STATE_DIR/mariadb"; }

stop_mariadb_in() {
    local dir=$1
    [[ -d $dir ]] || return 0
    if mariadb_ping_in "$dir"; then
        mariadb-admin --no-defaults --socket="$dir/run/mysqld.sock" -uroot shutdown >/dev/null 2>&1 || true
    fi
    kill_pidfile "$dir/run/mysqld.pid"
}
