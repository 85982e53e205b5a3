#!/usr/bin/env bash
# The main job: install what is needed, start the local server, deploy the demo policy, and drive
# the simulated Franka with it over ROS 2. Options go to the demo:
#   bash scripts/demo.sh --instruction "put the blue cube on the red pad" --seed 3
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. scripts/env.sh
exec python -m sequence_ai_ros.demo "$@"
