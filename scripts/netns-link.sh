#!/usr/bin/env bash
# A second "host" on this machine, for the cross-host benchmark rows: a network
# namespace joined to this one by a veth pair. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN),
# `unshare` (util-linux) and `ip` (iproute2; $ZCS_IP names another binary).
#
#   eval "$(scripts/netns-link.sh up)"   # sets NETNS=/proc/<pid>/ns/net LINK_IP=10.77.0.1
#   …                                    # processes that setns(2) into $NETNS reach $LINK_IP
#   scripts/netns-link.sh down "$NETNS"  # the namespace and both ends of the pair go away
#
# The namespace is held by a sleeping process (no /run/netns mount needed); `down` ends
# it, and the kernel removes the namespace and the veth pair with it. The link keeps the
# kernel's defaults (MTU 1500, offloads on): what two hosts on one Ethernet segment see,
# without the wire's bandwidth limit.
set -euo pipefail
IP=${ZCS_IP:-ip}
A=10.77.0.1 B=10.77.0.2 DEV=zcs-veth0 PEER=zcs-veth1

case "${1:-}" in
  up)
    # A process alone in a new network namespace; its pid names the namespace.
    setsid unshare --net sleep infinity </dev/null >/dev/null 2>&1 &
    holder=$!
    for _ in $(seq 100); do
      [ "$(readlink "/proc/$holder/ns/net" 2>/dev/null)" != "$(readlink /proc/self/ns/net)" ] && break
      sleep 0.05
    done
    [ "$(readlink "/proc/$holder/ns/net")" != "$(readlink /proc/self/ns/net)" ] \
      || { echo "netns-link: unshare --net did not give a new namespace" >&2; kill "$holder"; exit 1; }
    in_ns() { nsenter --net="/proc/$holder/ns/net" "$@"; }
    "$IP" link add "$DEV" type veth peer name "$PEER" netns "$holder"
    "$IP" addr add "$A/24" dev "$DEV"
    "$IP" link set "$DEV" up
    in_ns "$IP" addr add "$B/24" dev "$PEER"
    in_ns "$IP" link set "$PEER" up
    in_ns "$IP" link set lo up
    echo "NETNS=/proc/$holder/ns/net LINK_IP=$A"
    ;;
  down)
    ns=${2:?usage: netns-link.sh down /proc/<pid>/ns/net}
    pid=${ns#/proc/}; pid=${pid%%/*}
    kill "$pid" 2>/dev/null || true
    # The root end goes with the namespace; remove it if the kernel has not yet.
    "$IP" link del "$DEV" 2>/dev/null || true
    ;;
  *)
    echo "usage: $0 up | down /proc/<pid>/ns/net" >&2
    exit 2
    ;;
esac
