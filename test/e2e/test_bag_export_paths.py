"""``sequence-ai bag export --overwrite`` (and ``--append``) replaces only an earlier export of
this tool: a folder holding its ``.sequence-ai-export.json``, signed for that path with the key in
``$SEQUENCES_HOME/bag-export.key``. ``/``, the home folder, the working directory or a folder above
it, and any other non-empty folder are refused with a message naming the rule, and left as they
were. The real CLI runs as a subprocess on real bags (written by the BagWriter).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from _export_support import MARKER
from _export_support import tree as _tree
from _bags import episode_bag


class Cli:
    """Runs ``python -m sequence_ai.cli bag export`` with its own HOME, SEQUENCES_HOME and cwd."""

    def __init__(self, home: Path, state: Path, cwd: Path):
        self.env = {**os.environ, "HOME": str(home), "SEQUENCES_HOME": str(state)}
        self.cwd = cwd

    def export(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sequence_ai.cli", "bag", "export", *map(str, args)],
                              env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=300)


def test_overwrite_replaces_only_an_earlier_export_of_this_tool(tmp_path):
    bag = tmp_path / "bags" / "episode-1"
    episode_bag(bag, label=True)
    home = tmp_path / "home"
    (home / "notes").mkdir(parents=True)
    (home / "notes" / "todo.txt").write_text("keep me")
    (home / ".bashrc").write_text("export A=1\n")
    work = home / "work" / "project"           # the working directory, inside home
    work.mkdir(parents=True)
    (work / "main.py").write_text("print('hi')\n")
    cli = Cli(home, tmp_path / "state", work)
    home_before, work_before = _tree(home), _tree(work)

    # the home folder ("~" as typed, and spelled out), the working directory and a folder above it
    for out, rule in ((home, "is your home folder"), ("~", "is your home folder"),
                      (".", "is the working directory"), (home / "work", "is the working directory"),
                      ("..", "is the working directory")):
        for mode in ("--overwrite", "--append"):
            r = cli.export(bag, "--out", out, mode)
            assert r.returncode == 1, (out, mode, r.stdout, r.stderr)
            assert "refused" in r.stderr and rule in r.stderr and "Pick a new or empty folder" in r.stderr, r.stderr
    assert _tree(home) == home_before and _tree(work) == work_before
    assert [p.name for p in home.iterdir()] and not [p for p in home.rglob(".*export-*")]

    r = cli.export(bag, "--out", "/", "--overwrite")
    assert r.returncode == 1 and "is the file system root" in r.stderr, r.stderr

    # a folder someone else filled, with or without a marker copied from a real export
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.bin").write_bytes(b"\x01" * 100)
    ds = tmp_path / "ds"
    r = cli.export(bag, "--out", ds)
    assert r.returncode == 0, r.stderr
    marker = json.loads((ds / MARKER).read_text())
    assert marker["tool"] == "sequence-ai bag export" and marker["path"] == str(ds.resolve())
    assert (tmp_path / "state" / "bag-export.key").stat().st_mode & 0o777 == 0o600
    for planted in (False, True):
        if planted:
            shutil.copy(ds / MARKER, foreign / MARKER)      # signed for ds, not for foreign
        before = _tree(foreign)
        for mode in ("--overwrite", "--append"):
            r = cli.export(bag, "--out", foreign, mode)
            assert r.returncode == 1 and "is not an earlier export of `sequence-ai bag export`" in r.stderr, r.stderr
            assert _tree(foreign) == before
    # a file is refused; a non-empty folder without a mode is refused as before
    (tmp_path / "a-file").write_text("x")
    r = cli.export(bag, "--out", tmp_path / "a-file", "--overwrite")
    assert r.returncode == 1 and "is a file" in r.stderr and (tmp_path / "a-file").read_text() == "x"
    r = cli.export(bag, "--out", foreign)
    assert r.returncode == 1 and "is not empty" in r.stderr

    # an export made with another key (another user's or machine's tool) is not this tool's
    other = Cli(home, tmp_path / "other-state", work)
    before = _tree(ds)
    r = other.export(bag, "--out", ds, "--overwrite")
    assert r.returncode == 1 and "is not an earlier export" in r.stderr and _tree(ds) == before

    # the earlier export is replaced: built beside it, signed, renamed into place, the old one gone
    inode = ds.stat().st_ino
    r = cli.export(bag, bag, "--out", ds, "--overwrite")
    assert r.returncode == 0, r.stderr
    info = json.loads((ds / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and "+2 episodes" in r.stdout
    new_marker = json.loads((ds / MARKER).read_text())
    assert new_marker["export_id"] != marker["export_id"] and new_marker["path"] == str(ds.resolve())
    assert ds.stat().st_ino != inode
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # and appended to, still signed
    r = cli.export(bag, "--out", ds, "--append")
    assert r.returncode == 0, r.stderr
    assert json.loads((ds / "meta" / "info.json").read_text())["total_episodes"] == 3
    assert json.loads((ds / MARKER).read_text())["export_id"] != new_marker["export_id"]
