"""Publish period error of policy_driver at 15 Hz and 100 Hz, idle and with the other core busy.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_publish_jitter.py [--seconds 4] [--runs 3]

Real pieces: a gateway process and a worker serving a tiny generated policy (8-wide
joint_absolute rows at the given rate, ``--chunk-s`` long chunks), the real PolicyDriver node
(rclpy, Fast DDS) fed by an in-process fake robot (64x64 camera + joint states at 30 Hz), Act
goals sent by an action client.

Per case (rate x idle/loaded) and run: a fresh driver, one unmeasured warm-up goal of
``--warmup-s`` (the first connection, the first chunk, the server's first calls), then one
measured goal of ``--seconds``. The error of a period is |t[k+1] - t[k] - 1/hz| (ms), where t is
time.monotonic() taken right after each publish (the driver's trace). Periods that contain an
underrun (the buffer was empty at a deadline) or a late-tick resync are pacing failures of
another kind; they are counted in the ``underruns`` / ``late`` columns and stay in the figures.
"loaded" runs a pure-Python busy loop in another process for the whole case (the other core
busy). Prints p50 / p99 / max per case and, with ``--runs`` > 1, the medians over the runs.

The driver process's GIL switch interval is set as ``policy_driver``'s ``main()`` sets it
(``driver_node.GIL_SWITCH_INTERVAL_S``) unless ``--switch-interval-ms`` says otherwise;
``--publish-delay-ms`` sets the driver's ``publish_delay_ms`` parameter (0 = publish from the
core's paced callback, no publisher thread), ``--realtime-priority`` its ``realtime_priority`` and
``--publish-gil-lead-ms`` its ``publish_gil_lead_ms`` (0 = the publisher waits for the GIL at the
due time like any thread).

Columns: ``late`` = the core's late ticks (more than a period behind: resynced), ``regrids`` =
rows that reached the publisher thread after their slot (the grid moved later), ``floor p50/p99``
= period error of a bare Python thread sleeping to monotonic deadlines at the same rate in
another process during the measured goal: what the machine's scheduler allows at that moment,
the floor under any design at normal priority. The machine's load average is printed at the
start and the end (a shared machine: read the figures with it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
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


FLOOR = """
import json, sys, time
hz, seconds = float(sys.argv[1]), float(sys.argv[2])
period, t0, ts = 1.0 / hz, time.monotonic() + 0.05, []
for k in range(int(seconds * hz)):
    left = t0 + k * period - time.monotonic()
    if left > 0:
        time.sleep(left)
    ts.append(time.monotonic())
print(json.dumps(ts))
"""


def floor_process(hz: float, seconds: float) -> subprocess.Popen:
    """A bare Python thread sleeping to monotonic deadlines at ``hz`` for ``seconds``, in its own
    process (no GIL shared with the driver): the machine's scheduling floor at that moment."""
    return subprocess.Popen([sys.executable, "-c", FLOOR, str(hz), str(seconds)], stdout=subprocess.PIPE, text=True)


def floor_errors(proc: subprocess.Popen, hz: float) -> np.ndarray:
    """Period errors (ms) the floor process measured."""
    out, _ = proc.communicate(timeout=60)
    return np.abs(np.diff(np.array(json.loads(out))) - 1.0 / hz) * 1000.0


def run_case(gw, hz: float, seconds: float, loaded: bool, warmup_s: float, extra_params: dict) -> dict:
    """One fresh driver, a warm-up goal, then a measured goal.

    Returns ``{"err_ms": period errors (ms), "underruns": int, "late": the core's late ticks,
    "regrids": rows that moved the publisher's grid later, "actions": commands published,
    "floor_ms": period errors (ms) of a bare sleeping thread in another process, same moment}``
    for the measured goal.
    """
    import rclpy
    from rclpy.action import ActionClient
    from rclpy.executors import MultiThreadedExecutor
    from _ros_driver_support import FakeRobot, Goal, driver_params, wait  # the test's robot + goal helpers

    from sequence_ai_ros.driver_node import PolicyDriver

    name = f"jitter-{int(hz)}"
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    ex = MultiThreadedExecutor(num_threads=6, context=ctx)
    nodes = [FakeRobot(ctx)]
    params = [p for p in driver_params(gw) if p.name != "model"] + [
        rclpy.parameter.Parameter(k, value=v) for k, v in dict(model=name, **extra_params).items()]
    nodes.append(PolicyDriver(context=ctx, parameter_overrides=params))
    nodes.append(rclpy.create_node("bench_client", context=ctx))
    for n in nodes:
        ex.add_node(n)
    spin = threading.Thread(target=ex.spin, daemon=True)
    spin.start()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    driver = nodes[1]
    try:
        client = ActionClient(nodes[2], Act_type(), "policy_driver/act")
        assert client.wait_for_server(timeout_sec=20.0)
        wait(driver.assembler.ready, 20.0, "sensors")
        if warmup_s > 0:
            Goal(client, max_seconds=warmup_s).wait_result(timeout=warmup_s + 30)
        floor = floor_process(hz, seconds)
        res = Goal(client, max_seconds=seconds).wait_result(timeout=seconds + 30).result
        floor_err = floor_errors(floor, hz)
        t = np.array([c[0] for c in driver.trace.commands])
        late = int(driver.goals.last_outcome.late_ticks) if driver.goals.last_outcome is not None else 0
        regrids = int(driver._gate.regrids)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
        driver.policy.interrupt()
        ex.shutdown(timeout_sec=10.0)
        spin.join(timeout=10.0)
        for n in nodes:
            n.destroy_node()
        rclpy.shutdown(context=ctx)
    return {"err_ms": np.abs(np.diff(t) - 1.0 / hz) * 1000.0, "underruns": int(res.underruns),
            "late": late, "regrids": regrids, "actions": int(res.actions), "floor_ms": floor_err}


def Act_type():
    """The Act action class (imported late: it needs the built sequence_ai_msgs on the path)."""
    from sequence_ai_msgs.action import Act

    return Act


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each measured goal (s)")
    ap.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured warm-up goal before each case (s); 0 = none")
    ap.add_argument("--chunk-s", type=float, default=1.0, help="length of each action chunk the policy returns (s)")
    ap.add_argument("--runs", type=int, default=1, help="runs of every case; medians over runs are printed")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="sys.setswitchinterval for this (the driver's) process, ms; default: driver main()'s choice")
    ap.add_argument("--publish-delay-ms", type=float, default=None,
                    help="the driver's publish_delay_ms parameter; default: the parameter's default")
    ap.add_argument("--realtime-priority", type=int, default=None,
                    help="the driver's realtime_priority parameter (SCHED_FIFO 1-99, 0 = off); default: the parameter's")
    ap.add_argument("--publish-gil-lead-ms", type=float, default=None,
                    help="the driver's publish_gil_lead_ms parameter (0 = off); default: the parameter's")
    ap.add_argument("--rates", type=float, nargs="+", default=[15.0, 100.0], help="control rates to test (Hz)")
    args = ap.parse_args()
    from _servers import GatewayProcess
    from _ros_driver_support import KEY_ENV

    from sequence_ai_ros import driver_node

    interval = (args.switch_interval_ms / 1000.0 if args.switch_interval_ms is not None
                else driver_node.GIL_SWITCH_INTERVAL_S)
    sys.setswitchinterval(interval)
    extra = {} if args.publish_delay_ms is None else {"publish_delay_ms": float(args.publish_delay_ms)}
    if args.realtime_priority is not None:
        extra["realtime_priority"] = int(args.realtime_priority)
    if args.publish_gil_lead_ms is not None:
        extra["publish_gil_lead_ms"] = float(args.publish_gil_lead_ms)
    print(f"switch interval {sys.getswitchinterval() * 1000:.2f} ms, "
          f"publish_delay_ms {extra.get('publish_delay_ms', 'default')}, "
          f"realtime_priority {extra.get('realtime_priority', 'default')}, "
          f"publish_gil_lead_ms {extra.get('publish_gil_lead_ms', 'default')}, chunk {args.chunk_s:g} s, "
          f"{args.seconds:g} s measured after a {args.warmup_s:g} s warm-up goal, {args.runs} run(s), "
          f"{os.cpu_count()} cores, load average %.2f %.2f %.2f" % os.getloadavg(), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        gw = GatewayProcess.start(Path(tmp))
        os.environ[KEY_ENV] = gw.api_key
        try:
            for hz in args.rates:
                f = Path(tmp) / f"jitter_{int(hz)}.py"
                f.write_text(POLICY.format(hz=hz, n=int(hz), rows=max(1, int(round(hz * args.chunk_s)))))
                dep = gw.deploy(str(f), name=f"jitter-{int(hz)}")
                assert dep["status"] == "ready", dep
            head = (f"{'rate':>6} {'load':>7} {'run':>4} {'periods':>8} {'p50 ms':>8} {'p99 ms':>8} "
                    f"{'max ms':>8} {'underruns':>9} {'late':>5} {'regrids':>7} {'floor p50':>9} {'floor p99':>9}")
            print(head, flush=True)
            summary = []
            for hz in args.rates:
                for loaded in (False, True):
                    rows = []
                    for r in range(args.runs):
                        out = run_case(gw, hz, args.seconds, loaded, args.warmup_s, extra)
                        err = out["err_ms"]
                        row = (np.percentile(err, 50), np.percentile(err, 99), err.max())
                        fl = out["floor_ms"]
                        rows.append(row + (out["underruns"], out["late"], out["regrids"],
                                           np.percentile(fl, 50), np.percentile(fl, 99)))
                        print(f"{hz:>5.0f}Hz {'loaded' if loaded else 'idle':>7} {r + 1:>4d} {len(err):>8d} "
                              f"{row[0]:>8.3f} {row[1]:>8.3f} {row[2]:>8.3f} {out['underruns']:>9d} "
                              f"{out['late']:>5d} {out['regrids']:>7d} {rows[-1][6]:>9.3f} {rows[-1][7]:>9.3f}",
                              flush=True)
                    summary.append((hz, loaded, rows))
            if args.runs > 1:
                print(f"medians over {args.runs} runs:")
                print(f"{'rate':>6} {'load':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'underruns':>9} "
                      f"{'late':>5} {'regrids':>7} {'floor p50':>9} {'floor p99':>9}")
                for hz, loaded, rows in summary:
                    med = [statistics.median(col) for col in zip(*rows)]
                    print(f"{hz:>5.0f}Hz {'loaded' if loaded else 'idle':>7} {med[0]:>8.3f} {med[1]:>8.3f} "
                          f"{med[2]:>8.3f} {med[3]:>9g} {med[4]:>5g} {med[5]:>7g} {med[6]:>9.3f} {med[7]:>9.3f}",
                          flush=True)
        finally:
            gw.close()
    print("load average (1/5/15 min) at the end: %.2f %.2f %.2f" % os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
