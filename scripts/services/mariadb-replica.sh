# shellcheck shell=bash
# mariadb-replica (opt-in: a bare `start` skips it): a MariaDB primary (binary log, GTID) and
# a replica of it, for the failover runs (DEDUP_MYSQL_PRIMARY_URL, DEDUP_MYSQL_REPLICA_URL).
# Both flush their logs at every commit (`innodb_flush_log_at_trx_commit = 1`,
# `sync_binlog = 1`): a failover run measures what an acknowledged commit promises.
# Replication is asynchronous as started; `SET GLOBAL rpl_semi_sync_master_enabled = ON` on
# the primary (the replica has the slave side on) makes it semi-synchronous
# (`rpl_semi_sync_master_wait_point = AFTER_SYNC` is the lossless one).
# `promote mariadb-replica` SIGKILLs the primary, lets the replica apply what it had
# received, and makes it a writable primary. Uses mariadb.sh.

# The settings of both servers.
readonly MARIADB_DURABLE=("innodb_flush_log_at_trx_commit = 1" "sync_binlog = 1"
    "binlog_format = ROW" "gtid_strict_mode = 1")

mariadb_replica_packages() { mariadb_server_packages; }
mariadb_replica_user() { echo mysql; }

mariadb_replica_alive() {
    local dir=$STATE_DIR/mariadb-replica
    [[ -f $dir/replica/port ]] && mariadb_ping_in "$dir/replica" || return 1
    [[ -f $dir/promoted ]] || mariadb_ping_in "$dir/primary"
}

mariadb_replica_start() {
    local dir=$STATE_DIR/mariadb-replica
    start_mariadb_in "$dir/primary" "server_id = 1" "log_bin = $dir/primary/data/binlog" \
        "${MARIADB_DURABLE[@]}"
    # In the binary log, so the replica (which replays it from the start) makes them too.
    mariadb_sql_in "$dir/primary" >"$dir/primary/setup.log" 2>&1 <<SQL ||
CREATE USER 'repl'@'%' IDENTIFIED BY 'repl';
GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%';
$MARIADB_SETUP_SQL
SQL
        { show_log "$dir/primary/setup.log"; die "could not set up the MariaDB primary"; }
    start_mariadb_in "$dir/replica" "server_id = 2" "log_bin = $dir/replica/data/binlog" \
        "${MARIADB_DURABLE[@]}" "rpl_semi_sync_slave_enabled = ON" "read_only = ON"
    follow_primary "$dir/replica" "$(<"$dir/primary/port")"
    {
        printf "export DEDUP_MYSQL_PRIMARY_URL='mysql://dedup:dedup@%s:%s/dedup'\n" "$HOST" "$(<"$dir/primary/port")"
        printf "export DEDUP_MYSQL_REPLICA_URL='mysql://dedup:dedup@%s:%s/dedup'\n" "$HOST" "$(<"$dir/replica/port")"
    } >"$dir/url.env"
}

# follow_primary DIR PRIMARY_PORT: make DIR's server replicate the primary, and wait until
# it has the database `dedup`.
follow_primary() {
    local dir=$1 primary_port=$2
    mariadb_sql_in "$dir" >"$dir/setup.log" 2>&1 <<SQL ||
CHANGE MASTER TO MASTER_HOST = '$HOST', MASTER_PORT = $primary_port, MASTER_USER = 'repl',
    MASTER_PASSWORD = 'repl', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
START SLAVE;
SQL
        { show_log "$dir/setup.log"; die "could not start the MariaDB replica"; }
    retry $((WAIT_SECONDS * 5)) 0.2 has_dedup_schema "$dir" ||
        { show_log "$dir/error.log"; die "the MariaDB replica does not replicate from the primary"; }
}

# has_dedup_schema DIR: whether DIR's server has the database `dedup`.
has_dedup_schema() {
    [[ $(mariadb_sql_in "$1" -Nse \
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'dedup'" \
        2>/dev/null || true) == 1 ]]
}

mariadb_replica_stop() {
    local dir=$STATE_DIR/mariadb-replica
    stop_mariadb_in "$dir/replica"
    stop_mariadb_in "$dir/primary"
}

# SIGKILL the primary (no shutdown), let the replica apply every transaction it had
# received (up to 10 s), then detach it and make it writable, as a failover tool would.
mariadb_replica_promote() {
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
