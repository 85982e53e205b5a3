#!/usr/bin/env bash
# Conformance check (not in CI): load exported LeRobot datasets with the real `lerobot` library.
#
#   bash scripts/lerobot_conformance.sh DATASET_DIR [DATASET_DIR ...]
#
# Makes (once) a side virtual environment on Python 3.12 with lerobot[dataset]==0.6.1 (lerobot
# needs Python >= 3.12; the install is ~5 GB, CUDA torch included) and, for each directory,
# opens it with LeRobotDataset and reads every frame: the decoded video frames, state, action,
# task and next.success of each one. A v2.1 dataset is first converted to v3.0 with lerobot's
# own converter (0.6.1 reads v3.0 only), in a copy, so the original is untouched.
#   SEQAI_LEROBOT_VENV   where the side venv lives (default: build/lerobot-venv)
#   SEQAI_PY312          the interpreter (default: ~/.pyenv/versions/3.12*/bin/python3.12, else python3.12)
# Exit status 0 only if every dataset loads and every frame reads.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${SEQAI_LEROBOT_VENV:-$ROOT/build/lerobot-venv}
if [ $# -eq 0 ]; then echo "usage: $0 DATASET_DIR [DATASET_DIR ...]" >&2; exit 2; fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import lerobot" 2>/dev/null; then
  PY=${SEQAI_PY312:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1)}
  PY=${PY:-$(command -v python3.12 || true)}
  [ -n "$PY" ] || { echo "lerobot_conformance: Python 3.12 not found; set SEQAI_PY312" >&2; exit 1; }
  echo "lerobot_conformance: creating $VENV with $PY and installing lerobot[dataset]==0.6.1 (~5 GB)..." >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "lerobot[dataset]==0.6.1"
fi
exec "$VENV/bin/python" - "$@" <<'PY'
import json, shutil, sys, tempfile, time
from pathlib import Path

import lerobot
from lerobot.datasets.lerobot_dataset import LeRobotDataset

print(f"lerobot {getattr(lerobot, '__version__', '?')}")
failed = 0
for arg in sys.argv[1:]:
    root = Path(arg).resolve()
    info = json.loads((root / "meta" / "info.json").read_text())
    version = info.get("codebase_version")
    t0 = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            load_root = root
            if version == "v2.1":   # lerobot 0.6.1 reads v3.0: convert a copy with its own converter
                from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset
                load_root = Path(tmp) / root.name
                shutil.copytree(root, load_root)
                convert_dataset(repo_id=f"local/{root.name}", root=load_root, push_to_hub=False, force_conversion=True)
            ds = LeRobotDataset(f"local/{root.name}", root=load_root, video_backend="pyav")
            n = 0
            tasks = set(ds.meta.tasks.index)
            for i in range(len(ds)):
                item = ds[i]
                # the invariants CI checks with pyarrow/PyAV, here through lerobot's own reader
                assert int(item["index"]) == i, (i, item["index"])
                assert abs(float(item["timestamp"]) - int(item["frame_index"]) / ds.fps) < 1e-4, i
                assert item["task"] in tasks, item["task"]
                for key in ds.meta.video_keys:
                    img = item[key]
                    assert img.shape[0] == 3 and 0.0 <= float(img.min()) and float(img.max()) <= 1.0, key
                n += 1
            keys = sorted(k for k in item if k.startswith("observation") or k in ("action", "next.success", "task"))
            shapes = {k: tuple(getattr(item[k], "shape", ())) for k in keys if k != "task"}
            print(f"OK   {root} ({version}): {ds.num_episodes} episodes, {n}/{ds.num_frames} frames read "
                  f"in {time.monotonic() - t0:.1f} s; fps {ds.fps}; last task {item['task']!r}; {shapes}")
    except Exception as exc:
        failed += 1
        print(f"FAIL {root} ({version}): {type(exc).__name__}: {exc}")
sys.exit(1 if failed else 0)
PY
