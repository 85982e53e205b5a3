"""Fill uv's cache with what the suite's image environments install, so they build offline.

test/server/test_platform_images.py deploys policies whose ``image=`` pins tomli; the gateway builds each
environment with ``uv pip install --offline`` first (uv's cache and the local file indexes), then
over the network. The suite runs in a loopback-only namespace (scripts/test.sh), where the network
attempt cannot reach an index, and a new machine's uv cache is empty: the build must find
everything in the cache. This script, run by scripts/bootstrap.sh (test profile) before the
namespace is entered, builds those very environments here through the gateway's own code
(``image_from_source`` on the test's POLICY template rendered with each of its PINS,
``EnvBuilder._build_into``: the same ``uv`` command, the worker's requirements pinned by
``worker_requirements`` to this venv's versions, pip's configured indexes), online where needed,
then proves that each one now installs with ``--offline`` alone, and throws the environments away:
what stays is uv's cache (``$UV_CACHE_DIR`` if set, else uv's default).

  python scripts/prefetch_images.py key     print the key of what would be fetched (cheap)
  python scripts/prefetch_images.py fetch   fetch and check (prints one line per environment)
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "server")]
SOURCES = [ROOT / "test" / "server" / "test_platform_images.py"]   # test files whose POLICY is deployed with each of PINS


def _images(tmp: Path) -> list[dict]:
    """The ``image=`` of every policy the image tests deploy, read as the gateway reads it."""
    from sequence_ai_server.launchers.envs import image_from_source
    images = []
    for src in SOURCES:
        consts = {}
        for node in ast.parse(src.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id in ("POLICY", "PINS"):
                    consts[node.targets[0].id] = ast.literal_eval(node.value)
        if set(consts) != {"POLICY", "PINS"}:
            raise SystemExit(f"prefetch_images: {src} has no module-level POLICY template and PINS tuple")
        for version in consts["PINS"]:
            f = tmp / f"prefetch_{len(images)}.py"
            f.write_text(consts["POLICY"].format(version=version, tag="prefetch"))
            image = image_from_source(str(f))
            if image is None:
                raise SystemExit(f"prefetch_images: {src}'s POLICY declares no image=")
            images.append(image)
    return images


def _uv_cache_dir(uv: list) -> str:
    """uv's cache folder ($UV_CACHE_DIR, else uv's default), resolved (one folder, one key)."""
    out = subprocess.run(uv + ["cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
    return os.path.realpath(out)


def _key(images: list[dict], uv: list) -> str:
    from importlib import metadata

    from sequence_ai_server.launchers.envs import _packages, worker_requirements
    what = {"installs": [[*_packages(i), *worker_requirements(_packages(i))] for i in images],
            "python": sys.version, "uv": metadata.version("uv"), "cache": _uv_cache_dir(uv),
            "pip_env": {k: v for k, v in os.environ.items() if k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                                                                     "PIP_FIND_LINKS")}}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:32]


def main() -> int:
    from sequence_ai_server.launchers.envs import EnvBuilder, ImageBuildError, _packages, _uv, pip_indexes, worker_requirements
    mode = sys.argv[1] if len(sys.argv) > 1 else "fetch"
    uv = _uv()
    with tempfile.TemporaryDirectory(prefix="seqai-prefetch-") as tmp:
        tmp = Path(tmp)
        images = _images(tmp)
        if mode == "key":
            print(_key(images, uv))
            return 0
        print(f"uv cache: {_uv_cache_dir(uv)}", flush=True)
        out = sys.stdout.buffer
        builder = EnvBuilder(tmp / "data")
        for image in images:
            packages = _packages(image)
            t0 = time.monotonic()
            path = builder.root / builder.spec_hash(image)
            # the gateway's build: --offline first, then the configured indexes over the network
            builder._build_into(image, path, out, lambda text: (out.write(f"prefetch: {text}\n".encode()), out.flush()))
            # and the proof: the same install into a new environment, offline only
            check = tmp / "check"
            env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_PROGRESS="1")
            subprocess.run(uv + ["venv", "--python", sys.executable, str(check)], check=True, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            proof = subprocess.run(uv + ["pip", "install", "--offline", "--python", str(check / "bin" / "python"),
                                         *pip_indexes(), *packages, *worker_requirements(packages)],
                                   capture_output=True, text=True, env=env)
            if proof.returncode:
                raise ImageBuildError(f"{' '.join(packages)}: still not installable offline after the fetch:\n"
                                      f"{proof.stdout[-2000:]}{proof.stderr[-2000:]}")
            subprocess.run(["rm", "-rf", str(check), str(path)], check=True)
            print(f"prefetch: {' '.join(packages)} + the worker's {len(worker_requirements(packages))} pins: "
                  f"in uv's cache, installs offline ({time.monotonic() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
