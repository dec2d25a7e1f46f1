# shellcheck shell=bash
# redis-tls: Redis on a TLS port only (`--port 0`), with the test CA's server certificate
# (DEDUP_REDIS_TLS_URL, DEDUP_TLS_CA, DEDUP_TLS_OTHER_CA). A client certificate is optional,
# but one that is sent must come from the CA (`client.crt` beside `ca.crt` is;
# `other-client.crt` is not). Uses redis.sh and tls.sh.

redis_tls_packages() {
    redis_packages
    tls_packages
}

# redis-cli's TLS arguments, in the caller's `local REDIS_CLI`.
redis_tls_cli() { REDIS_CLI=(--tls --cacert "$STATE_DIR/tls/ca.crt"); }

redis_tls_alive() {
    local REDIS_CLI
    redis_tls_cli
    redis_node_alive "$STATE_DIR/redis-tls"
}

redis_tls_start() {
    local port REDIS_CLI tls=$STATE_DIR/tls
    ensure_certs
    redis_tls_cli
    port=$(free_ports 1)
    start_redis_node "$STATE_DIR/redis-tls" "$port" --port 0 --tls-port "$port" \
        --tls-cert-file "$tls/server.crt" --tls-key-file "$tls/server.key" \
        --tls-ca-cert-file "$tls/ca.crt" --tls-auth-clients optional
    write_url redis-tls DEDUP_REDIS_TLS_URL "rediss://$HOST:$port/"
    write_tls_env redis-tls
}

redis_tls_stop() {
    # shellcheck disable=SC2034 # read by stop_redis_node (bash's dynamic scope)
    local REDIS_CLI
    redis_tls_cli
    stop_redis_node "$STATE_DIR/redis-tls"
}
