# shellcheck shell=bash
# Source me (bash or zsh, from any directory, `set -u` safe):  . scripts/env.sh
# Sets up everything that runs ROS code here (after scripts/bootstrap.sh):
#   .venv activated; the built sequence_ai_msgs (install/) on PYTHONPATH / LD_LIBRARY_PATH /
#   AMENT_PREFIX_PATH; the ROS wheels' libraries on LD_LIBRARY_PATH; Fast DDS kept on this
#   host (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST) with a ROS_DOMAIN_ID of this checkout (1..100,
#   from its path: every shell that sources this file sees the same nodes) unless one is set;
#   MUJOCO_GL=egl for offscreen rendering.
# Exports SEQAI_ROOT (the repository root) and SEQAI_ROS_DOMAIN_DEFAULT (the checkout's domain, so
# the demo and the tests can tell it from one chosen by hand and take one of their own).

if [ -n "${BASH_SOURCE:-}" ]; then
  _seqai_here=${BASH_SOURCE[0]}
elif [ -n "${ZSH_VERSION:-}" ]; then
  # shellcheck disable=SC2296
  _seqai_here=${(%):-%x}
else
  _seqai_here=scripts/env.sh   # POSIX sh cannot tell a sourced file's path: assume cwd = repo
fi
SEQAI_ROOT=$(cd "$(dirname "$_seqai_here")/.." && pwd)
export SEQAI_ROOT
unset _seqai_here

if [ ! -x "$SEQAI_ROOT/.venv/bin/python" ]; then
  echo "env.sh: $SEQAI_ROOT/.venv missing: run 'bash scripts/bootstrap.sh' first" >&2
  return 1 2>/dev/null || exit 1
fi

# prepend DIR to the colon list in variable NAME unless already there
_seqai_prepend() {
  eval "_seqai_cur=\${$1:-}"
  case ":$_seqai_cur:" in
    *":$2:"*) ;;
    *) if [ -n "$_seqai_cur" ]; then eval "export $1=\"\$2:\$_seqai_cur\""; else eval "export $1=\"\$2\""; fi ;;
  esac
  unset _seqai_cur
}

# --- the virtual environment
if [ "${VIRTUAL_ENV:-}" != "$SEQAI_ROOT/.venv" ]; then
  # shellcheck disable=SC1091
  . "$SEQAI_ROOT/.venv/bin/activate"
fi

_seqai_pyver=$("$SEQAI_ROOT/.venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null \
  || ls "$SEQAI_ROOT/.venv/lib" | sed -n 's/^python//p' | head -n 1)
_seqai_site=$SEQAI_ROOT/.venv/lib/python$_seqai_pyver/site-packages

# --- libraries of the ROS wheels (what their ros_wheels_bootstrapper .pth would add by re-executing
# python; we set it here and mark it done, so python starts once)
_seqai_prepend LD_LIBRARY_PATH "$SEQAI_ROOT/.venv/lib"
for _seqai_d in "$_seqai_site"/ros_*.libs; do
  [ -d "$_seqai_d" ] && _seqai_prepend LD_LIBRARY_PATH "$_seqai_d"
done
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1
_seqai_prepend AMENT_PREFIX_PATH "$SEQAI_ROOT/.venv"

# --- the built interfaces (sequence_ai_msgs), if bootstrap built them
if [ -d "$SEQAI_ROOT/install/lib" ]; then
  _seqai_prepend LD_LIBRARY_PATH "$SEQAI_ROOT/install/lib"
  _seqai_prepend AMENT_PREFIX_PATH "$SEQAI_ROOT/install"
  for _seqai_d in "$SEQAI_ROOT/install/lib/python$_seqai_pyver/site-packages" \
                  "$SEQAI_ROOT/install/local/lib/python$_seqai_pyver/dist-packages"; do
    [ -d "$_seqai_d" ] && _seqai_prepend PYTHONPATH "$_seqai_d"
  done
else
  echo "env.sh: $SEQAI_ROOT/install missing (sequence_ai_msgs not built): run 'bash scripts/bootstrap.sh'" >&2
fi
unset _seqai_d _seqai_site _seqai_pyver

# --- ROS 2: Fast DDS, discovery on this host only, the checkout's own domain: CRC of its path
# mod 100, + 1 (stable, so a second terminal sees the first one's nodes; another checkout most
# likely gets another). An exported ROS_DOMAIN_ID wins.
export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
SEQAI_ROS_DOMAIN_DEFAULT=$(( $(printf '%s' "$SEQAI_ROOT" | cksum | cut -d ' ' -f 1) % 100 + 1 ))
export SEQAI_ROS_DOMAIN_DEFAULT
if [ -z "${ROS_DOMAIN_ID:-}" ]; then
  export ROS_DOMAIN_ID="$SEQAI_ROS_DOMAIN_DEFAULT"
fi

# --- MuJoCo offscreen rendering: EGL (Mesa llvmpipe without a GPU, the GPU's EGL with one)
export MUJOCO_GL=egl
export PYOPENGL_PLATFORM=egl

unset -f _seqai_prepend
