#!/usr/bin/env bash
# A single-node Ceph cluster on 127.0.0.1 for tests: one mon, one bluestore OSD on a sparse file,
# radosgw (S3) and optionally an MDS + ceph-fuse mount (CephFS, the network-filesystem tier).
#
#   tests/servers/ceph.sh start DIR [--cephfs MOUNTPOINT]   # prints KEY=VALUE lines (source-able)
#   tests/servers/ceph.sh stop DIR
#
# Needs Debian's radosgw ceph-mon ceph-osd ceph-common (+ ceph-mds ceph-fuse for CephFS), root.
# Facts behind the settings: docs/TEST-SERVERS.md. Ports: CEPH_MON_PORT (3300),
# CEPH_RGW_PORT (7480). Address: CEPH_BIND_ADDR (127.0.0.1; another one, e.g. inside a network namespace:
# tests/servers/netns.sh). Everything lives under DIR; stop kills the daemons by their pid files.
set -euo pipefail

cmd=${1:-}; dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 start|stop DIR [--cephfs MOUNTPOINT]" >&2; exit 2; }
mon_port=${CEPH_MON_PORT:-3300}
rgw_port=${CEPH_RGW_PORT:-7480}
bind=${CEPH_BIND_ADDR:-127.0.0.1}
if [[ $bind == 127.* ]]; then public_net=127.0.0.0/8; else public_net=$bind/32; fi
access_key=${CEPH_ACCESS_KEY:-ckptbenchaccess}
secret_key=${CEPH_SECRET_KEY:-ckptbenchsecret0123456789}
export CEPH_CONF="$dir/ceph.conf"

log() { echo "ceph.sh: $*" >&2; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then log "timed out waiting for $what"; return 1; fi
    sleep 0.5
  done
}

stop() {
  local mnt
  if [[ -f "$dir/cephfs.mount" ]]; then
    mnt=$(cat "$dir/cephfs.mount")
    fusermount -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    rm -f "$dir/cephfs.mount"
  fi
  # Signal every daemon at once, then wait for all (one by one took ~12 s), SIGKILL stragglers.
  local pids=() name pidfile
  for name in fuse rgw mds osd mon; do
    pidfile="$dir/run/$name.pid"
    [[ -f "$pidfile" ]] || continue
    pids+=("$(cat "$pidfile")")
    rm -f "$pidfile"
  done
  ((${#pids[@]})) || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "${pids[@]}" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

start() {
  local cephfs_mount=${1:-}
  # A fresh cluster every start: remove only what this script creates under DIR.
  rm -rf "$dir"/{run,log,mon,osd,mds,rgw} "$dir"/monmap "$dir"/keyring "$dir"/ceph.conf "$dir"/osd-block-*
  mkdir -p "$dir"/{run,log,mon,osd,mds,rgw}
  local fsid; fsid=$(cat /proc/sys/kernel/random/uuid)
  cat > "$CEPH_CONF" <<CONF
[global]
fsid = $fsid
mon host = v2:$bind:$mon_port
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
ms bind ipv6 = false
ms bind msgr1 = false
public network = $public_net
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon data avail warn = 2
mon data avail crit = 1
run dir = $dir/run
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
keyring = $dir/keyring
[mon]
mon data = $dir/mon/\$name
pid file = $dir/run/mon.pid
[osd]
osd data = $dir/osd/\$name
osd objectstore = bluestore
bluestore block path = $dir/osd-block-\$id
bluestore block size = 21474836480
bluestore block create = true
osd memory target = 1073741824
pid file = $dir/run/osd.pid
[mds]
mds data = $dir/mds/\$name
pid file = $dir/run/mds.pid
[client.rgw.a]
rgw frontends = beast endpoint=$bind:$rgw_port
rgw data = $dir/rgw
ms mon client mode = crc secure
pid file = $dir/run/rgw.pid
# A deleted (or overwritten) object's data is reclaimed by RGW's garbage collector, by default no sooner
# than 2 h later (rgw gc obj min wait 7200 s, a pass every hour): long benchmark runs would fill the 20 GiB
# OSD with deleted data, and RGW then hangs on PUTs. Reclaim it within seconds instead.
rgw gc obj min wait = 5
rgw gc processor period = 10
rgw gc processor max time = 10
[client]
pid file = $dir/run/fuse.pid
CONF
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
    --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:$bind:$mon_port]" "$dir/monmap" >/dev/null
  ceph-mon --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/keyring" 2>/dev/null
  ceph-mon -i a 2>>"$dir/log/daemons.err"
  wait_for 30 "the monitor" ceph -s --connect-timeout 3
  local uuid; uuid=$(cat /proc/sys/kernel/random/uuid)
  local id; id=$(ceph osd new "$uuid")
  mkdir -p "$dir/osd/osd.$id"
  ceph-osd -i "$id" --mkfs --osd-uuid "$uuid" 2>/dev/null
  ceph-osd -i "$id" 2>>"$dir/log/daemons.err"
  wait_for 60 "the OSD" bash -c "ceph osd stat 2>/dev/null | grep -q '1 up'"
  radosgw -n client.rgw.a 2>>"$dir/log/daemons.err"
  wait_for 60 "radosgw on $bind:$rgw_port" curl -sf "http://$bind:$rgw_port"
  radosgw-admin user create --uid=ckptbench --display-name=ckptbench \
    --access-key="$access_key" --secret-key="$secret_key" >/dev/null
  echo "CKPTBENCH_TEST_S3_ENDPOINT=http://$bind:$rgw_port"
  echo "AWS_ACCESS_KEY_ID=$access_key"
  echo "AWS_SECRET_ACCESS_KEY=$secret_key"
  if [[ -n "$cephfs_mount" ]]; then
    ceph osd pool create cephfs_data 8 >/dev/null 2>&1
    ceph osd pool create cephfs_metadata 8 >/dev/null 2>&1
    ceph fs new cephfs cephfs_metadata cephfs_data >/dev/null 2>&1
    mkdir -p "$dir/mds/mds.a"
    ceph-mds -i a >>"$dir/log/daemons.err" 2>&1
    wait_for 60 "the MDS" bash -c "ceph mds stat 2>/dev/null | grep -q 'up:active'"
    mkdir -p "$cephfs_mount"
    ceph-fuse "$cephfs_mount" >/dev/null 2>&1
    wait_for 30 "the CephFS mount" bash -c "grep -q ' $cephfs_mount fuse.ceph-fuse ' /proc/mounts"
    echo "$cephfs_mount" > "$dir/cephfs.mount"
    echo "CKPTBENCH_TEST_CEPHFS=$cephfs_mount"
  fi
}

case "$cmd" in
  start)
    shift 2
    mount=""
    if [[ "${1:-}" == "--cephfs" ]]; then mount=${2:?--cephfs needs a mount point}; fi
    stop
    trap 'log "start failed; stopping"; stop' ERR
    start "$mount"
    ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR [--cephfs MOUNTPOINT]" >&2; exit 2 ;;
esac
