"""One command for the client benchmarks: ``python bench/run_client_benches.py [--quick]``.

Creates ``.venv/openpi-baseline`` (openpi-client + websockets from PyPI; it pins numpy<2, so it
cannot share the project's venv) the first time, for the openpi protocol baseline, then runs
bench/bench_client.py. Without network the baseline row is left out and says so.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv" / "openpi-baseline"


def ensure_baseline_venv() -> None:
    py = VENV / "bin" / "python"
    if py.exists():
        return
    try:
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "openpi-client", "websockets",
                        "typing_extensions"], check=True, timeout=600)
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"(openpi baseline venv not created: {exc})")


if __name__ == "__main__":
    ensure_baseline_venv()
    sys.exit(subprocess.call([sys.executable, str(Path(__file__).with_name("bench_client.py")), *sys.argv[1:]]))
