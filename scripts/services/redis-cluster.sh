# shellcheck shell=bash
# redis-cluster: three redis-server nodes in cluster mode, masters only: enough for keys to
# spread over slots and nodes (MOVED, cross-slot errors), cheap to start
# (DEDUP_REDIS_CLUSTER_URLS, comma-separated). Its cluster helpers also serve
# valkey-cluster.sh. Uses redis.sh.

redis_cluster_packages() { redis_packages; }

# cluster_nodes SERVICE: the node folders of a cluster service.
cluster_nodes() {
    shopt -s nullglob
    local d=("$STATE_DIR/$1"/node-*)
    shopt -u nullglob
    ((${#d[@]})) && printf '%s\n' "${d[@]}"
    return 0
}

cluster_ok() { redis-cli -h "$HOST" -p "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }

# cluster_alive SERVICE: whether every node answers and sees a healthy cluster.
cluster_alive() {
    local node any=0
    while read -r node; do
        any=1
        redis_node_alive "$node" && cluster_ok "$(<"$node/port")" || return 1
    done < <(cluster_nodes "$1")
    ((any))
}

# start_cluster SERVICE URL_VARIABLE: the three nodes, run by $REDIS_SERVER, joined into
# one cluster.
start_cluster() {
    local svc=$1 var=$2 dir=$STATE_DIR/$1 ports=() i addrs=() urls=()
    mapfile -t ports < <(free_ports 3 10000)
    ((${#ports[@]} == 3)) || die "could not find free ports for $svc"
    for i in 0 1 2; do
        start_redis_node "$dir/node-$((i + 1))" "${ports[$i]}" \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
        addrs+=("$HOST:${ports[$i]}")
        urls+=("redis://$HOST:${ports[$i]}/")
    done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 ||
        { show_log "$dir/create.log"; die "redis-cli --cluster create failed"; }
    # Slots are assigned at once, but every node must agree before clients see a healthy
    # cluster.
    retry $((WAIT_SECONDS * 10)) 0.1 cluster_alive "$svc" ||
        { show_log "$dir/create.log"; die "$svc did not reach cluster_state:ok"; }
    local IFS=,
    write_url "$svc" "$var" "${urls[*]}"
}

stop_cluster() {
    local node
    while read -r node; do stop_redis_node "$node"; done < <(cluster_nodes "$1")
}

redis_cluster_alive() { cluster_alive redis-cluster; }
redis_cluster_start() { start_cluster redis-cluster DEDUP_REDIS_CLUSTER_URLS; }
redis_cluster_stop() { stop_cluster redis-cluster; }
