"""seq_cli(), the suite's in-process ``seq`` (test/_servers.py): what a process gave the tests
(exit code, stdout and stderr apart, the environment and working directory of the call, a bound on
its time) it gives too, and it leaves the test process as it found it."""
from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from _servers import seq_cli


def test_exit_code_streams_and_the_calls_environment_come_back_apart_and_nothing_stays():
    cwd, handler = os.getcwd(), signal.getsignal(signal.SIGUSR1)
    r = seq_cli(None, "policy", "ls", "--gateway", "http://127.0.0.1:9", env={"SEQUENCES_API_KEY": "k"})
    assert r.returncode == 6 and r.stdout == "", r
    assert "error[unreachable]" in r.stderr and "http://127.0.0.1:9" in r.stderr, r.stderr
    assert "SEQUENCES_API_KEY" not in os.environ and "COLUMNS" not in os.environ
    assert os.getcwd() == cwd and signal.getsignal(signal.SIGUSR1) is handler


def test_the_working_directory_is_the_calls_own(tmp_path):
    cwd = os.getcwd()
    r = seq_cli(None, "init", "toy-policy", "mine", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mine" / "policy.py").is_file() and os.getcwd() == cwd


def test_a_call_that_hangs_fails_at_its_timeout_and_restores_the_signal_handler():
    handler = signal.getsignal(signal.SIGUSR1)
    with socket.socket() as listener:     # accepts the connection (backlog), never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match=r"seq policy ls --gateway .* did not finish within 0.5 s"):
            seq_cli(None, "policy", "ls", "--gateway", url, env={"SEQUENCES_API_KEY": "k"}, timeout=0.5)
        assert time.monotonic() - t0 < 10          # not the CLI's own 30 s request timeout
    assert signal.getsignal(signal.SIGUSR1) is handler
