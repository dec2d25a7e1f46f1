# shellcheck shell=bash
# nats-cluster: three nats-server nodes (n1, n2, n3) with JetStream in one cluster, routes
# on loopback, a store folder each under the state dir: enough for R3 key-value buckets
# that outlive one node (DEDUP_NATS_CLUSTER_URLS, comma-separated). The server is nats.sh's
# pinned 2.15.1. Uses nats.sh.
#
# DEDUP_NATS_CLUSTER_NETNS=1 (as root, for the partition tests, with a state dir of their
# own) puts n3 on a host of its own: a network namespace joined by a veth pair (lib.sh's
# netns_add). Then n1 and n2 listen on every address, n3 at the namespace's end, and `env`
# also prints DEDUP_NATS_CLUSTER_CUT_LINK, the host end's link: `ip link set LINK down`
# cuts n3 off, `up` heals it. `stop` removes the namespace.

nats_cluster_packages() { nats_packages; }

# The namespace and links of this state dir (one cluster per state dir).
nats_cluster_netns() { echo "dedup-nats-$(short_hash "$STATE_DIR")"; }

# nats_node_healthy HOST PORT: whether the node's monitoring port says JetStream is current.
nats_node_healthy() {
    local reply
    reply=$(exec 2>/dev/null 3<>"/dev/tcp/$1/$2" && printf 'GET /healthz HTTP/1.0\r\n\r\n' >&3 && cat <&3) 2>/dev/null ||
        return 1
    [[ $reply == *'"status":"ok"'* ]]
}

nats_cluster_alive() {
    local dir=$STATE_DIR/nats-cluster node any=0
    for node in "$dir"/node-*; do
        [[ -f $node/monitor ]] || return 1
        any=1
        # shellcheck disable=SC2046 # "host port" on one line
        nats_node_healthy $(<"$node/monitor") || return 1
    done
    ((any))
}

nats_cluster_start() {
    local dir=$STATE_DIR/nats-cluster bin ports=() cports=() mports=() i
    local addr=() listen=() advertise=() urls=() netns= host_if host_addr ns_addr
    bin=$(ensure_nats)
    mapfile -t ports < <(free_ports 9)
    ((${#ports[@]} == 9)) || die "could not find free ports for nats-cluster"
    cports=("${ports[@]:3:3}")
    mports=("${ports[@]:6:3}")
    addr=("$HOST" "$HOST" "$HOST")
    listen=("$HOST" "$HOST" "$HOST")
    if [[ ${DEDUP_NATS_CLUSTER_NETNS:-0} == 1 ]]; then
        netns=$(nats_cluster_netns)
        netns_add "$netns" 1
        read -r host_if _ host_addr ns_addr < <(netns_link "$netns" 0)
        # n1 and n2 are reached on loopback from the host and on the veth from n3.
        addr=("$host_addr" "$host_addr" "$ns_addr")
        listen=(0.0.0.0 0.0.0.0 "$ns_addr")
    fi
    for i in 0 1 2; do
        local node=$dir/node-$((i + 1)) routes=() j run=()
        mkdir -p "$node/jetstream"
        for j in 0 1 2; do
            ((j == i)) || routes+=("nats://${addr[$j]}:${cports[$j]}")
        done
        [[ -n $netns && $i == 2 ]] && run=(ip netns exec "$netns")
        advertise=()
        [[ -n $netns ]] && advertise=(--cluster_advertise "${addr[$i]}:${cports[$i]}")
        local IFS=,
        spawn "$node/nats.log" "${run[@]}" "$bin" -js -n "n$((i + 1))" -a "${listen[$i]}" -p "${ports[$i]}" \
            -m "${mports[$i]}" -sd "$node/jetstream" -P "$node/nats.pid" --no_advertise \
            --cluster_name dedup --cluster "nats://${listen[$i]}:${cports[$i]}" "${advertise[@]}" \
            --routes "${routes[*]}"
        unset IFS
        local reach=$HOST
        [[ -n $netns && $i == 2 ]] && reach=$ns_addr
        echo "$reach ${mports[$i]}" >"$node/monitor"
        urls+=("nats://$reach:${ports[$i]}")
    done
    [[ -n $netns ]] && echo "$netns" >"$dir/netns"
    # A JetStream cluster answers once its nodes elected a meta leader and caught up.
    retry $((WAIT_SECONDS * 10)) 0.1 nats_cluster_alive ||
        { for i in 1 2 3; do show_log "$dir/node-$i/nats.log"; done; die "nats-cluster did not become healthy"; }
    local IFS=,
    write_url nats-cluster DEDUP_NATS_CLUSTER_URLS "${urls[*]}"
    if [[ -n $netns ]]; then
        printf "export DEDUP_NATS_CLUSTER_CUT_LINK='%s'\n" "$host_if" >>"$dir/url.env"
    fi
}

nats_cluster_stop() {
    local dir=$STATE_DIR/nats-cluster i
    for i in 1 2 3; do kill_pidfile "$dir/node-$i/nats.pid"; done
    if [[ -f $dir/netns ]]; then netns_del "$(<"$dir/netns")" 1; fi
}
