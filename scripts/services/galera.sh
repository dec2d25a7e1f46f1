# shellcheck shell=bash
# galera: a 3-node MariaDB Galera cluster (multi-primary, synchronous certification), each
# node a mariadbd of its own in galera/node-N with four free ports (SQL, group
# communication, IST, SST). Node 1 bootstraps the cluster (--wsrep-new-cluster); nodes 2
# and 3 join it by state transfer (rsync, so the nodes run as the `mysql` user: as root the
# transfer fails on permissions). The database `dedup` and user `dedup` are made on node 1
# and replicate (DEDUP_GALERA_URLS: the three nodes' URLs, comma-separated;
# DEDUP_GALERA_URL: node 1's; DEDUP_GALERA_DIR: the cluster's folder, for the node-loss
# tests). Failure detection is tightened to seconds (evs suspect and inactive timeouts) so
# a test that kills or cuts off a node sees the cluster move on quickly. The membership
# round that follows keeps Galera's install timeout (7.5 s, 3 tries): a round that runs out
# of tries is a fatal error of the node's group communication, and 4 s can be too short on
# a busy 2-core machine. Reads, updates and deletes wait for the cluster
# (`wsrep_sync_wait = 3`), as dedup-mysql requires. The Debian package galera-4 holds the
# provider. Uses mariadb.sh.
#
# As root, node 3 runs on a host of its own (DEDUP_GALERA_NETNS: 1 by default as root where
# namespaces can be made, 0 otherwise): a network namespace (lib.sh's netns_add) joined to
# this host by two veth pairs. Pair 0 carries the cluster's traffic (group communication,
# IST, SST): nodes 1 and 2 listen for it at its host end, node 3 at its namespace end.
# Pair 1 carries node 3's SQL clients only. `env` also prints DEDUP_GALERA_CUT_LINK, pair
# 0's host end: `ip link set LINK down` cuts node 3 off from the other two while its
# clients still reach it, as clients beside it would in a real partition (they get error
# 1047 once it leaves the primary component); `up` heals it and it catches up by IST.
# Nodes 1 and 2 take SQL on loopback as before.
#
# The default cluster is the partitionable one, rather than a private cluster started by
# the partition test: a private one costs a bootstrap and two state transfers (17 s here)
# in every run, while node 3 behind a veth costs no measurable time. The node-loss tests
# take turns on this cluster, and each leaves it synced. Without root (or with
# DEDUP_GALERA_NETNS=0) all three nodes run on loopback and the partition test skips (or
# fails under DEDUP_TEST_STRICT=1).

# The wsrep provider galera-4 installs.
readonly GALERA_PROVIDER=/usr/lib/galera/libgalera_smm.so

galera_packages() {
    mariadb_server_packages
    [[ -f $GALERA_PROVIDER ]] || echo galera-4
    have rsync || echo rsync
    if is_root && [[ ${DEDUP_GALERA_NETNS:-1} != 0 ]]; then have ip || echo iproute2; fi
}
galera_user() { echo mysql; }

# Whether node 3 goes on a host of its own: DEDUP_GALERA_NETNS=1 or 0 says; unset, as root
# where a namespace can be made (a container may forbid it: then a line says so).
galera_netns_wanted() {
    case ${DEDUP_GALERA_NETNS:-} in
        1) return 0 ;;
        0) return 1 ;;
    esac
    is_root && have ip || return 1
    local probe=dedup-probe-$$
    if ! ip netns add "$probe" 2>/dev/null; then
        log "galera: no network namespace can be made here; node 3 runs on loopback"
        return 1
    fi
    ip netns del "$probe"
}

# The namespace of this state dir's node 3.
galera_netns() { echo "dedup-galera-$(short_hash "$STATE_DIR")"; }

# galera_nodes: the node folders, in order.
galera_nodes() {
    local i
    for i in 1 2 3; do echo "$STATE_DIR/galera/node-$i"; done
}

# galera_synced DIR: whether DIR's node answers and is a synced member of a primary cluster.
galera_synced() {
    mariadb_ping_in "$1" || return 1
    [[ $(mariadb_sql_in "$1" -Nse "SELECT variable_value FROM information_schema.global_status \
        WHERE variable_name = 'wsrep_local_state_comment'" 2>/dev/null || true) == Synced ]]
}

galera_alive() {
    local node
    [[ -f $STATE_DIR/galera/url.env ]] || return 1
    while read -r node; do galera_synced "$node" || return 1; done < <(galera_nodes)
}

# galera_cnf DIR NODE SQL_HOST "GROUP_HOSTS" PORTS...: node NODE's my.cnf in DIR. SQL_HOST
# is the address its SQL port listens on; GROUP_HOSTS the three nodes' addresses for the
# cluster's traffic, in node order; PORTS the 12 ports (four a node: SQL, group
# communication, IST, SST).
galera_cnf() {
    local dir=$1 node=$2 sql_host=$3 group_hosts
    read -ra group_hosts <<<"$4"
    shift 4
    local ports=("$@") peers=() i base=$(((node - 1) * 4)) me
    for i in 0 1 2; do peers+=("${group_hosts[$i]}:${ports[$((i * 4 + 1))]}"); done
    me=${group_hosts[$((node - 1))]}
    local IFS=,
    write_mariadb_cnf "$dir" "${ports[$base]}" \
        "bind-address = $sql_host" \
        "binlog_format = ROW" "innodb_autoinc_lock_mode = 2" "innodb_log_file_size = 32M" \
        "wsrep_on = ON" "wsrep_provider = $GALERA_PROVIDER" \
        "wsrep_cluster_name = dedup-$(short_hash "$STATE_DIR")" \
        "wsrep_cluster_address = gcomm://${peers[*]}" \
        "wsrep_node_name = node-$node" \
        "wsrep_node_address = ${peers[$((node - 1))]}" \
        "wsrep_node_incoming_address = $sql_host:${ports[$base]}" \
        "wsrep_provider_options = \"gmcast.listen_addr=tcp://${peers[$((node - 1))]};ist.recv_addr=$me:${ports[$((base + 2))]};gcache.size=32M;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT4S;evs.keepalive_period=PT0.5S;evs.inactive_check_period=PT0.5S\"" \
        "wsrep_sst_method = rsync" \
        "wsrep_sst_receive_address = $me:${ports[$((base + 3))]}" \
        "wsrep_slave_threads = 2" \
        "# Reads, updates and deletes wait until the node applied what the cluster" \
        "# committed before them: dedup-mysql refuses a Galera node without it." \
        "wsrep_sync_wait = 3"
}

# run_galera_node DIR [ARGS...]: start DIR's mariadbd as the mysql user (in the namespace
# DIR/netns names, if any) and wait until it is a synced member. A joiner (no ARGS) that is
# not synced within WAIT_SECONDS is killed and started again, twice at most: on a busy
# machine its first membership round can end in a view of its own ("no install message
# received", non-primary) that it does not leave. A second start joins as a fresh process.
readonly GALERA_JOIN_TRIES=3
run_galera_node() {
    local dir=$1 bin run=() try tries=$GALERA_JOIN_TRIES
    shift
    (($# == 0)) || tries=1
    bin=$(mariadb_server_bin) || die "mariadbd not found"
    if [[ -f $dir/netns ]]; then run=(ip netns exec "$(<"$dir/netns")"); fi
    if is_root; then run+=(runuser -u mysql --); fi
    for ((try = 1; try <= tries; try++)); do
        spawn "$dir/stdout.log" "${run[@]}" "$bin" --defaults-file="$dir/my.cnf" "$@"
        disown 2>/dev/null || true # a restart kills it: no "Killed" line from this shell
        retry $((WAIT_SECONDS * 5)) 0.2 galera_synced "$dir" && return 0
        show_log "$dir/error.log"
        ((try < tries)) || break
        log "galera: $dir not synced after ${WAIT_SECONDS}s (start $try of $tries); killing it and starting it again"
        kill_galera_node "$dir"
    done
    die "Galera node $dir did not become synced (started $tries times)"
}

# kill_galera_node DIR: SIGKILL DIR's mariadbd and what its state transfer started (the
# rsync script and daemon name files in DIR), and wait until they are gone.
kill_galera_node() {
    local f cmd pids=()
    for f in /proc/[0-9]*/cmdline; do
        cmd=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
        if [[ $cmd == *"$1/"* ]]; then
            f=${f#/proc/}
            pids+=("${f%/cmdline}")
        fi
    done
    ((${#pids[@]} == 0)) || kill_now "${pids[@]}"
}

galera_start() {
    local dir=$STATE_DIR/galera ports=() node i urls=() netns= cut_if= group_host group_ns client_ns
    local sql_hosts=("$HOST" "$HOST" "$HOST") group_hosts=("$HOST" "$HOST" "$HOST")
    mariadb_server_bin >/dev/null || die "mariadbd not found (install mariadb-server)"
    mapfile -t ports < <(free_ports 12)
    ((${#ports[@]} == 12)) || die "could not find free ports for galera"
    if galera_netns_wanted; then
        netns=$(galera_netns)
        echo "$netns" >"$dir/netns"
        netns_add "$netns" 2
        read -r cut_if _ group_host group_ns < <(netns_link "$netns" 0)
        read -r _ _ _ client_ns < <(netns_link "$netns" 1)
        group_hosts=("$group_host" "$group_host" "$group_ns")
        sql_hosts[2]=$client_ns
    fi
    for i in 1 2 3; do
        node=$dir/node-$i
        mkdir -p "$node/run"
        echo "${ports[$(((i - 1) * 4))]}" >"$node/port"
        galera_cnf "$node" "$i" "${sql_hosts[$((i - 1))]}" "${group_hosts[*]}" "${ports[@]}"
        urls+=("mysql://dedup:dedup@${sql_hosts[$((i - 1))]}:${ports[$(((i - 1) * 4))]}/dedup")
    done
    if [[ -n $netns ]]; then echo "$netns" >"$dir/node-3/netns"; fi
    give_to mysql "$dir"
    # Node 1's system tables; the joiners receive them by state transfer.
    install_mariadb_data_in "$dir/node-1" || install_mariadb_data_in "$dir/node-1" ||
        die "mariadb-install-db failed twice (its logs are above)"
    run_galera_node "$dir/node-1" --wsrep-new-cluster
    mariadb_sql_in "$dir/node-1" >"$dir/setup.log" 2>&1 <<<"$MARIADB_SETUP_SQL" ||
        { show_log "$dir/setup.log"; die "could not create the dedup database and user"; }
    for i in 2 3; do
        mkdir -p "$dir/node-$i/data"
        give_to mysql "$dir/node-$i"
        run_galera_node "$dir/node-$i"
    done
    {
        local IFS=,
        printf "export DEDUP_GALERA_URLS='%s'\n" "${urls[*]}"
        printf "export DEDUP_GALERA_URL='%s'\n" "${urls[0]}"
        printf "export DEDUP_GALERA_DIR='%s'\n" "$dir"
        if [[ -n $cut_if ]]; then printf "export DEDUP_GALERA_CUT_LINK='%s'\n" "$cut_if"; fi
    } >"$dir/url.env"
}

galera_stop() {
    local node
    while read -r node; do stop_mariadb_in "$node"; done < <(galera_nodes | tac)
    if [[ -f $STATE_DIR/galera/netns ]]; then netns_del "$(<"$STATE_DIR/galera/netns")" 2; fi
}

# galera_crash_restart [NODE] [DOWN]: SIGKILL node NODE (default 3: no shutdown, as a crash
# would), keep it down DOWN seconds (default 0), start it again on its data (node 3 in its
# namespace, if it has one): it recovers its position from InnoDB and rejoins by
# incremental state transfer (or a full one).
galera_crash_restart() {
    local node=${1:-3} down=${2:-0} dir
    [[ $node =~ ^[1-3]$ ]] || die "crash-restart galera: NODE is 1, 2 or 3, got '$node'"
    [[ $down =~ ^[0-9]+$ ]] || die "crash-restart galera: DOWN must be whole seconds, got '$down'"
    dir=$STATE_DIR/galera/node-$node
    [[ -f $dir/port && -d $dir/data ]] || die "Galera is not running in $STATE_DIR"
    kill_mariadbd_in "$dir"
    sleep "$down"
    run_galera_node "$dir"
    log "galera node $node crash-restarted"
}
