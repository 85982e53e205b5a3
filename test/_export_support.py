"""What the export-target tests share (test_export_paths.py: the gateway's capture export;
test_bag_export_paths.py: ``sequence-ai bag export``): the marker's file name and a snapshot of a
folder, to prove a refused export left it as it was."""
from __future__ import annotations

import os
from pathlib import Path

#: the signed marker an export writes into its folder (sequence_ai_data.marker)
MARKER = ".sequence-ai-export.json"


def tree(root: Path) -> dict:
    """{relative path: bytes} of every file under ``root`` (links as ``("link", target)``)."""
    out = {}
    for p in sorted(Path(root).rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p.relative_to(root))] = p.read_bytes()
    return out
