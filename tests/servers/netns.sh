#!/usr/bin/env bash
# An emulated network link for tests: two network namespaces, NAME-cli (the client) and NAME-srv
# (the server), joined by one veth pair with private addresses, shaped by tbf on both ends.
#
#   tests/servers/netns.sh up NAME [--rate 1gbit|none] [--delay-ms N --delay-port PORT]
#   tests/servers/netns.sh down NAME          # removes all that up made; idempotent
#
# `up` prints KEY=VALUE lines (source-able): NETNS_CLIENT, NETNS_SERVER (the namespaces),
# NETNS_CLIENT_ADDR, NETNS_SERVER_ADDR, NETNS_CLIENT_IFACE, NETNS_RATE, NETNS_DELAY_MS and, with a
# delay, NETNS_DELAY_ADDR. Run the server with `ip netns exec NAME-srv ...` bound to NETNS_SERVER_ADDR,
# the client with `ip netns exec NAME-cli ...`. Nothing touches the root namespace: the veth pair is
# created inside the client namespace and its peer moved straight into the server namespace.
#
# Rate: tc units (500mbit, 1gbit, 10gbit); "none" leaves the link unshaped. tbf on both veth ends,
# burst max(512 KiB, 4 ms at the rate), latency 20 ms (docs/TEST-SERVERS.md).
# Delay: this kernel has no netem, so a userspace TCP proxy in the client namespace listens on
# NETNS_CLIENT_ADDR:PORT and forwards to NETNS_SERVER_ADDR:PORT, holding every chunk N ms in each
# direction (a request/response round trip gains 2N ms). It delays data, not packets: the TCP
# connections on either side of it see no added RTT, so window/congestion effects of a long link
# are not emulated. Addresses: NETNS_SUBNET (default 10.213.0, giving .1/30 client and .2/30 server).
set -euo pipefail

cmd=${1:-}; name=${2:-}
usage="usage: $0 up NAME [--rate RATE|none] [--delay-ms N --delay-port PORT] | down NAME"
[[ -n "$cmd" && -n "$name" ]] || { echo "$usage" >&2; exit 2; }
[[ "$name" =~ ^[a-zA-Z0-9_-]{1,24}$ ]] || { echo "netns.sh: NAME must be 1-24 of [a-zA-Z0-9_-]" >&2; exit 2; }
cli="$name-cli"; srv="$name-srv"
cli_if=veth-cli; srv_if=veth-srv
subnet=${NETNS_SUBNET:-10.213.0}
cli_addr="$subnet.1"; srv_addr="$subnet.2"
state="/run/ckptbench-netns/$name"

log() { echo "netns.sh: $*" >&2; }

ns_exists() { ip netns list | awk '{print $1}' | grep -qx "$1"; }

rate_bits() {  # "1gbit" -> 1000000000 (tc's units are decimal)
  local r=${1,,} n unit
  [[ "$r" =~ ^([0-9]+([.][0-9]+)?)([kmgt]?)bit$ ]] || { log "rate $1: use e.g. 500mbit, 1gbit, 10gbit or none"; return 2; }
  n=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
  python3 -c "print(int($n * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9, 't': 1e12}['$unit']))"
}

# The delay proxy: LISTEN_ADDR PORT TARGET_ADDR PORT DELAY_MS. Two threads per direction: one reads
# and stamps chunks, one sends each chunk DELAY_MS after it arrived. A bounded queue keeps TCP's
# back-pressure. EOF is forwarded (shutdown) after the data before it.
read -r -d '' PROXY <<'PY' || true
import os, queue, socket, sys, threading, time
listen_addr, listen_port, target_addr, target_port, delay_ms = sys.argv[1:6]
delay = float(delay_ms) / 1000.0
CHUNK = 256 * 1024

def pump(src, dst):
    q = queue.Queue(maxsize=256)
    def reader():
        try:
            while True:
                data = src.recv(CHUNK)
                q.put((time.monotonic() + delay, data))
                if not data:
                    return
        except OSError:
            q.put((0.0, b""))
    def writer():
        try:
            while True:
                due, data = q.get()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
        except OSError:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
    threading.Thread(target=reader, daemon=True).start()
    threading.Thread(target=writer, daemon=True).start()

server = socket.create_server((listen_addr, int(listen_port)), backlog=256, reuse_port=False)
print(f"pid={os.getpid()} ckptbench-netns delay proxy {listen_addr}:{listen_port} -> {target_addr}:{target_port}, {delay_ms} ms each way", flush=True)
while True:
    client, _ = server.accept()
    try:
        upstream = socket.create_connection((target_addr, int(target_port)), timeout=10)
        upstream.settimeout(None)
    except OSError:
        client.close()
        continue
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pump(client, upstream)
    pump(upstream, client)
PY

down() {
  local pid
  if [[ -f "$state/proxy.pid" ]]; then
    pid=$(cat "$state/proxy.pid")
    # Only the process we started: check its command line (the proxy's source) before killing it.
    if grep -qa "ckptbench-netns delay proxy" "/proc/$pid/cmdline" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
    fi
    rm -f "$state/proxy.pid"
  fi
  for ns in "$srv" "$cli"; do
    ns_exists "$ns" || continue
    local pids; pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [[ -z "${pids// }" ]] || log "warning: processes still in $ns ($pids); the namespace lives on until they exit"
    ip netns del "$ns"  # takes its end of the veth pair (and so the pair) and the qdiscs with it
  done
  rm -rf "$state"
}

shape() {  # shape NS IFACE
  [[ "$rate" == none ]] && return 0
  tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst "$burst" latency 20ms
}

up() {
  if ns_exists "$cli" || ns_exists "$srv"; then log "$cli or $srv exists already: run '$0 down $name' first"; exit 1; fi
  local burst=""
  if [[ "$rate" != none ]]; then
    local bits; bits=$(rate_bits "$rate")
    burst=$(( bits / 8 / 250 > 524288 ? bits / 8 / 250 : 524288 ))  # 4 ms at the rate, >= 512 KiB
  fi
  mkdir -p "$state"
  ok=0
  trap '[[ $ok == 1 ]] || { log "up failed; removing what it made"; down; }' EXIT
  ip netns add "$cli"
  ip netns add "$srv"
  ip -n "$cli" link set lo up
  ip -n "$srv" link set lo up
  ip -n "$cli" link add "$cli_if" type veth peer name "$srv_if" netns "$srv"
  ip -n "$cli" addr add "$cli_addr/30" dev "$cli_if"
  ip -n "$srv" addr add "$srv_addr/30" dev "$srv_if"
  ip -n "$cli" link set "$cli_if" up
  ip -n "$srv" link set "$srv_if" up
  shape "$cli" "$cli_if"
  shape "$srv" "$srv_if"
  # Reachability (no ping here): a TCP connect to a closed port must be refused, not time out.
  ip netns exec "$cli" python3 -c "import socket, sys
try: socket.create_connection((sys.argv[1], 9), timeout=3)
except ConnectionRefusedError: pass" "$srv_addr"
  echo "NETNS_CLIENT=$cli"
  echo "NETNS_SERVER=$srv"
  echo "NETNS_CLIENT_ADDR=$cli_addr"
  echo "NETNS_SERVER_ADDR=$srv_addr"
  echo "NETNS_CLIENT_IFACE=$cli_if"
  echo "NETNS_RATE=$rate"
  echo "NETNS_DELAY_MS=$delay_ms"
  if [[ "$delay_ms" != 0 ]]; then
    ip netns exec "$cli" setsid python3 -c "$PROXY" "$cli_addr" "$delay_port" "$srv_addr" "$delay_port" "$delay_ms" \
      </dev/null >"$state/proxy.log" 2>&1 &
    echo $! > "$state/proxy.pid"
    local deadline=$((SECONDS + 10))
    until grep -q "delay proxy" "$state/proxy.log" 2>/dev/null; do
      kill -0 "$(cat "$state/proxy.pid")" 2>/dev/null || { log "the delay proxy exited: $(cat "$state/proxy.log")"; exit 1; }
      ((SECONDS < deadline)) || { log "the delay proxy did not start"; exit 1; }
      sleep 0.1
    done
    sed -n 's/^pid=\([0-9]*\) .*/\1/p' "$state/proxy.log" | head -1 > "$state/proxy.pid"  # its own pid
    echo "NETNS_DELAY_ADDR=$cli_addr:$delay_port"
  fi
  ok=1
}

case "$cmd" in
  up)
    shift 2
    rate=1gbit; delay_ms=0; delay_port=""
    while (($#)); do
      case "$1" in
        --rate) rate=${2:?--rate needs a value}; shift 2 ;;
        --delay-ms) delay_ms=${2:?--delay-ms needs a value}; shift 2 ;;
        --delay-port) delay_port=${2:?--delay-port needs a value}; shift 2 ;;
        *) echo "$usage" >&2; exit 2 ;;
      esac
    done
    [[ "$delay_ms" =~ ^[0-9]+([.][0-9]+)?$ ]] || { log "--delay-ms must be a number"; exit 2; }
    if [[ "$delay_ms" != 0 && -z "$delay_port" ]]; then log "--delay-ms needs --delay-port (the server's TCP port)"; exit 2; fi
    [[ "$rate" == none ]] || rate_bits "$rate" >/dev/null
    up
    ;;
  down) down ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
