#!/usr/bin/env bash
# Fill build/wheelhouse/ with the wheels that test/e2e/test_wheel_install.py installs into its fresh
# venvs: the dependencies of `sequence-ai[server]` and of the client alone (install_requires).
# The test suite runs in a loopback-only network namespace (scripts/in_loopback_ns.sh) where no
# index is reachable, so this runs before, online (scripts/bootstrap.sh's test profile calls it);
# the tests then `pip install --no-index --find-links build/wheelhouse`.
#
#   bash scripts/wheelhouse.sh         PYTHON=...  interpreter whose tags the wheels must fit
#                                                  (default .venv/bin/python, else python3)
#
# The requirements are read from setup.py (its setup() arguments, as colcon reads them) into
# build/wheelhouse/requirements.txt. A stamp keyed on that list and the interpreter makes a rerun
# with nothing changed return at once; a changed list downloads what is new (pip keeps the rest).
# Wheels only (--only-binary): the offline venvs have no compiler or build backend to spare.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON=$ROOT/.venv/bin/python; else PYTHON=python3; fi
fi
HOUSE=$ROOT/build/wheelhouse
mkdir -p "$HOUSE"

# the requirement lines: install_requires + extras_require["server"], from setup.py's own setup() call
reqs=$(cd "$ROOT" && "$PYTHON" - <<'EOF'
import runpy, sys
import setuptools
seen = {}
def capture(**kwargs):
    seen.update(kwargs)
setuptools.setup = capture
sys.argv = ["setup.py", "--name"]
runpy.run_path("setup.py", run_name="__main__")
lines = list(seen["install_requires"]) + list(seen["extras_require"]["server"])
print("\n".join(sorted(dict.fromkeys(lines))))
EOF
)
tag=$("$PYTHON" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')
key=$(printf '%s\n%s\n' "$tag" "$reqs" | sha256sum | cut -c1-16)
stamp=$HOUSE/.stamp-$key
if [ -f "$stamp" ]; then
  echo "wheelhouse: up to date ($HOUSE, $(ls "$HOUSE"/*.whl | wc -l) wheels)"
  exit 0
fi
printf '%s\n' "$reqs" >"$HOUSE/requirements.txt"
t0=$(date +%s)
"$PYTHON" -m pip download -q --disable-pip-version-check --only-binary=:all: -d "$HOUSE" -r "$HOUSE/requirements.txt"
rm -f "$HOUSE"/.stamp-*
touch "$stamp"
echo "wheelhouse: $(ls "$HOUSE"/*.whl | wc -l) wheels in $HOUSE ($(du -sh "$HOUSE" | cut -f1), $(( $(date +%s) - t0 )) s)"
