"""A test policy that describes its own process when it loads: writes a JSON report to
``$SEQ_TEST_PROCESS_REPORT`` (argv, sys.path, cwd, the environment as Python and as the C library
see it, session, signal dispositions and masks, open file descriptors by kind, umask, the import
of a module beside this file, its ``__main__`` module, ``sys.orig_argv``), so a test can compare a
forked worker with a started one (test/server/test_forked_workers.py). Serves the echo policy's contract with a constant chunk."""
import ctypes
import json
import os
import signal
import sys

import numpy as np

import seq


def _fd_kinds() -> list:
    """Each open fd's target, sockets/pipes/anon inodes by kind only (their inodes differ)."""
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue                      # the listing's own fd
        out.append(target.split(":[")[0] if ":[" in target else target)
    return sorted(out)


def _c_environ() -> dict:
    libc = ctypes.CDLL(None)
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(libc, "environ")
    out, i = {}, 0
    while environ[i]:
        key, _, value = environ[i].decode(errors="replace").partition("=")
        out[key] = value
        i += 1
    return out


def _disposition(sig) -> str:
    h = signal.getsignal(sig)
    return {signal.SIG_DFL: "default", signal.SIG_IGN: "ignore", signal.default_int_handler: "python"}.get(h, "handler")


def _status(field: str) -> str:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return line.split()[1]
    return ""


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=8,
                              control_frequency_hz=15.0, bounds=[(-1e6, 1e6)] * 7 + [(0.0, 1.0)]),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(64, 64)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
)
class ProcessReportPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        import echo_policy                # beside this file: the policy's folder is on the import path
        mask = os.umask(0o022)
        os.umask(mask)
        report = {
            "argv": sys.argv, "path": sys.path, "cwd": os.getcwd(), "environ": dict(os.environ),
            "c_environ": _c_environ(), "session_leader": os.getsid(0) == os.getpid(),
            "pgid_is_pid": os.getpgid(0) == os.getpid(), "stdin": os.readlink("/proc/self/fd/0"),
            "stdout": os.readlink("/proc/self/fd/1"), "stderr": os.readlink("/proc/self/fd/2"),
            "signals": {s.name: _disposition(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD,
                                                           signal.SIGPIPE, signal.SIGHUP, signal.SIGUSR1)},
            "sig_ignored": _status("SigIgn"), "sig_blocked": _status("SigBlk"), "fds": _fd_kinds(), "umask": mask,
            "cmdline": [a.decode() for a in open("/proc/self/cmdline", "rb").read().split(b"\0") if a],
            "beside": echo_policy.__file__, "pid": os.getpid(), "ppid": os.getppid(),
            # what multiprocessing's spawn and forkserver children re-import, and what tools read
            "main": [getattr(sys.modules["__main__"], "__file__", None),
                     getattr(getattr(sys.modules["__main__"], "__spec__", None), "name", None)],
            "orig_argv": sys.orig_argv,
        }
        path = os.environ["SEQ_TEST_PROCESS_REPORT"]
        with open(path + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(path + ".tmp", path)

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk(np.zeros((4, 8), dtype=np.float32))
