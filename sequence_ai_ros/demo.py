"""The main job, end to end: deploy a policy locally and drive the simulated Franka with it.

``python -m sequence_ai_ros.demo [--instruction TEXT] [--seed N] [--policy closed-form|learned]
[--light-jitter 0..1] [--max-seconds S]`` (the README's first command wraps it with the install
step). What runs, each as the real thing:

1. ``seq serve`` -- the local gateway, on 127.0.0.1 (a process);
2. ``seq deploy examples/pick_place/policy.py`` -- the demo policy's worker (a process); with
   ``--policy learned``, ``seq volume put pick-place-learned examples/flywheel/checkpoint`` then
   ``seq deploy examples/flywheel/learned_policy.py`` -- the trained net instead;
3. ``sim_robot`` -- the MuJoCo Panda cell as a ROS 2 robot (a process);
4. ``policy_driver`` -- our driver node (in this process), sent an ``Act`` goal through a real
   ROS 2 action client, as a VLM tool call would.

It prints the RunOutcome, whether the task succeeded (the sim's own check: cube within 3 cm of the
pad centre and at rest), and the path of a picture of the run (exterior-camera frames + the
commanded joints with chunk seams marked). ``launch/demo.launch.py`` starts the same nodes under
``ros2 launch`` on a real ROS 2 install. Ctrl-C or SIGTERM stops the goal (the driver holds) and
then every process it started.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx

REPO = Path(__file__).resolve().parent.parent
POLICY_FILE = REPO / "examples" / "pick_place" / "policy.py"
CONFIG_FILE = REPO / "config" / "panda_sim.yaml"
MODEL = "pick-place"
# The learned policy (examples/flywheel): its file, its deployment name, the volume it loads
# (weights="vol://pick-place-learned") and the checkpoint shipped with the example.
LEARNED_FILE = REPO / "examples" / "flywheel" / "learned_policy.py"
LEARNED_MODEL = "pick-place-learned"
LEARNED_VOLUME = "pick-place-learned"
LEARNED_CHECKPOINT = REPO / "examples" / "flywheel" / "checkpoint"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _terminate(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGINT ``proc`` (a ``seq serve`` stops its workers on it), wait up to ``timeout_s`` s, then
    SIGKILL it; a process that already exited is left alone."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Server:
    """A running local gateway (``seq serve``) with its data directory and API key."""

    url: str
    data_dir: Path
    api_key: str
    proc: subprocess.Popen

    def env(self) -> dict:
        return {**os.environ, "SEQUENCES_GATEWAY_URL": self.url, "SEQUENCES_API_KEY": self.api_key,
                "SEQUENCES_HOME": str(self.data_dir)}


@contextmanager
def local_server(data_dir: Path, startup_timeout_s: float = 60.0):
    """Start ``seq serve`` on a free loopback port; yield a :class:`Server`; stop it (and its workers)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = open(data_dir / "gateway.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data_dir)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "SEQUENCES_HOME": str(data_dir)},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"seq serve exited with {proc.returncode}; see {data_dir / 'gateway.log'}")
            try:
                if httpx.get(f"{url}/v1/models", timeout=1.0, trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"seq serve did not answer within {startup_timeout_s} s")
            time.sleep(0.1)
        key = (data_dir / "api_key").read_text().strip()
        yield Server(url=url, data_dir=data_dir, api_key=key, proc=proc)
    finally:
        _terminate(proc, timeout_s=15.0)
        log.close()


def deploy(server: Server, policy_file: Path = POLICY_FILE, name: str = MODEL, timeout_s: float = 300.0) -> None:
    """``seq deploy FILE --name NAME --wait``; raises ``RuntimeError`` with the CLI's output on failure."""
    out = subprocess.run(
        [sys.executable, "-m", "seq.cli", "deploy", str(policy_file), "--name", name, "--wait",
         "--timeout", str(timeout_s)],
        env=server.env(), capture_output=True, text=True, timeout=timeout_s + 30,
    )
    if out.returncode != 0:
        raise RuntimeError(f"seq deploy failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")


def put_volume(server: Server, name: str, directory: Path, timeout_s: float = 300.0) -> str:
    """``seq volume put NAME DIR``; returns the CLI's last line (``... vol://NAME@vN``); raises
    ``RuntimeError`` with the CLI's output on failure."""
    out = subprocess.run([sys.executable, "-m", "seq.cli", "volume", "put", name, str(directory)],
                         env=server.env(), capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"seq volume put failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
    lines = [x for x in out.stdout.splitlines() if x.startswith("uploaded ")]
    return lines[-1] if lines else out.stdout.strip()


def deploy_learned(server: Server, checkpoint_dir: Path = LEARNED_CHECKPOINT, name: str = LEARNED_MODEL) -> str:
    """Upload ``checkpoint_dir`` (holding ``policy.pt``) as the next version of the volume
    ``pick-place-learned`` and deploy the learned policy as ``name``; returns the volume line.
    Raises ``FileNotFoundError`` when there is no checkpoint, ``RuntimeError`` when a step fails."""
    if not (Path(checkpoint_dir) / "policy.pt").is_file():
        raise FileNotFoundError(f"no policy.pt in {checkpoint_dir}; train one with examples/flywheel/run_flywheel.py")
    line = put_volume(server, LEARNED_VOLUME, Path(checkpoint_dir))
    deploy(server, LEARNED_FILE, name)
    return line


@contextmanager
def sim_robot(seed: int, log_path: Path, namespace: str = "", light_jitter: float = 0.0):
    """Start the ``sim_robot`` node as its own process (the robot is not part of the driver)."""
    args = [sys.executable, "-m", "sequence_ai_ros.sim_node", "--ros-args", "--params-file", str(CONFIG_FILE),
            "-p", f"seed:={seed}", "-p", f"light_jitter:={float(light_jitter)}"]
    if namespace:
        args += ["-r", f"__ns:={namespace}"]
    log = open(log_path, "ab")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        _terminate(proc)
        log.close()


@dataclass
class DemoResult:
    """Everything one demo run produced."""

    instruction: str
    seed: int
    outcome: dict                 # the Act result fields (the RunOutcome)
    status: str                   # succeeded | canceled | aborted
    success: bool                 # the sim's task check
    distance_m: float             # cube-to-pad xy distance at the end (m)
    picture: Optional[Path]
    frames: list = field(default_factory=list, repr=False)       # (t_s, rgb) exterior frames
    commands: list = field(default_factory=list, repr=False)     # (t_s, [8]) published commands
    seams: list = field(default_factory=list, repr=False)        # index into commands per chunk
    hold_time: Optional[float] = None
    cancel_time: Optional[float] = None                          # monotonic s when cancel was sent
    received: list = field(default_factory=list, repr=False)     # (t_s, [8]) commands as a subscriber saw them


class _Recorder:
    """What an outside observer sees: exterior frames (every ``every_s``) and every command."""

    def __init__(self, node, image_topic: str, command_topic: str, every_s: float = 0.25):
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image
        from std_msgs.msg import Float64MultiArray

        from .observation import image_to_array

        self.frames: list = []
        self.commands: list = []
        self._every = every_s
        self._last = -1e9
        self.recording = False
        self._to_array = image_to_array
        node.create_subscription(Image, image_topic, self._on_image, qos_profile_sensor_data)
        node.create_subscription(Float64MultiArray, command_topic, self._on_command, 10)

    def _on_command(self, msg) -> None:
        self.commands.append((time.monotonic(), list(msg.data)))

    def _on_image(self, msg) -> None:
        now = time.monotonic()
        if self.recording and now - self._last >= self._every:
            self._last = now
            self.frames.append((now, self._to_array(msg)))


def drive(instruction: str, seed: int, max_seconds: float, out_dir: Path, *, cancel_after_s: Optional[float] = None,
          picture: bool = True, quiet: bool = False, model: str = MODEL, light_jitter: float = 0.0) -> DemoResult:
    """Run the sim + driver against an already-deployed model (``model``, default ``pick-place``);
    return the result.

    Needs ``SEQUENCES_GATEWAY_URL`` / ``SEQUENCES_API_KEY`` in the environment (``Server.env()``)
    and the ROS environment (``scripts/env.sh``). ``cancel_after_s`` cancels the goal that many
    seconds after it was accepted (the stop path).
    """
    from sequence_ai_msgs.action import Act
    from sequence_ai_msgs.srv import CheckSuccess

    from .driver_node import GIL_SWITCH_INTERVAL_S

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)   # as the driver node's own main() does
    out_dir.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    with ExitStack() as stack:
        sim_proc = stack.enter_context(sim_robot(seed, out_dir / "sim_robot.log", light_jitter=light_jitter))
        driver, client_node, recorder = _start_nodes(stack, model)
        act_client, check = _wait_ready(client_node, driver, sim_proc, out_dir)

        light = f", light_jitter {light_jitter:g}" if light_jitter else ""
        say(f"goal: {instruction!r} (policy {model}, seed {seed}{light}, max {max_seconds:.0f} s)")
        recorder.recording = True
        wrapped, cancel_time = _run_goal(act_client, Act.Goal(instruction=instruction, max_seconds=float(max_seconds)),
                                         max_seconds, cancel_after_s, say)
        time.sleep(1.0)  # anything published after the end would arrive in this window
        recorder.recording = False
        res = wrapped.result
        status = {4: "succeeded", 5: "canceled", 6: "aborted"}.get(wrapped.status, str(wrapped.status))
        outcome = {k: getattr(res, k) for k in (
            "reason", "actions", "chunks", "seconds", "underruns", "underrun_s", "max_seam_jump",
            "instruction_swaps", "max_instruction_lag_s", "action_space", "message", "obs_to_action_p50_s",
            "obs_to_action_p99_s")}
        fut = check.call_async(CheckSuccess.Request(instruction=instruction))
        _wait(fut, 30.0)
        verdict = fut.result()
        trace = driver.trace
        result = DemoResult(
            instruction=instruction, seed=seed, outcome=outcome, status=status,
            success=bool(verdict.success), distance_m=float(verdict.distance_m), picture=None,
            frames=list(recorder.frames), commands=list(trace.commands), seams=list(trace.seams),
            hold_time=trace.hold_time, cancel_time=cancel_time, received=list(recorder.commands),
        )
    if picture:
        from sequence_ai_sim.picture import render_run_picture

        result.picture = render_run_picture(result, out_dir / "run.png")
    return result


def _start_nodes(stack: ExitStack, model: str):
    """rclpy up, the policy driver (for ``model``) and a client node spinning on an executor;
    their teardown is pushed on ``stack``. Returns ``(driver, client_node, recorder)``."""
    import rclpy
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from rclpy.signals import SignalHandlerOptions

    from ._spin import NodeExecutor, stop_executor
    from .driver_node import PolicyDriver

    # Ctrl-C must reach us as KeyboardInterrupt (to cancel the goal and let the driver publish
    # its hold), not shut the ROS context down underneath the running driver.
    rclpy.init(args=["--ros-args", "--params-file", str(CONFIG_FILE)],
               signal_handler_options=SignalHandlerOptions.NO)
    stack.callback(lambda: rclpy.ok() and rclpy.shutdown())
    driver = PolicyDriver(parameter_overrides=[Parameter("model", value=model)])
    client_node = Node("demo_client")
    recorder = _Recorder(client_node, "camera/exterior_1/image_raw", "joint_commands")
    # one thread spins both nodes (the driver's goal runs on a thread of its own: NodeExecutor);
    # spin_until_set rides out a lifecycle transition destroying entities
    executor = NodeExecutor()
    executor.add_node(driver)
    executor.add_node(client_node)
    stop_spinning = threading.Event()
    spin = threading.Thread(target=executor.spin_until_set, args=(stop_spinning,), name="demo_spin", daemon=True)
    spin.start()
    client_node.demo_action_clients = []      # destroyed before their node (see _stop)

    def _stop():
        driver.policy.interrupt()
        # The spinning thread leaves its loop first; only then is the executor shut down.
        # Executor.shutdown() called while another thread is inside spin() does not wait for
        # it (this rclpy) and destroys the guard condition that thread's wait set holds, and
        # destroying a node the executor is still waiting on fails the same way (InvalidHandle:
        # "cannot use Destroyable because destruction was requested" at teardown).
        stop_spinning.set()
        executor.wake()
        spin.join(timeout=10)
        stop_executor(executor)     # callbacks still queued run before their nodes go (quiet teardown)
        for client in client_node.demo_action_clients:   # a node's destroy_node() leaves its action clients alive
            client.destroy()
        driver.destroy_node()
        client_node.destroy_node()

    stack.callback(_stop)
    return driver, client_node, recorder


def _wait_ready(client_node, driver, sim_proc: subprocess.Popen, out_dir: Path):
    """Wait for the driver's Act server, the sim's check_success service and the first sensor
    data; returns ``(act_client, check_client)``. Raises RuntimeError naming what did not come up."""
    from rclpy.action import ActionClient

    from sequence_ai_msgs.action import Act
    from sequence_ai_msgs.srv import CheckSuccess

    act_client = ActionClient(client_node, Act, "policy_driver/act")
    client_node.demo_action_clients.append(act_client)
    check = client_node.create_client(CheckSuccess, "sim_robot/check_success")
    if not act_client.wait_for_server(timeout_sec=30.0):
        raise RuntimeError("policy_driver/act action server did not appear within 30 s")
    deadline = time.monotonic() + 120.0
    while not check.wait_for_service(timeout_sec=0.5):
        if sim_proc.poll() is not None:       # it died starting: say so now, not after 120 s
            raise RuntimeError(f"sim_robot exited with {sim_proc.returncode} while starting; "
                               f"see {out_dir / 'sim_robot.log'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"sim_robot did not come up within 120 s; see {out_dir / 'sim_robot.log'}")
    if not driver.goals.wait_for_sensors():
        raise RuntimeError(f"no camera/joint data from sim_robot; see {out_dir / 'sim_robot.log'}")
    return act_client, check


def _run_goal(act_client, goal, max_seconds: float, cancel_after_s: Optional[float], say):
    """Send ``goal``, cancel it after ``cancel_after_s`` s if given, wait for its result (Ctrl-C
    cancels it and re-raises). Returns ``(wrapped result, monotonic time of the cancel or None)``."""
    send = act_client.send_goal_async(goal)
    _wait(send, 30.0)
    handle = send.result()
    if not handle.accepted:
        raise RuntimeError("the Act goal was rejected")
    result_future = handle.get_result_async()
    cancel_time = None
    try:
        if cancel_after_s is not None:
            time.sleep(cancel_after_s)
            cancel_time = time.monotonic()
            _wait(handle.cancel_goal_async(), 10.0)
        _wait(result_future, max_seconds + 120.0)
    except KeyboardInterrupt:
        say("\nCtrl-C: cancelling the goal; the driver publishes a hold and stops")
        handle.cancel_goal_async()
        try:
            _wait(result_future, 5.0)
        except TimeoutError:
            say("the driver did not confirm the cancel within 5 s")
        raise
    return result_future.result(), cancel_time


def _wait(future, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer within {timeout_s} s")
        time.sleep(0.01)


def exit_on_sigterm() -> None:
    """Make SIGTERM (``kill``, ``timeout``, a service stop) raise ``SystemExit(143)`` in the main
    thread, so ``with`` blocks unwind: the gateway, its workers and the sim are stopped, not
    orphaned (Python's default for SIGTERM ends the process without running them)."""
    def _exit(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)     # a second SIGTERM must not cut the unwinding short
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def main(argv=None) -> int:
    exit_on_sigterm()
    parser = argparse.ArgumentParser(
        prog="sequence-ai-demo",
        description="Deploy the pick-and-place demo policy locally and drive the simulated Franka with it over ROS 2.",
    )
    parser.add_argument("--instruction", default="put the red cube on the green pad",
                        help="'put the <red|green|blue> cube on the <red|green|blue> pad' (the learned policy "
                             "knows exactly these six pairings; the closed-form one reads any text naming two colours)")
    parser.add_argument("--seed", type=int, default=0,
                        help="scene seed: cube and pad placement (and the light, with --light-jitter)")
    parser.add_argument("--max-seconds", type=float, default=45.0, help="time bound of the Act goal (s)")
    parser.add_argument("--out", type=Path, default=REPO / "runs", help="where run folders are written")
    parser.add_argument("--policy", choices=["closed-form", "learned"], default="closed-form",
                        help="closed-form: examples/pick_place/policy.py (colour segmentation + IK); learned: the "
                             "visuomotor net trained by examples/flywheel, its shipped checkpoint uploaded as a volume")
    parser.add_argument("--light-jitter", type=float, default=0.0,
                        help="0 = the fixed light; up to 1 draws the light from the seed (as the pick-place benchmark does)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.light_jitter <= 1.0:
        parser.error(f"--light-jitter takes a number in [0, 1], got {args.light_jitter}")
    if args.seed < 0:
        parser.error(f"--seed takes a non-negative integer, got {args.seed}")
    from sequence_ai.extras import unavailable
    missing = args.policy == "learned" and unavailable("torch", "sequence-ai-demo --policy learned", "train")
    if missing:     # the learned policy's worker imports torch (the train extra): say so before deploying it
        if (REPO / "scripts" / "env.sh").is_file():     # run from a checkout: into its own venv
            missing += f" (in this checkout: cd {REPO} && . scripts/env.sh && pip install -e '.[train]')"
        print(missing, file=sys.stderr)
        return 1
    run_dir = args.out / time.strftime("%Y%m%d-%H%M%S")
    t0 = time.monotonic()
    try:
        with local_server(run_dir / "server") as server:
            print(f"gateway   {server.url} (data {server.data_dir})", flush=True)
            if args.policy == "learned":
                line = deploy_learned(server)
                m = re.match(r"uploaded (\S+) v(\d+): (\d+) files, (\d+) bytes", line)
                weights = (f"weights: volume {m.group(1)} v{m.group(2)}, {m.group(3)} files, "
                           f"{int(m.group(4)) / 1e6:.1f} MB" if m else line.strip())
                model, source = LEARNED_MODEL, f"{LEARNED_FILE.relative_to(REPO)} ({weights})"
            else:
                deploy(server)
                model, source = MODEL, str(POLICY_FILE.relative_to(REPO))
            print(f"deployed  {model} from {source} ({time.monotonic() - t0:.1f} s)", flush=True)
            os.environ.update(server.env())
            result = drive(args.instruction, args.seed, args.max_seconds, run_dir, model=model,
                           light_jitter=args.light_jitter)
    except KeyboardInterrupt:
        print("stopped (Ctrl-C); the server, the sim and the driver have been shut down", file=sys.stderr)
        return 130
    except (RuntimeError, FileNotFoundError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    o = result.outcome
    print()
    print(f"RunOutcome(reason={o['reason']}, actions={o['actions']}, chunks={o['chunks']}, "
          f"seconds={o['seconds']:.2f}, underruns={o['underruns']}, max_seam_jump={o['max_seam_jump']:.4f})")
    if o.get("message"):
        print(f"message   {o['message']}")
    if o["reason"] == "error":
        print("task      not attempted: the run ended with an error (see message)")
    else:
        print(f"task      {'SUCCESS' if result.success else 'FAILED'}: "
              f"cube {result.distance_m * 100:.1f} cm from the pad centre")
    print(f"picture   {result.picture}")
    print(f"total     {time.monotonic() - t0:.1f} s")
    (run_dir / "result.json").write_text(json.dumps(
        {"instruction": result.instruction, "seed": result.seed, "outcome": o, "status": result.status,
         "success": result.success, "distance_m": result.distance_m, "picture": str(result.picture)}, indent=2))
    return 0 if result.success and o["reason"] in ("completed", "until") else 1


if __name__ == "__main__":
    sys.exit(main())
