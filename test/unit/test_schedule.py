"""test/_schedule.py: the order the files run in and the markers their tests get."""
from __future__ import annotations

from pathlib import Path

import _schedule


class Item:
    """What _schedule.apply reads of a collected test: its file and its markers."""

    def __init__(self, path: Path, name: str):
        self.path, self.name, self.marks = path, name, []

    def add_marker(self, mark: str) -> None:
        self.marks.append(mark)


def _file(tmp_path: Path, name: str, text: str = "def test_x():\n    pass\n") -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_files_go_heaviest_first_keeping_each_files_order_and_ties_in_collection_order(tmp_path, monkeypatch):
    monkeypatch.setattr(_schedule, "FILE_SECONDS", {"test_b.py": 50, "test_c.py": 5, "test_d.py": 5})
    a, b, c, d = (_file(tmp_path, f"test_{x}.py") for x in "abcd")     # test_a.py: unknown, DEFAULT_SECONDS
    items = [Item(c, "c1"), Item(a, "a1"), Item(b, "b1"), Item(a, "a2"), Item(d, "d1"), Item(b, "b2"), Item(c, "c2")]
    _schedule.apply(items)
    assert [i.name for i in items] == ["b1", "b2", "a1", "a2", "c1", "c2", "d1"]


def test_markers_follow_the_folder_the_imports_the_name_and_the_weight(tmp_path, monkeypatch):
    monkeypatch.setattr(_schedule, "FILE_SECONDS", {"test_heavy.py": _schedule.SLOW_S, "test_demo_cli.py": 1})
    files = {
        "ros import": _file(tmp_path, "test_bags.py", '"""Bags."""\nimport json\nfrom rclpy.node import Node\n'),
        "ros name": _file(tmp_path, "test_ros_thing.py"),
        "a mention": _file(tmp_path, "test_text.py", '"""Needs no rclpy import."""\nx = "import rclpy"\n'),
        "ros folder": _file(tmp_path, "ros/test_interfaces.py"),
        "e2e": _file(tmp_path, "e2e/test_demo_cli.py"),
        "e2e name elsewhere": _file(tmp_path, "unit/test_demo_cli2.py"),
        "heavy": _file(tmp_path, "test_heavy.py"),
        "plain": _file(tmp_path, "test_plain.py"),
    }
    items = {what: Item(path, what) for what, path in files.items()}
    _schedule.apply(list(items.values()))
    assert {what: sorted(i.marks) for what, i in items.items()} == {
        "ros import": ["ros"], "ros name": ["ros"], "a mention": [], "ros folder": ["ros"], "e2e": ["e2e", "slow"],
        "e2e name elsewhere": [],
        "heavy": ["slow"], "plain": []}


def test_a_junit_report_gives_seconds_per_file(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text("""<?xml version="1.0"?><testsuites><testsuite>
        <testcase classname="test.test_a" name="t1" time="2.4"/>
        <testcase classname="test.test_a.TestGroup" name="t2" time="1.4"/>
        <testcase classname="test.test_b" name="t1" time="0.2"/>
        <testcase classname="test.test_c" name="t1" time="30.0"/>
        </testsuite></testsuites>""")
    table = _schedule.table_from_junit(str(report))
    assert table == {"test_c.py": 30, "test_a.py": 4, "test_b.py": 1}
    assert list(table) == ["test_c.py", "test_a.py", "test_b.py"]       # heaviest first, as the table is kept
