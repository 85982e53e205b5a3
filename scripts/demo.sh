#!/usr/bin/env bash
# The main job: install what the demo uses (bootstrap's demo profile: the server, the sim, the ROS 2
# wheels and tools and the interface builds -- no test tools, torch or ray; about 3 minutes on a new
# machine, ~1 s once done), start the local server, deploy the demo policy, and drive the simulated
# Franka with it over ROS 2. Options go to the demo:
#   bash scripts/demo.sh --instruction "put the blue cube on the red pad" --seed 3
# The demo's nodes run on a ROS domain of their own, not the checkout's (scripts/env.sh), which
# `ros2 launch` in another terminal uses; a ROS_DOMAIN_ID exported by hand is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh demo
. scripts/env.sh
if [ "$ROS_DOMAIN_ID" = "$SEQAI_ROS_DOMAIN_DEFAULT" ]; then
  ROS_DOMAIN_ID=$(( (SEQAI_ROS_DOMAIN_DEFAULT + $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 99) % 100 + 1 ))   # 1..100, never the default
  export ROS_DOMAIN_ID
fi
exec python -m sequence_ai_ros.demo "$@"
