# Network namespaces with rate-limited links, for bench/wan (sourced by bash).
#
#   wan_check               exit 77 with a message where namespaces, veth, bridges or tbf are not permitted
#   wan_up N                a hub namespace (bridge br0, 10.216.0.1/24) and N node namespaces n0..n(N-1),
#                           each on a veth link to the bridge, address 10.216.0.(10+i); lo up everywhere
#   wan_rate MBIT           tbf on both ends of every link (node egress = upload, hub egress = download);
#                           0 removes the limit
#   wan_tx I                bytes node I has sent on its link (kernel counter of its veth end)
#   wan_ns I, wan_addr I    node I's namespace and address; wan_hub: the hub's namespace
#   wan_mpirun NP ARGS...   mpirun in the hub namespace, rank r in node r (TCP only, ring collectives),
#                           stopped after WAN_TIMEOUT seconds (default 3600)
#   wan_down                kill what runs in the namespaces, delete them (also on EXIT, INT, TERM, HUP)
#
# Names are WAN_BASE (dwan) + the owning shell's pid, so concurrent runs do not
# meet; a set whose owner is gone (a killed run) is removed by wan_up.
WAN_BASE=${WAN_BASE:-dwan}
WAN_SUBNET=10.216.0.0/24
WAN_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WAN_NS=$WAN_BASE$$
WAN_NODES=0
WAN_DIR=

wan_hub() { echo "$WAN_NS-hub"; }
wan_ns() { echo "$WAN_NS-n$1"; }
wan_addr() { echo "10.216.0.$((10 + $1))"; }

wan_skip() {
  echo "SKIP: $* (bench/wan needs root, network namespaces, veth, a bridge and the tbf qdisc)"
  exit 77
}

# Probes everything wan_up needs, in a throwaway namespace.
wan_check() {
  [ "$(id -u)" = 0 ] || wan_skip "not root"
  command -v ip > /dev/null && command -v tc > /dev/null || wan_skip "ip or tc missing (Debian: iproute2)"
  local p=$WAN_NS-probe
  ip netns add "$p" 2> /dev/null || wan_skip "cannot create a network namespace"
  local ok=1 why=""
  ip -n "$p" link add b0 type bridge 2> /dev/null || { ok=0; why="cannot create a bridge"; }
  [ $ok = 0 ] || ip -n "$p" link add v0 type veth peer name v1 2> /dev/null || { ok=0; why="cannot create a veth pair"; }
  [ $ok = 0 ] || ip -n "$p" link set v0 up 2> /dev/null || { ok=0; why="cannot bring a veth up"; }
  [ $ok = 0 ] || tc -n "$p" qdisc add dev v0 root tbf rate 10mbit burst 16kb latency 400ms 2> /dev/null ||
    { ok=0; why="cannot add a tbf qdisc (sch_tbf)"; }
  ip netns del "$p" 2> /dev/null
  [ $ok = 1 ] || wan_skip "$why"
}

# Removes sets whose owning process is gone (a run killed with SIGKILL).
wan_clean_stale() {
  local ns owner
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}'); do
    case $ns in "$WAN_BASE"[0-9]*-*) ;; *) continue ;; esac
    owner=${ns#"$WAN_BASE"}
    owner=${owner%%-*}
    kill -0 "$owner" 2> /dev/null && continue
    echo "wan: removing stale namespace $ns (owner $owner is gone)" >&2
    wan_kill_ns "$ns"
    ip netns del "$ns" 2> /dev/null || true
    rm -rf "${TMPDIR:-/tmp}/$WAN_BASE$owner".??????
  done
}

wan_kill_ns() {
  local p
  for p in $(ip netns pids "$1" 2> /dev/null); do kill -TERM "$p" 2> /dev/null || true; done
  sleep 0.2
  for p in $(ip netns pids "$1" 2> /dev/null); do kill -KILL "$p" 2> /dev/null || true; done
}

wan_down() {
  local ns
  for ns in $(ip netns list 2> /dev/null | awk '{print $1}'); do
    case $ns in "$WAN_NS"-*) wan_kill_ns "$ns"; ip netns del "$ns" 2> /dev/null || true ;; esac
  done
  [ -z "$WAN_DIR" ] || rm -rf "$WAN_DIR"
  WAN_NODES=0
}

wan_trap() {
  trap 'wan_down' EXIT
  trap 'echo "wan: interrupted, cleaning up" >&2; wan_down; trap - EXIT; exit 130' INT
  trap 'wan_down; trap - EXIT; exit 143' TERM
  trap 'wan_down; trap - EXIT; exit 129' HUP
}

wan_up() {
  local n=$1 i hub
  wan_clean_stale
  wan_trap
  hub=$(wan_hub)
  WAN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/$WAN_NS.XXXXXX")
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" addr add 10.216.0.1/24 dev br0
  ip -n "$hub" link set br0 up
  for ((i = 0; i < n; i++)); do
    ip netns add "$(wan_ns $i)"
    ip -n "$hub" link add "h$i" type veth peer name eth0 netns "$(wan_ns $i)"
    # One TCP segment per packet (no GSO/TSO), so the counters and tbf see
    # the frames a real link would carry, at every rate.
    ip -n "$hub" link set "h$i" gso_max_segs 1 master br0 up
    ip -n "$(wan_ns $i)" link set lo up
    ip -n "$(wan_ns $i)" link set eth0 gso_max_segs 1 up
    ip -n "$(wan_ns $i)" addr add "$(wan_addr $i)/24" dev eth0
  done
  WAN_NODES=$n
  # The rsh agent maps an address back to its namespace. Every daemon gets
  # a TMPDIR of its own: they share the hostname, and Open MPI's session
  # directories (and the hwloc topology file in them) are per hostname, so
  # daemons in one /tmp collide ("File exists", or a crash in
  # hwloc_shmem_topology_write).
  cat > "$WAN_DIR/rsh" << EOF2
#!/bin/sh
# mpirun rsh agent: HOST COMMAND... -> COMMAND in HOST's namespace
i=\$(( \${1##*.} - 10 ))
shift
mkdir -p "$WAN_DIR/tmp\$i"
exec ip netns exec $WAN_NS-n\$i env TMPDIR="$WAN_DIR/tmp\$i" /bin/sh -c "\$*"
EOF2
  chmod +x "$WAN_DIR/rsh"
  mkdir -p "$WAN_DIR/tmphub"
  # Wait until every node reaches the hub (addresses settle in well under a second).
  for ((i = 0; i < 50; i++)); do
    ip -n "$hub" -br link show br0 | grep -q UP && break
    sleep 0.1
  done
}

# tbf: burst ~4 ms of the rate (at least 15 kB, 10 MTU frames); a 400 ms queue (at 10 Mbit/s
# a shorter one drops bursts of the all-gather and TCP backs off).
wan_rate() {
  local mbit=$1 i burst dev ns
  burst=$((mbit * 1000000 / 8 / 250))
  [ "$burst" -ge 15000 ] || burst=15000
  for ((i = 0; i < WAN_NODES; i++)); do
    for side in node hub; do
      if [ $side = node ]; then ns=$(wan_ns $i) dev=eth0; else ns=$(wan_hub) dev=h$i; fi
      if [ "$mbit" = 0 ]; then
        tc -n "$ns" qdisc del dev "$dev" root 2> /dev/null || true
      else
        tc -n "$ns" qdisc replace dev "$dev" root tbf rate "${mbit}mbit" burst "$burst" latency 400ms
      fi
    done
  done
}

wan_tx() { ip netns exec "$(wan_ns "$1")" cat /sys/class/net/eth0/statistics/tx_bytes; }
wan_tx_sum() { # nodes FIRST..LAST
  local s=0 i
  for ((i = $1; i <= $2; i++)); do s=$((s + $(wan_tx $i))); done
  echo $s
}

# mpirun inside the hub: Open MPI 4.1's PMIx reaches its daemon over TCP
# loopback, so a rank cannot simply be wrapped in `ip netns exec`; instead
# each node is a "host" whose daemon the rsh agent starts in its namespace.
# TCP only (two links per peer: one halves bidirectional throughput), ring
# all-gathers (the library's all-reduce is an all-to-all plus an all-gather).
# Messages up to 4 MiB go eagerly: with the default 64 kB rendezvous the
# receiver's go-ahead waits behind its own bulk data in the 400 ms queue, so
# a 2-rank all-gather of 1 MB at 10 Mbit/s often ran one direction after the
# other (1.66 s instead of 0.83 s, measured).
# A job that runs past WAN_TIMEOUT seconds (default 3600) is stopped (exit
# 124, or 137 if it ignored SIGTERM for 20 s) and what it left in the nodes
# is killed.
wan_mpirun() {
  local np=$1 i rc=0
  shift
  : > "$WAN_DIR/hosts"
  for ((i = 0; i < np; i++)); do echo "$(wan_addr $i) slots=1" >> "$WAN_DIR/hosts"; done
  PMIX_MCA_gds=hash TMPDIR="$WAN_DIR/tmphub" timeout --foreground -k 20 "${WAN_TIMEOUT:-3600}" \
    ip netns exec "$(wan_hub)" mpirun --allow-run-as-root \
    -np "$np" --hostfile "$WAN_DIR/hosts" --mca plm_rsh_agent "$WAN_DIR/rsh" --bind-to none \
    --mca oob_tcp_if_include $WAN_SUBNET --mca btl tcp,self --mca btl_tcp_if_include $WAN_SUBNET \
    --mca btl_tcp_links 2 --mca btl_tcp_eager_limit 4194304 --mca btl_tcp_rndv_eager_limit 4194304 \
    --mca btl_tcp_max_send_size 4194304 --mca mpi_yield_when_idle 1 \
    --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allgather_algorithm 4 \
    --mca coll_tuned_allgatherv_algorithm 3 --mca coll_tuned_alltoallv_algorithm 2 \
    --mca coll_tuned_allreduce_algorithm 4 "$@" || rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    echo "wan: mpirun stopped after ${WAN_TIMEOUT:-3600} s (WAN_TIMEOUT)" >&2
    for ((i = 0; i < WAN_NODES; i++)); do wan_kill_ns "$(wan_ns $i)"; done
  fi
  return $rc
}

# Installs BUILD into BUILD/prefix and builds the exchange probe against it
# (pkg-config, as an outside program would): sets WAN_PROBE.
wan_build_probe() {
  local build=$1 libdir
  command -v mpicc > /dev/null || { echo "wan: mpicc missing (Debian: libopenmpi-dev)" >&2; return 1; }
  cmake --install "$build" --prefix "$build/prefix" > "$build/prefix-install.log" 2>&1 ||
    { cat "$build/prefix-install.log" >&2; return 1; }
  libdir=$(dirname "$(find "$build/prefix" -name distro.pc -print -quit)")
  libdir=$(dirname "$libdir")
  mkdir -p "$build/bench-wan"
  WAN_PROBE=$build/bench-wan/wan_exchange
  # shellcheck disable=SC2046
  mpicc -std=c11 -O2 -Wall -Wextra -Werror -o "$WAN_PROBE" "$WAN_HERE/wan_exchange.c" \
    $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs distro) -Wl,-rpath,"$libdir"
}
