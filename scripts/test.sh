#!/usr/bin/env bash
# The test suite, as CI runs it: install what is needed (bootstrap's test profile: the demo's set
# plus every extra, the ROS 2 tools, the openpi-client side venv, and what tests would otherwise
# fetch from an index -- uv's cache for the image environments, build/wheelhouse/), then run every
# test inside a loopback-only network namespace (servers on 127.0.0.1, DDS kept on this machine,
# no index reachable).
# Four pytest-xdist workers, one test file each at a time (--dist loadfile keeps a module's
# servers in one process; test/conftest.py gives each worker its own ROS_DOMAIN_ID): most tests
# wait on real-time sims and servers, so two workers left the 2 cores half idle. Measured from
# clean clones on this 2-core machine, the same code: 2 workers 749 s (cores ~50 % busy), 4
# workers 458 s (cores 96 % busy, so more would only add load). SEQ_TEST_WORKERS=N for another
# count, 0 to run them serially.
# The files go heaviest first (test/_schedule.py's table, applied in test/conftest.py; xdist's own
# re-sort by number of tests is turned off so that order holds), so no heavy file starts last.
# --fast: only the tests marked neither ros nor slow (test/_schedule.py says which those are).
# The report goes to build/test-results.xml too, which refreshes that table:
#   python test/_schedule.py build/test-results.xml
# Extra arguments go to pytest: bash scripts/test.sh -k driver
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
for a in "$@"; do
  if [ "$a" = "--fast" ]; then args+=(-m "not ros and not slow"); else args+=("$a"); fi
done
bash scripts/bootstrap.sh test
. scripts/env.sh
# Byte code is cached even where the caller's environment says not to (gitignored __pycache__/):
# without it every server, node and CLI process a test starts compiles the project's modules again
# (0.2 s of CPU for a gateway's imports here) and each worker redoes pytest's assertion rewriting.
unset PYTHONDONTWRITEBYTECODE
workers=${SEQ_TEST_WORKERS:-4}
if [ "$workers" = "0" ]; then
  exec scripts/in_loopback_ns.sh python -m pytest ${args[@]+"${args[@]}"}
fi
exec scripts/in_loopback_ns.sh python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder \
  --durations=25 --junitxml=build/test-results.xml ${args[@]+"${args[@]}"}
