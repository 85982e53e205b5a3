#!/usr/bin/env bash
# The main job: install what the demo uses (bootstrap's demo profile: the server, the sim, the ROS 2
# wheels and the interface build -- no test tools, torch or ray; about 2 minutes on a new machine,
# ~1 s once done), start the local server, deploy the demo policy, and drive the simulated Franka
# with it over ROS 2. Options go to the demo:
#   bash scripts/demo.sh --instruction "put the blue cube on the red pad" --seed 3
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh demo
. scripts/env.sh
exec python -m sequence_ai_ros.demo "$@"
