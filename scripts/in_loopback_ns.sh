#!/usr/bin/env bash
# Run CMD inside a network namespace that has only loopback, so that nothing (DDS discovery
# multicast included) can leave the machine:   scripts/in_loopback_ns.sh CMD [ARGS...]
# Root: `unshare -n`; other users: `unshare -rn` (user namespace). Where neither is allowed,
# warns on stderr and runs CMD directly with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST.
# Install first (bootstrap needs the registries), then enter the namespace. The environment
# (e.g. from `. scripts/env.sh`) passes through unchanged.
set -u
if [ $# -eq 0 ]; then
  echo "usage: $0 CMD [ARGS...]" >&2
  exit 2
fi
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
if [ "${SEQAI_IN_LOOPBACK_NS:-}" = 1 ]; then
  exec "$@"   # already inside one
fi

IP=$(command -v ip 2>/dev/null || true)
for c in /usr/sbin/ip /sbin/ip /usr/bin/ip; do
  if [ -z "$IP" ] && [ -x "$c" ]; then IP=$c; fi
done
if [ "$(id -u)" = 0 ]; then UNSHARE=(unshare -n); else UNSHARE=(unshare -rn); fi

why=""
if [ -z "$IP" ]; then
  why="'ip' (iproute2) not found; scripts/bootstrap.sh installs it"
elif ! command -v unshare >/dev/null 2>&1; then
  why="'unshare' (util-linux) not found"
elif ! "${UNSHARE[@]}" "$IP" link set lo up >/dev/null 2>&1; then
  why="'${UNSHARE[*]}' is not permitted here"
fi
if [ -n "$why" ]; then
  echo "in_loopback_ns: $why; running CMD without a network namespace (discovery range LOCALHOST only)" >&2
  exec "$@"
fi

export SEQAI_IN_LOOPBACK_NS=1
exec "${UNSHARE[@]}" sh -c '"$0" link set lo up || exit 125; shift; exec "$@"' "$IP" -- "$@"
