#!/usr/bin/env bash
# The test suite, as CI runs it: install what is needed, then run every test inside a
# loopback-only network namespace (servers on 127.0.0.1, DDS kept on this machine).
# Extra arguments go to pytest: bash scripts/test.sh -k driver
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
. scripts/env.sh
exec scripts/in_loopback_ns.sh python -m pytest "$@"
