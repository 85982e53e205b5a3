"""/act on the robot's hot path, side by side with openpi's websocket server and a naive server.

One run, interleaved rounds, every client and server in its own process, the same trivial
policy (a 16x8 chunk of zeros) behind each, one observation = 2 x 224x224 RGB frames + 8 floats +
an instruction:

* ours, sync    -- ``sequence_ai.observation()`` (JPEG q95 encode, timed) + /act over the channel
  to a real worker process the way the sync ``Policy.predict`` sends it in a session's steady
  state: a blocking channel on the calling thread (``WorkerLink.act_blocking``), which for a
  worker on a loopback address moves from its websocket to the worker's same-host door (a Unix
  socket; over ``--link`` it stays on the websocket);
* ours, ws      -- the same kept on the websocket (``WS /act/ws``; ``SEQ_CLIENT_DOOR=0``): a robot
  on another machine, without the network;
* ours, channel -- the same through the asyncio wire (``AsyncPolicy.predict``, and ``run()``),
  which for a worker on a loopback address moves to the same-host door too;
* ours, channel-ws -- the same kept on its websocket (``SEQ_CLIENT_DOOR=0``);
* ours, http    -- the same over ``POST /act`` (binary body; httptools + uvloop on the worker);
* ours, shm     -- the same-host path: ``observation(codec="raw")`` (no codec: the raw pixels at
  the declared size) over the blocking channel with ``body_format="shm"`` (the frames through a
  shared-memory segment, not the socket); loopback only (it needs the worker on this machine);
* openpi-ours   -- the real ``openpi_client.WebsocketClientPolicy`` (raw frames, msgpack-numpy;
  ``api_key=`` the worker secret) against our worker's openpi-compatible endpoint (``/``);
* openpi        -- the same client against openpi's own ``WebsocketPolicyServer``
  (``../shared/peers/openpi/``); both openpi clients run in the openpi-client side venv
  (``.venv/sides/openpi-client``, made by scripts/bootstrap.sh);
* naive         -- FastAPI + uvicorn defaults, base64 JPEG in JSON, httpx client.

Printed per frame kind (smooth: a gradient scene; noisy: uniform noise): p50 / p99 latency per
request including the client's encode (ms), bytes sent per request on the socket (ours-shm: the
JSON and the segment's name; its frames go through shared memory), client and server CPU per
request (ms; process CPU time, server from /proc), and ratios against openpi. With ``--link`` the
same again over a constrained link: two network namespaces joined by a veth pair with
``tc tbf rate 100mbit`` on both ends and 2 ms added each way by a user-space delay proxy (this
kernel has no netem); it needs root (``ip netns``).

    python bench/bench_wire.py                   # loopback, 8 rounds x 40 requests per client
    python bench/bench_wire.py --link            # loopback, then the 100 Mbit/s + 2 ms link
    python bench/bench_wire.py --clients openpi-ours --kinds smooth   # some rows (openpi always runs)

The machine's load average is printed before and after each table: on a shared machine compare
the ratios of one run (the rounds interleave every client), not figures from different runs.

The worker inherits this process's environment: ``SEQ_WORKER_INLINE=1`` runs it with inline serving
(opt-in; docs/design.md).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIDE_PY = ROOT / ".venv" / "sides" / "openpi-client" / "bin" / "python"
OPENPI_DIR = ROOT.parent / "shared" / "peers" / "openpi"
CLIENTS = ("ours-sync", "ours-ws", "ours-channel", "ours-channel-ws", "ours-http", "ours-shm", "openpi-ours", "openpi", "naive")

POLICY = '''
import numpy as np
import seq

@seq.policy(action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=8,
                                      control_frequency_hz=15.0),
            observation=seq.ObservationContract(cameras={"exterior": seq.Camera(224, 224), "wrist": seq.Camera(224, 224)},
                                                proprio={"joint_positions": 7, "gripper": 1}))
class Trivial(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs):
        return seq.ActionChunk(np.zeros((16, 8), np.float32))
'''

OPENPI_SERVER = '''
import sys, numpy as np
sys.path.insert(0, sys.argv[1])
from websocket_policy_server import WebsocketPolicyServer
class Trivial:
    def infer(self, obs):
        return {"actions": np.zeros((16, 8), np.float32)}
WebsocketPolicyServer(Trivial(), host=sys.argv[2], port=int(sys.argv[3])).serve_forever()
'''

NAIVE_SERVER = '''
import base64, sys, numpy as np, simplejpeg, uvicorn
from fastapi import FastAPI
app = FastAPI()
@app.post("/infer")
def infer(body: dict):
    frames = [simplejpeg.decode_jpeg(base64.b64decode(f)) for f in body["images"].values()]
    return {"actions": np.zeros((16, 8)).tolist()}
uvicorn.run(app, host=sys.argv[1], port=int(sys.argv[2]), log_level="warning")
'''

# A client agent: reads "run N KIND" lines, answers one JSON line per block.
AGENT = r'''
import json, sys, time
import numpy as np
kind_of, target, extra = sys.argv[1], sys.argv[2], sys.argv[3:]

def frames(kind):
    if kind == "noisy":
        rng = np.random.default_rng(0)
        return [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(2)]
    y, x = np.mgrid[0:224, 0:224]
    base = np.stack([x, y, (x + y) // 2], -1).astype(np.uint8)
    other = base.copy(); other[60:120, 80:160] = (200, 40, 40)
    return [base, other]

STATE = [0.1 * i for i in range(7)]
if kind_of.startswith("ours"):
    import asyncio, sequence_ai
    from sequence_ai_core._wire import Session, WorkerLink
    wire = WorkerLink("http://127.0.0.1:9", "unused", "bench", body_format="shm" if kind_of == "ours-shm" else "binary",
                transport="http" if kind_of == "ours-http" else "channel")
    codec = "raw" if kind_of == "ours-shm" else "jpeg"
    wire.session = Session(session_id=None, worker_url=target, direct_secret=extra[0])
    contract = json.loads(extra[1])
    loop = asyncio.new_event_loop()
    def one(imgs):
        obs = sequence_ai.observation(images={"exterior": imgs[0], "wrist": imgs[1]}, joints=STATE, gripper=[0.5],
                                      instruction="put the red cube on the green pad", contract=contract, codec=codec)
        if kind_of in ("ours-sync", "ours-ws", "ours-shm"):
            pred = wire.act_blocking(obs.to_wire(raw=True), loop.run_until_complete)
        else:
            pred = loop.run_until_complete(wire.act(obs.to_wire(raw=True)))
        assert len(pred.action_chunk) == 16
        if kind_of == "ours-shm":     # the frames went through the segment: the socket carried the rest
            return wire.last_request_bytes - sum(len(img.data) for img in obs.images) + 42
        return wire.last_request_bytes
elif kind_of.startswith("openpi"):
    from openpi_client import msgpack_numpy, websocket_client_policy
    host, port = target.split(":")
    policy = websocket_client_policy.WebsocketClientPolicy(host, int(port), api_key=extra[0] if extra else None)
    def one(imgs):
        obs = {"observation/exterior": imgs[0], "observation/wrist": imgs[1], "observation/state": np.array(STATE + [0.5]),
               "prompt": "put the red cube on the green pad"}
        out = policy.infer(obs)
        assert out["actions"].shape == (16, 8)
        return len(msgpack_numpy.packb(obs))
else:
    import base64, httpx, simplejpeg
    client = httpx.Client(base_url=target, trust_env=False)
    def one(imgs):
        body = {"images": {v: base64.b64encode(simplejpeg.encode_jpeg(f, quality=95)).decode()
                           for v, f in zip(("exterior", "wrist"), imgs)},
                "state": STATE + [0.5], "prompt": "put the red cube on the green pad"}
        r = client.post("/infer", json=body)
        assert r.status_code == 200 and len(r.json()["actions"]) == 16
        return len(r.request.content)

cache = {}
print("ready", flush=True)
for line in sys.stdin:
    _, n, kind = line.split()
    imgs = cache.setdefault(kind, frames(kind))
    one(imgs)                                              # warm
    lat, sent = [], 0
    cpu0 = time.process_time()
    for _ in range(int(n)):
        t0 = time.perf_counter()
        sent += one(imgs)
        lat.append(time.perf_counter() - t0)
    print(json.dumps({"lat": lat, "cpu": time.process_time() - cpu0, "bytes": sent / int(n)}), flush=True)
'''

PROXY = r'''
import asyncio, sys
listen_host, listen_port, target_port, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]) / 1000
async def pipe(reader, writer):
    loop = asyncio.get_running_loop()
    try:
        while data := await reader.read(1 << 16):
            loop.call_later(delay, writer.write, data)     # order kept: same delay for every piece
    finally:
        loop.call_later(delay, writer.close)
async def handle(cr, cw):
    sr, sw = await asyncio.open_connection("127.0.0.1", target_port)
    import socket
    for w in (cw, sw):
        w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    await asyncio.gather(pipe(cr, sw), pipe(sr, cw))
async def main():
    server = await asyncio.start_server(handle, listen_host, listen_port)
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid: int) -> float:
    """User + system CPU of process ``pid`` (all threads), in seconds, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port: int, timeout: float = 60.0, ns: list[str] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        probe = subprocess.run([*ns, sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), 1)"],
                               capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port}")


class Bench:
    """The servers, agents and (with --link) proxies of one run; ``ns_srv``/``ns_cli`` prefix commands."""

    def __init__(self, tmp: Path, ns_srv: list[str], ns_cli: list[str], host: str) -> None:
        self.tmp, self.ns_srv, self.ns_cli, self.host = tmp, ns_srv, ns_cli, host
        self.procs: list[subprocess.Popen] = []
        self.server_pid: dict[str, int] = {}
        self.agents: dict[str, subprocess.Popen] = {}

    def spawn(self, cmd: list[str], ns: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen([*ns, *cmd], **kw)
        self.procs.append(proc)
        return proc

    def expose(self, port: int) -> int:
        """The port clients use for a server on ``port``: itself, or a 2 ms delay proxy's."""
        if not self.ns_srv:
            return port
        outer = free_port()
        proxy = self.spawn([sys.executable, "-c", PROXY, self.host, str(outer), str(port), "2"], self.ns_srv,
                           stdout=subprocess.PIPE, text=True)
        assert proxy.stdout.readline().strip() == "ready"
        return outer

    def start_servers(self) -> tuple[str, str, str, str, dict]:
        policy = self.tmp / "trivial_policy.py"
        policy.write_text(POLICY)
        secret = secrets.token_urlsafe(16)
        ready = self.tmp / "worker.ready.json"
        env = {**os.environ, "SEQ_WORKER_SECRET": secret}
        worker = self.spawn([sys.executable, "-m", "sequence_ai_server.worker", "--file", str(policy), "--port", "0",
                             "--ready-file", str(ready), "--name", "bench", "--weights-dir", str(self.tmp / "w")],
                            self.ns_srv, env=env, stdout=open(self.tmp / "worker.log", "wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not ready.exists():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("worker did not start: " + (self.tmp / "worker.log").read_text()[-2000:])
            time.sleep(0.1)
        info = json.loads(ready.read_text())
        for name in ("ours-sync", "ours-ws", "ours-channel", "ours-channel-ws", "ours-http", "ours-shm", "openpi-ours"):
            self.server_pid[name] = worker.pid if not self.ns_srv else info["pid"]
        op_port, nv_port = free_port(), free_port()
        openpi = self.spawn([str(SIDE_PY), "-c", OPENPI_SERVER, str(OPENPI_DIR), "127.0.0.1", str(op_port)], self.ns_srv,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        naive = self.spawn([sys.executable, "-c", NAIVE_SERVER, "127.0.0.1", str(nv_port)], self.ns_srv,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in (op_port, nv_port):
            wait_port(port, ns=self.ns_srv)
        self.server_pid["openpi"], self.server_pid["naive"] = _inner_pid(openpi, self.ns_srv), _inner_pid(naive, self.ns_srv)
        worker_url = f"http://{self.host}:{self.expose(info['port'])}"
        return (worker_url, secret, f"{self.host}:{self.expose(op_port)}", f"http://{self.host}:{self.expose(nv_port)}",
                info["spec"]["contract"])

    def start_agents(self, clients: tuple[str, ...] = CLIENTS) -> None:
        worker_url, secret, openpi, naive, contract = self.start_servers()
        plans = {"ours-sync": ([sys.executable], [worker_url, secret, json.dumps(contract)]),
                 "ours-ws": ([sys.executable], [worker_url, secret, json.dumps(contract)]),
                 "ours-shm": ([sys.executable], [worker_url, secret, json.dumps(contract)]),
                 "ours-channel": ([sys.executable], [worker_url, secret, json.dumps(contract)]),
                 "ours-channel-ws": ([sys.executable], [worker_url, secret, json.dumps(contract)]),
                 "ours-http": ([sys.executable], [worker_url, secret, json.dumps(contract)]),
                 "openpi-ours": ([str(SIDE_PY)], [worker_url.split("//", 1)[1], secret]),
                 "openpi": ([str(SIDE_PY)], [openpi]), "naive": ([sys.executable], [naive])}
        for name, (py, args) in plans.items():
            if name not in clients:
                continue
            env = {**os.environ, "PYTHONPATH": str(ROOT), **({"SEQ_CLIENT_DOOR": "0"} if name in ("ours-ws", "ours-channel-ws") else {})}
            agent = self.spawn([*py, "-c", AGENT, name, *args], self.ns_cli, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
            line = agent.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"client {name} did not start")
            self.agents[name] = agent

    def block(self, name: str, n: int, kind: str) -> dict:
        agent, pid = self.agents[name], self.server_pid[name]
        before = cpu_s(pid)
        agent.stdin.write(f"run {n} {kind}\n")
        agent.stdin.flush()
        out = json.loads(agent.stdout.readline())
        out["server_cpu"] = cpu_s(pid) - before
        return out

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _inner_pid(proc: subprocess.Popen, ns: list[str]) -> int:
    """``ip netns exec`` execs the command, so the pid is the server's own either way."""
    return proc.pid


def measure(bench: Bench, rounds: int, per_round: int, kinds: tuple[str, ...],
            clients: tuple[str, ...] = CLIENTS) -> dict:
    """Interleaved: each round runs one block per (kind, client), in a rotating order."""
    results = {(k, c): {"lat": [], "cpu": 0.0, "server_cpu": 0.0, "bytes": 0.0, "n": 0} for k in kinds for c in clients}
    for r in range(rounds):
        order = clients[r % len(clients):] + clients[:r % len(clients)]
        for kind in kinds:
            for name in order:
                out = bench.block(name, per_round, kind)
                acc = results[(kind, name)]
                acc["lat"] += out["lat"]
                acc["cpu"] += out["cpu"]
                acc["server_cpu"] += out["server_cpu"]
                acc["bytes"] = out["bytes"]
                acc["n"] += per_round
    return results


def report(title: str, results: dict, kinds: tuple[str, ...], clients: tuple[str, ...] = CLIENTS) -> None:
    print(f"\n{title}")
    print(f"{'frames':7} {'client':15} {'p50 ms':>7} {'p99 ms':>7} {'bytes up':>9} {'cli CPU ms':>10} "
          f"{'srv CPU ms':>10} {'p50/openpi':>10} {'bytes/openpi':>12}")
    for kind in kinds:
        ref = results[(kind, "openpi")]
        ref_p50 = statistics.median(ref["lat"])
        for name in clients:
            acc = results[(kind, name)]
            lat = sorted(acc["lat"])
            p50, p99 = statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            print(f"{kind:7} {name:15} {p50 * 1e3:7.2f} {p99 * 1e3:7.2f} {acc['bytes'] / 1e3:8.1f}k "
                  f"{acc['cpu'] / acc['n'] * 1e3:10.2f} {acc['server_cpu'] / acc['n'] * 1e3:10.2f} "
                  f"{p50 / ref_p50:10.2f} {acc['bytes'] / ref['bytes']:12.3f}")


NS_SRV, NS_CLI = "seqbench_srv", "seqbench_cli"


def make_link() -> None:
    """Two namespaces joined by a veth pair, tbf 100mbit on both ends (root)."""
    cmds = [f"ip netns add {NS_SRV}", f"ip netns add {NS_CLI}",
            f"ip link add sqb_s type veth peer name sqb_c",
            f"ip link set sqb_s netns {NS_SRV}", f"ip link set sqb_c netns {NS_CLI}",
            f"ip -n {NS_SRV} addr add 10.77.0.1/24 dev sqb_s", f"ip -n {NS_CLI} addr add 10.77.0.2/24 dev sqb_c",
            f"ip -n {NS_SRV} link set sqb_s up", f"ip -n {NS_CLI} link set sqb_c up",
            f"ip -n {NS_SRV} link set lo up", f"ip -n {NS_CLI} link set lo up",
            f"ip netns exec {NS_SRV} tc qdisc add dev sqb_s root tbf rate 100mbit burst 32kbit latency 50ms",
            f"ip netns exec {NS_CLI} tc qdisc add dev sqb_c root tbf rate 100mbit burst 32kbit latency 50ms"]
    for cmd in cmds:
        subprocess.run(cmd.split(), check=True)


def drop_link() -> None:
    for ns in (NS_SRV, NS_CLI):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run(rounds: int, per_round: int, kinds: tuple[str, ...], link: bool, clients: tuple[str, ...] = CLIENTS) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_wire_"))
    ns_srv = ["ip", "netns", "exec", NS_SRV] if link else []
    ns_cli = ["ip", "netns", "exec", NS_CLI] if link else []
    bench = Bench(tmp, ns_srv, ns_cli, "10.77.0.1" if link else "127.0.0.1")
    try:
        bench.start_agents(clients)
        load0 = os.getloadavg()[0]
        results = measure(bench, rounds, per_round, kinds, clients)
        load1 = os.getloadavg()[0]
    finally:
        bench.close()
        shutil.rmtree(tmp, ignore_errors=True)
    title = ("100 Mbit/s (tbf) + 2 ms each way (proxy), namespaces + veth" if link else "loopback")
    title += f" (load {load0:.1f} -> {load1:.1f})"
    report(f"{title}: {rounds} interleaved rounds x {per_round} requests per client and frame kind", results, kinds,
           clients)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=40)
    parser.add_argument("--kinds", default="smooth,noisy")
    parser.add_argument("--link", action="store_true", help="also over the 100 Mbit/s + 2 ms link (root)")
    parser.add_argument("--clients", default=",".join(CLIENTS),
                        help=f"the rows to run (comma-separated, openpi always runs: the ratios' reference); {', '.join(CLIENTS)}")
    args = parser.parse_args()
    wanted = set(args.clients.split(",")) | {"openpi"}
    if wanted - set(CLIENTS):
        parser.error(f"unknown clients {sorted(wanted - set(CLIENTS))}")
    clients = tuple(c for c in CLIENTS if c in wanted)
    if not SIDE_PY.exists():
        sys.exit(f"{SIDE_PY} is missing: run scripts/bootstrap.sh (it makes the openpi-client side venv)")
    kinds = tuple(args.kinds.split(","))
    print(f"bench_wire: python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    run(args.rounds, args.per_round, kinds, link=False, clients=clients)
    if args.link:
        drop_link()
        try:
            make_link()
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            sys.exit(f"the link needs root and `ip netns` / `tc`: {exc}")
        try:
            run(max(2, args.rounds // 2), max(10, args.per_round // 2), kinds, link=True,
                clients=tuple(c for c in clients if c != "ours-shm"))     # the same-host path is no network path
        finally:
            drop_link()


if __name__ == "__main__":
    main()
