# shellcheck shell=bash
# postgres-tls: PostgreSQL that takes TCP connections over TLS only, with the test CA's server
# certificate (DEDUP_POSTGRES_TLS_URL, DEDUP_TLS_CA, DEDUP_TLS_OTHER_CA). Its pg_hba.conf has
# hostssl lines and no host lines (the socket stays open for createdb). Uses postgres.sh and
# tls.sh.

postgres_tls_packages() {
    postgres_packages
    tls_packages
}
postgres_tls_user() { echo postgres; }

postgres_tls_alive() {
    local dir=$STATE_DIR/postgres-tls bin
    [[ -f $dir/port ]] && bin=$(pg_bindir) || return 1
    "$bin/pg_isready" -q -h "$dir/run" -p "$(<"$dir/port")"
}

postgres_tls_start() {
    local dir=$STATE_DIR/postgres-tls
    ensure_certs
    mkdir -p "$dir/certs"
    cp "$STATE_DIR/tls/server.crt" "$STATE_DIR/tls/server.key" "$dir/certs/"
    printf '%s\n' "local all all trust" "hostssl all all $HOST/32 trust" >"$dir/pg_hba.conf"
    start_postgres_in "$dir" "ssl = on" "ssl_cert_file = '$dir/certs/server.crt'" \
        "ssl_key_file = '$dir/certs/server.key'" "hba_file = '$dir/pg_hba.conf'"
    write_url postgres-tls DEDUP_POSTGRES_TLS_URL "postgres://postgres@$HOST:$(<"$dir/port")/dedup"
    write_tls_env postgres-tls
}

postgres_tls_stop() { stop_postgres_in "$STATE_DIR/postgres-tls"; }
