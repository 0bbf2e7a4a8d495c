#!/usr/bin/env bash
# S3 write throughput behind an emulated link, per link rate: for each RATE, a client and a server
# network namespace joined by a veth pair shaped to RATE (tests/servers/netns.sh), a fresh Ceph
# cluster inside the server namespace (tests/servers/ceph.sh), tests/perf/s3_link.py run in the client
# namespace (ckptbench.save vs plain boto3), then Ceph stopped and the namespaces removed (also on
# failure or Ctrl-C). Needs root and Ceph's binaries.
#
#   tests/perf/s3_link.sh [RATE...]        # default: 1gbit; e.g. 1gbit 10gbit none
#
# At 1gbit the ckptbench median must come out below the link (125 MB/s) and above EXPECT_FRACTION
# of it (0.72, i.e. 90 MB/s); other rates are reported only. Environment: NAME (namespaces
# NAME-cli/NAME-srv; default ckb-s3link), DIR (Ceph's data; default /var/tmp/ckptbench-s3link-ceph,
# what ceph.sh put there is removed at the end), OUT (s3_link.py --save DIR), SIZE (512MiB), ROUNDS (3), DELAY_MS (0: none;
# else each direction held that long by netns.sh's proxy), PY (python3).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
netns="$here/tests/servers/netns.sh"
ceph="$here/tests/servers/ceph.sh"
name=${NAME:-ckb-s3link}
dir=${DIR:-/var/tmp/ckptbench-s3link-ceph}
py=${PY:-python3}
delay_ms=${DELAY_MS:-0}
rgw_port=${CEPH_RGW_PORT:-7480}
(($#)) || set -- 1gbit

log() { echo "s3_link.sh: $*" >&2; }

cleanup() {
  [[ -f "$dir/ceph.conf" ]] && bash "$ceph" stop "$dir" >/dev/null 2>&1 || true
  bash "$netns" down "$name" || true
}
finish() {
  local rc=$?
  trap - EXIT INT TERM
  cleanup
  # What ceph.sh made under DIR (the OSD's sparse block file included), then DIR if empty.
  rm -rf "$dir"/{run,log,mon,osd,mds,rgw} "$dir"/monmap "$dir"/keyring "$dir"/ceph.conf "$dir"/osd-block-*
  rmdir "$dir" 2>/dev/null || true
  exit "$rc"
}
trap finish EXIT
# The benchmark runs in the background so that a signal reaches this trap at once (bash runs traps
# only between foreground commands); the trap stops it, then the EXIT trap cleans up.
child=""
trap 'log interrupted; [[ -z "$child" ]] || kill "$child" 2>/dev/null; exit 130' INT TERM

status=0
for rate in "$@"; do
  log "link $rate: namespaces $name-cli/$name-srv, Ceph under $dir"
  delay_args=()
  [[ "$delay_ms" == 0 ]] || delay_args=(--delay-ms "$delay_ms" --delay-port "$rgw_port")
  eval "$(bash "$netns" up "$name" --rate "$rate" "${delay_args[@]}")"
  mkdir -p "$dir"
  started=$(SECONDS=0; ip netns exec "$NETNS_SERVER" env CEPH_BIND_ADDR="$NETNS_SERVER_ADDR" \
    CEPH_RGW_PORT="$rgw_port" bash "$ceph" start "$dir" && echo "CEPH_START_S=$SECONDS")
  eval "$started"
  endpoint=$CKPTBENCH_TEST_S3_ENDPOINT
  [[ -z "${NETNS_DELAY_ADDR:-}" ]] || endpoint="http://$NETNS_DELAY_ADDR"
  log "Ceph up in $CEPH_START_S s at $CKPTBENCH_TEST_S3_ENDPOINT (server namespace); client uses $endpoint"
  expect=()
  [[ "$rate" != 1gbit ]] || expect=(--expect-near-link "${EXPECT_FRACTION:-0.72}")
  ip netns exec "$NETNS_CLIENT" "$py" "$here/tests/perf/s3_link.py" --endpoint-url "$endpoint" \
    --key "$AWS_ACCESS_KEY_ID" --secret "$AWS_SECRET_ACCESS_KEY" --link-rate "$rate" \
    --iface "$NETNS_CLIENT_IFACE" --size "${SIZE:-512MiB}" --rounds "${ROUNDS:-3}" \
    ${OUT:+--save "$OUT"} "${expect[@]}" &
  child=$!
  wait "$child" || status=1
  child=""
  cleanup
  unset NETNS_DELAY_ADDR
done
exit "$status"
