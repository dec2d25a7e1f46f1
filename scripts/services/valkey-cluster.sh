# shellcheck shell=bash
# valkey-cluster: Valkey 9 as a 3-node cluster, like redis-cluster's run by valkey-server
# (DEDUP_VALKEY_CLUSTER_URLS). Uses valkey.sh (its binary) and redis-cluster.sh.

valkey_cluster_packages() { valkey_packages; }

valkey_cluster_alive() { cluster_alive valkey-cluster; }

valkey_cluster_start() {
    local REDIS_SERVER
    # shellcheck disable=SC2034 # read by start_redis_node (bash's dynamic scope)
    REDIS_SERVER=$(ensure_valkey)
    start_cluster valkey-cluster DEDUP_VALKEY_CLUSTER_URLS
}

valkey_cluster_stop() { stop_cluster valkey-cluster; }
