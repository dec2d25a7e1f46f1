# shellcheck shell=bash
# rabbitmq: RabbitMQ from Debian's package, a node of its own on free ports, no plugins
# (DEDUP_AMQP_URL).
#
# The Debian wrappers (/usr/sbin/rabbitmq-server, /usr/sbin/rabbitmqctl) switch to the
# `rabbitmq` user with `su` when run as root; su keeps our RABBITMQ_* variables. The server
# and rabbitmqctl then both run as `rabbitmq` with HOME=/var/lib/rabbitmq, so they read the
# same Erlang cookie (/var/lib/rabbitmq/.erlang.cookie, made by the package) and the CLI
# may talk to the node. As a normal user we call the real scripts under
# /usr/lib/rabbitmq/bin directly with HOME inside the state dir, where Erlang creates a
# cookie that server and CLI again share.
#
# Every state dir gets its own epmd (Erlang's node name server) on its own port
# (ERL_EPMD_PORT), started by us, so `stop` can end it without disturbing other Erlang
# nodes, and its own range of CLI distribution ports.

# Seconds to wait for RabbitMQ (its VM boots slower than the other servers).
readonly RABBITMQ_WAIT=${DEDUP_RABBITMQ_WAIT:-120}

rabbitmq_installed() { [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]]; }
rabbitmq_packages() { rabbitmq_installed || echo rabbitmq-server; }
rabbitmq_user() { echo rabbitmq; }

rabbitmq_bin() {
    if is_root; then echo "/usr/sbin/$1"; else echo "/usr/lib/rabbitmq/bin/$1"; fi
}

# Run a command with this state dir's RabbitMQ environment.
with_rabbitmq_env() {
    (
        set -a
        # shellcheck source=/dev/null
        . "$STATE_DIR/rabbitmq/rabbitmq.env"
        set +a
        "$@"
    )
}

# rabbitmqctl_ SECONDS ARGS...: rabbitmqctl against our node, killed after SECONDS.
rabbitmqctl_() {
    local limit=$1 node
    shift
    node=$(<"$STATE_DIR/rabbitmq/node")
    with_rabbitmq_env timeout "$limit" "$(rabbitmq_bin rabbitmqctl)" -n "$node" "$@"
}

rabbitmq_alive() {
    [[ -f $STATE_DIR/rabbitmq/node ]] && rabbitmqctl_ 30 -q ping >/dev/null 2>&1
}

# `rabbitmqctl ARGS...` of the driver: it needs this state dir's epmd port and node name; a
# bare `rabbitmqctl` would look for a node on the default epmd (and start one there).
rabbitmq_ctl() {
    [[ -f $STATE_DIR/rabbitmq/node ]] || die "RabbitMQ is not running in $STATE_DIR"
    rabbitmqctl_ 120 "$@"
}

write_rabbitmq_env() {
    local dir=$1 node=$2 amqp=$3 dist=$4 epmd=$5
    # Erlang distribution (server and CLI) listens on all interfaces unless told otherwise.
    local loopback_only="-kernel inet_dist_use_interface {${HOST//./,}}"
    {
        printf '%s=%q\n' \
            RABBITMQ_NODENAME "$node" \
            RABBITMQ_NODE_IP_ADDRESS "$HOST" \
            RABBITMQ_NODE_PORT "$amqp" \
            RABBITMQ_DIST_PORT "$dist" \
            RABBITMQ_CTL_DIST_PORT_MIN $((dist + 10000)) \
            RABBITMQ_CTL_DIST_PORT_MAX $((dist + 10010)) \
            RABBITMQ_MNESIA_BASE "$dir/mnesia" \
            RABBITMQ_LOG_BASE "$dir/log" \
            RABBITMQ_PID_FILE "$dir/rabbitmq.pid" \
            RABBITMQ_ENABLED_PLUGINS_FILE "$dir/enabled_plugins" \
            RABBITMQ_CONFIG_FILE "$dir/rabbitmq.conf" \
            RABBITMQ_ADVANCED_CONFIG_FILE "$dir/advanced.config" \
            RABBITMQ_CONF_ENV_FILE "$dir/rabbitmq-env.conf" \
            ERL_EPMD_PORT "$epmd" \
            ERL_EPMD_ADDRESS "$HOST" \
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS "$loopback_only" \
            RABBITMQ_CTL_ERL_ARGS "$loopback_only"
        if ! is_root; then printf 'HOME=%q\n' "$dir/home"; fi
    } >"$dir/rabbitmq.env"
}

# write_rabbitmq_config DIR: no plugins (no management UI): plain AMQP 0-9-1 is all the
# tests need, and the node boots faster. The config files exist so no system-wide
# /etc/rabbitmq file applies.
write_rabbitmq_config() {
    local dir=$1
    echo '[].' >"$dir/enabled_plugins"
    echo '[].' >"$dir/advanced.config"
    : >"$dir/rabbitmq-env.conf"
    printf '# guest/guest may only log in from loopback, which is where the tests connect from.\nloopback_users.guest = true\n' >"$dir/rabbitmq.conf"
}

rabbitmq_start() {
    local dir=$STATE_DIR/rabbitmq node ports=()
    rabbitmq_installed || die "RabbitMQ is not installed"
    node=dedup-$(short_hash "$STATE_DIR")@localhost
    mkdir -p "$dir/mnesia" "$dir/log"
    if ! is_root; then mkdir -p "$dir/home"; fi
    echo "$node" >"$dir/node"
    write_rabbitmq_config "$dir"
    mapfile -t ports < <(free_ports 3)
    ((${#ports[@]} == 3)) || die "could not find free ports for RabbitMQ"
    # AMQP, Erlang distribution, epmd.
    write_rabbitmq_env "$dir" "$node" "${ports[@]}"
    echo "${ports[0]}" >"$dir/port"
    # The server runs as `rabbitmq` (see above) and writes into these folders.
    give_to rabbitmq "$dir"
    start_epmd "$dir" "${ports[2]}"
    launch_rabbitmq "$dir"
    write_url rabbitmq DEDUP_AMQP_URL "amqp://guest:guest@$HOST:${ports[0]}/%2f"
}

# start_epmd DIR PORT: our own epmd, started before the node so the node registers with it
# instead of spawning a daemon we could not track.
start_epmd() {
    local dir=$1 port=$2
    spawn "$dir/log/epmd.out" epmd -port "$port" -address "$HOST"
    echo $! >"$dir/epmd.pid"
    retry $((WAIT_SECONDS * 10)) 0.1 epmd -port "$port" -names >/dev/null 2>&1 || true
}

# Start the node of $1 (its env file, ports and node name written by rabbitmq_start) and
# wait until it serves AMQP.
launch_rabbitmq() {
    local dir=$1
    # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
    spawn "$dir/log/server.out" bash -c 'set -a; . "$1"; set +a; exec "$2"' \
        _ "$dir/rabbitmq.env" "$(rabbitmq_bin rabbitmq-server)"
    echo $! >"$dir/server.pid"
    wait_amqp "$dir"
    rabbitmqctl_ "$RABBITMQ_WAIT" -q await_startup >/dev/null ||
        { show_log "$dir/log/server.out"; die "RabbitMQ did not finish booting"; }
}

# `await_startup` fails at once while the node is not registered yet, and every rabbitmqctl
# call boots an Erlang VM (~1 s). So first poll cheaply until the AMQP port accepts
# connections (the listener opens at the end of the boot), then let `await_startup` confirm
# that the rabbit application finished booting.
wait_amqp() {
    local dir=$1 amqp server_pid deadline=$((SECONDS + RABBITMQ_WAIT))
    amqp=$(<"$dir/port")
    server_pid=$(<"$dir/server.pid")
    until port_in_use "$amqp"; do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            show_log "$dir/log/server.out"
            die "rabbitmq-server exited during startup"
        fi
        if ((SECONDS >= deadline)); then
            show_log "$dir/log/server.out"
            die "RabbitMQ did not listen on $HOST:$amqp within ${RABBITMQ_WAIT}s"
        fi
        sleep 0.2
    done
}

# Kill the node (SIGKILL to its whole process tree: no shutdown; durable queues and
# persistent, confirmed messages are recovered from disk on start) and start it again on
# the same ports and data.
rabbitmq_crash_restart() {
    local dir=$STATE_DIR/rabbitmq
    [[ -f $dir/port && -f $dir/server.pid ]] || die "RabbitMQ is not running in $STATE_DIR"
    # shellcheck disable=SC2046 # one pid per word
    kill_now $(process_tree "$(<"$dir/server.pid")")
    launch_rabbitmq "$dir"
    log "rabbitmq crash-restarted"
}

rabbitmq_stop() {
    local dir=$STATE_DIR/rabbitmq pid
    [[ -d $dir ]] || return 0
    if [[ -f $dir/node && -f $dir/rabbitmq.env ]]; then
        rabbitmqctl_ 60 -q stop >/dev/null 2>&1 || true
    fi
    # Whatever is left, e.g. after a start that failed before RabbitMQ wrote its pid file:
    # the wrapper we started and everything below it. su puts its child in a new session,
    # so a process group kill would miss the Erlang VM; walk the process tree instead.
    if [[ -f $dir/server.pid ]]; then
        for pid in $(process_tree "$(<"$dir/server.pid")"); do kill_pid "$pid"; done
    fi
    kill_pidfile "$dir/rabbitmq.pid"
    kill_pidfile "$dir/epmd.pid"
}
