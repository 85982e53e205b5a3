#!/usr/bin/env bash
# Print a colcon defaults file (YAML) for building this repository in a ROS 2 workspace against the
# ROS 2 wheels of a Python virtual environment (scripts/bootstrap.sh's .venv), with no system ROS:
# CMake has to be told which interpreter carries the wheels (Python3_EXECUTABLE), and
# scripts/cmake/wheel_fixups.cmake (CMAKE_PROJECT_INCLUDE) repairs the wheels' CMake exports,
# which name include paths of the machine they were built on (/opt/python/cp311-cp311/...);
# BUILD_TESTING=OFF because the wheels carry no ament linters. Paths are absolute (colcon passes
# cmake-args as given), so the file is written for this checkout and this interpreter.
# With a system ROS 2 (/opt/ros/jazzy sourced) none of this is needed: plain `colcon build`.
#
# Usage (from the workspace root, the venv active):
#   bash src/sequence-ai/scripts/colcon_defaults.sh > colcon-defaults.yaml
#   COLCON_DEFAULTS_FILE=$PWD/colcon-defaults.yaml colcon build
#   PYTHON=/path/to/python   the interpreter to name (default: `python` on PATH, else python3)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$(command -v python || command -v python3 || true)}
[ -n "$PY" ] || { echo "colcon_defaults.sh: no python on PATH; activate the venv (. scripts/env.sh) or set PYTHON" >&2; exit 1; }
PY=$("$PY" -c 'import sys; print(sys.executable)')   # through pyenv-style shims to the interpreter
cat <<YAML
build:
  cmake-args:
    - -DPython3_EXECUTABLE=$PY
    - -DBUILD_TESTING=OFF
    - -DCMAKE_PROJECT_INCLUDE=$ROOT/scripts/cmake/wheel_fixups.cmake
YAML
