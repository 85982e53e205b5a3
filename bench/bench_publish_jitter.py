"""Publish period error of policy_driver at 15 Hz and 100 Hz, idle and with the other core busy.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_publish_jitter.py [--seconds 4]

Real pieces: a gateway process and a worker serving a tiny generated policy (8-wide
joint_absolute rows at the given rate, 1 s chunks), the real PolicyDriver node (rclpy, Fast DDS)
fed by an in-process fake robot (64x64 camera + joint states at 30 Hz), one Act goal per case.
The error of a period is |t[k+1] - t[k] - 1/hz| where t is time.monotonic() taken right after
each publish (the driver's trace). "loaded" runs a pure-Python busy loop in another process for
the whole case. Prints p50 / p99 / max in ms per case.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "test"))

POLICY = '''
import numpy as np
import seq

@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=8,
                              control_frequency_hz={hz}),
    observation=seq.ObservationContract(cameras={{"exterior_1": seq.Camera(64, 64)}},
                                        proprio={{"joint_positions": 7, "gripper": 1}}),
)
class Jitter{n}(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk(np.zeros(({rows}, 8)))
'''


def run_case(gw, hz: float, seconds: float, loaded: bool) -> np.ndarray:
    import rclpy
    from rclpy.action import ActionClient
    from rclpy.executors import MultiThreadedExecutor
    from test_ros_driver import KEY_ENV, FakeRobot, Goal, driver_params, wait  # the test's robot + goal helpers

    from sequence_ai_msgs.action import Act
    from sequence_ai_ros.driver_node import PolicyDriver

    name = f"jitter-{int(hz)}"
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    ex = MultiThreadedExecutor(num_threads=6, context=ctx)
    nodes = [FakeRobot(ctx)]
    params = [p for p in driver_params(gw) if p.name != "model"] + [rclpy.parameter.Parameter("model", value=name)]
    nodes.append(PolicyDriver(context=ctx, parameter_overrides=params))
    nodes.append(rclpy.create_node("bench_client", context=ctx))
    for n in nodes:
        ex.add_node(n)
    spin = threading.Thread(target=ex.spin, daemon=True)
    spin.start()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        client = ActionClient(nodes[2], Act, "policy_driver/act")
        assert client.wait_for_server(timeout_sec=20.0)
        wait(nodes[1].assembler.ready, 20.0, "sensors")
        Goal(client, max_seconds=seconds).wait_result(timeout=seconds + 30)
        t = np.array([c[0] for c in nodes[1].trace.commands])
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        nodes[1].policy.interrupt()
        ex.shutdown(timeout_sec=10.0)
        spin.join(timeout=10.0)
        for n in nodes:
            n.destroy_node()
        rclpy.shutdown(context=ctx)
    return np.abs(np.diff(t) - 1.0 / hz) * 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each goal (s)")
    args = ap.parse_args()
    from _servers import GatewayProcess
    from test_ros_driver import KEY_ENV

    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.start(Path(tmp))
        os.environ[KEY_ENV] = gw.api_key
        try:
            for hz in (15.0, 100.0):
                f = Path(tmp) / f"jitter_{int(hz)}.py"
                f.write_text(POLICY.format(hz=hz, n=int(hz), rows=int(hz)))
                dep = gw.deploy(str(f), name=f"jitter-{int(hz)}")
                assert dep["status"] == "ready", dep
            print(f"{'rate':>6} {'load':>7} {'periods':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
            for hz in (15.0, 100.0):
                for loaded in (False, True):
                    err = run_case(gw, hz, args.seconds, loaded)
                    print(f"{hz:>5.0f}Hz {'loaded' if loaded else 'idle':>7} {len(err):>8d} "
                          f"{np.percentile(err, 50):>8.3f} {np.percentile(err, 99):>8.3f} {err.max():>8.3f}", flush=True)
        finally:
            gw.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
