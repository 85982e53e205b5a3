"""eventually(), the suite's one polling wait (test/_wait.py)."""
from __future__ import annotations

import itertools
import time

import pytest

from _wait import eventually


def test_returns_the_first_truthy_value_of_the_predicate():
    calls = itertools.count()
    assert eventually(lambda: next(calls) >= 3 and "ready", 5.0, 0.001) == "ready"
    assert next(calls) == 4          # asked four times, not again after it came true


def test_a_timeout_fails_naming_what_was_awaited_its_last_value_and_the_detail():
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as e:
        eventually(lambda: [], 0.2, 0.05, what="the worker to stop", detail=lambda: "log: tail")
    elapsed = time.monotonic() - t0
    assert "timed out after 0.2 s waiting for the worker to stop (last value: [])" in str(e.value)
    assert str(e.value).endswith("\nlog: tail")
    assert 0.2 <= elapsed < 2.0


def test_without_what_a_lambda_is_named_by_its_source_line():
    with pytest.raises(AssertionError, match=r"waiting for .*lambda: 1 \+ 1 == 3"):
        eventually(lambda: 1 + 1 == 3, 0.05, 0.01)


def test_the_predicate_is_asked_once_more_when_the_timeout_has_passed():
    # A predicate that comes true only after the deadline: a wait that gave up without asking
    # again would fail here.
    t0 = time.monotonic()
    assert eventually(lambda: time.monotonic() - t0 >= 0.3, 0.3, 10.0)


def test_an_exception_from_the_predicate_ends_the_wait_at_once():
    def exited():
        raise AssertionError("the server exited with 1")
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="the server exited with 1"):
        eventually(exited, 30.0)
    assert time.monotonic() - t0 < 1.0
