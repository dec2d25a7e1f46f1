# shellcheck shell=bash
# redis: redis-server from Debian's package on a free port, no persistence (DEDUP_REDIS_URL).
# Its node helpers (start_redis_node, stop_redis_node, redis_ping) also serve redis-tls.sh,
# redis-cluster.sh, valkey.sh and valkey-cluster.sh.

# Extra redis-cli arguments (the TLS service sets its own, with `local`).
REDIS_CLI=()
# The server binary start_redis_node runs (Valkey's takes the same flags; set with `local`).
REDIS_SERVER=redis-server

redis_packages() { { have redis-server && have redis-cli; } || echo redis-server; }

redis_ping() { [[ $(redis-cli "${REDIS_CLI[@]}" -h "$HOST" -p "$1" ping 2>/dev/null) == PONG ]]; }

# start_redis_node DIR PORT [extra redis-server options...]
start_redis_node() {
    local dir=$1 port=$2
    shift 2
    mkdir -p "$dir"
    echo "$port" >"$dir/port"
    # daemonize: redis-server forks into its own session and writes its pidfile.
    "$REDIS_SERVER" --port "$port" --bind "$HOST" --protected-mode no --daemonize yes \
        --dir "$dir" --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
        --save '' --appendonly no "$@" ||
        { show_log "$dir/redis.log"; die "$REDIS_SERVER failed to start on port $port"; }
    retry $((WAIT_SECONDS * 10)) 0.1 redis_ping "$port" && return 0
    show_log "$dir/redis.log"
    die "Redis did not answer PING on port $port"
}

stop_redis_node() {
    local dir=$1
    [[ -f $dir/port ]] || return 0
    redis-cli "${REDIS_CLI[@]}" -h "$HOST" -p "$(<"$dir/port")" shutdown nosave >/dev/null 2>&1 || true
    kill_pidfile "$dir/redis.pid"
}

# redis_node_alive DIR: whether DIR's node answers PING.
redis_node_alive() { [[ -f $1/port ]] && redis_ping "$(<"$1/port")"; }

redis_alive() { redis_node_alive "$STATE_DIR/redis"; }

redis_start() {
    local port
    port=$(free_ports 1)
    start_redis_node "$STATE_DIR/redis" "$port"
    write_url redis DEDUP_REDIS_URL "redis://$HOST:$port/"
}

redis_stop() { stop_redis_node "$STATE_DIR/redis"; }
