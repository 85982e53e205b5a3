"""Cards: which worker holds which card, and each local worker pinned to its own.

In-process: the card pool (ops/cards.py) over a fake inventory of four cards of two types --
pinning, no sharing across deployments, sharing within one, memory= sharing, fallback lists,
the refusal reasons, release on exit, claims kept across a restart -- plus the fake inventory
(SEQ_FAKE_GPUS), NVML through a stand-in binding, and the launch spec's card environment.

One real-process test: a gateway started with ``SEQ_FAKE_GPUS`` deploys policies with
``gpu="L4"``; each worker process sees ``CUDA_VISIBLE_DEVICES`` of its own card (the policy
writes its environment from ``load``), ``GET /v1/gpus`` and ``seq gpus`` name it as the holder,
a third L4 deployment is refused naming what holds the cards (and starts on a connect once a card
is free), a rolling deploy shares its own deployment's card, and a stopped worker's card is free.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from _servers import gateway_on_data_dir, GatewayProcess, _env, seq_cli
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.launchers.base import WorkerLaunchSpec
from sequence_ai_server.ops.cards import CardPins, CardPool, CardRefused, declared_memory_mib, requested_cards
from sequence_ai_server.ops.gpus import fake_cards, gpu_refusal, inventory

FOUR = "L4,L4,H100,H100"


class Proc:
    """A stand-in worker handle: running until ``exit()``."""

    def __init__(self, pid: int = 0):
        self.pid, self.code = pid, None

    def poll(self):
        return self.code

    def exit(self, code: int = 0):
        self.code = code


def pool(tmp_path=None) -> CardPool:
    return CardPool(fake_cards(FOUR), None if tmp_path is None else tmp_path / "cards.json")


# ------------------------------------------------------------------ the inventory

def test_fake_inventory_numbers_the_named_cards_and_refuses_a_bad_entry():
    inv = inventory(fake="L4, L4,H100=94")
    assert inv["source"] == "fake" and inv["types"] == {"L4": 2, "H100": 1} and inv["error"] is None
    assert [(c["index"], c["type"], c["memory_mib"]) for c in inv["cards"]] == [(0, "L4", 24 * 1024), (1, "L4", 24 * 1024),
                                                                               (2, "H100", 94 * 1024)]
    assert fake_cards(["NVIDIA A100-SXM4-80GB", "Mystery"])[1]["memory_mib"] is None
    assert fake_cards(["NVIDIA A100-SXM4-80GB"])[0]["type"] == "A100"
    with pytest.raises(ValueError, match="names no card"):
        fake_cards("L4,,H100")
    with pytest.raises(ValueError, match="memory after '=' must be a number"):
        fake_cards("L4=lots")
    cfg = ServerConfig.from_env(environ={"SEQ_FAKE_GPUS": "L4,H100=80"})
    assert cfg.fake_gpus == ("L4", "H100=80") and ServerConfig.from_env(environ={}).fake_gpus is None
    with pytest.raises(ValueError, match="SEQ_FAKE_GPUS=.*entry '' is not a card name"):
        ServerConfig.from_env(environ={"SEQ_FAKE_GPUS": "L4,"})


@pytest.mark.parametrize("entry", ["L4=inf", "L4=1e400", "L4=nan", "cpu", "L4:2", "\u2603", "L4=5000"])
def test_a_fake_card_that_is_no_card_or_has_no_finite_memory_is_refused_by_name(entry):
    with pytest.raises(ValueError, match="SEQ_FAKE_GPUS entry") as err:
        fake_cards(entry)
    assert "e.g." in str(err.value)


def test_a_gateway_given_a_bad_fake_card_exits_2_naming_it_and_makes_no_data_dir(tmp_path):
    """The setting is read in full before the data dir gets a key or a store: one line on stderr,
    no traceback, exit status 2."""
    data = tmp_path / "data"
    env = {**_env(), "SEQ_FAKE_GPUS": "L4=inf"}
    done = subprocess.run([sys.executable, "-m", "sequence_ai_server.gateway", "--port", "0", "--data-dir", str(data)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "SEQ_FAKE_GPUS entry 'L4=inf'" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not data.exists()


def test_nvml_is_read_first_and_a_machine_without_a_driver_is_a_cpu_box(monkeypatch):
    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def nvml(count=2, fail=None):
        def init():
            if fail:
                raise fail
        return SimpleNamespace(
            NVMLError=NVMLError, nvmlInit=init, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: count,
            nvmlDeviceGetHandleByIndex=lambda i: i,
            nvmlDeviceGetName=lambda h: [b"NVIDIA H200", "NVIDIA L4"][h],
            nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
            nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=[143771, 23034][h] * 2**20),
            nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=4242, usedGpuMemory=1)] if h else [])

    inv = inventory(nvml=nvml(), nvidia_smi="/nonexistent/nvidia-smi")
    assert inv["source"] == "nvml" and inv["error"] is None and inv["types"] == {"H200": 1, "L4": 1}
    assert inv["cards"][0] == {"index": 0, "name": "NVIDIA H200", "type": "H200", "memory_mib": 143771,
                               "uuid": "GPU-0", "processes": []}
    assert inv["cards"][1]["processes"] == [4242]
    monkeypatch.setattr("shutil.which", lambda name: None)       # no nvidia-smi either
    cpu = inventory(nvml=nvml(fail=NVMLError_LibraryNotFound("no libnvidia-ml")))
    assert cpu["source"] == "cpu" and cpu["cards"] == [] and cpu["error"] is None
    broken = inventory(nvml=nvml(fail=NVMLError("Unknown Error")), nvidia_smi="/nonexistent/nvidia-smi")
    assert broken["source"] == "cpu" and "NVML could not be read: NVMLError: Unknown Error" in broken["error"]


# ------------------------------------------------------------------ the pool

def test_each_worker_gets_its_own_card_and_two_deployments_never_share_one():
    p = pool()
    assert p.claim("a1", "a", "a", "serving", "L4") == (0,)
    assert p.claim("b1", "b", "b", "serving", "L4") == (1,)
    assert p.claim("c1", "c", "c", "serving", "H100:2") == (2, 3)
    with pytest.raises(CardRefused) as e:
        p.claim("d1", "d", "d", "serving", "L4")
    err = e.value
    assert err.reason == "gpu_busy" and err.details["reason"] == "gpu_busy" and err.code == "unavailable"
    assert "every card of this machine is held; L4 cannot be had now" in err.detail
    assert "card 0 by a (serving worker a)" in err.detail and "card 1 by b (serving worker b)" in err.detail
    assert "seq policy stop" in err.hint
    assert [h["deployment"] for c in p.view() for h in c["held_by"]] == ["a", "b", "c", "c"]
    assert p.claim("cpu1", "e", "e", "serving", "cpu") == () and p.claim("cpu2", "e", "e", "serving", None) == ()


def test_a_worker_needing_more_cards_than_are_free_is_told_how_many_are_free():
    p = pool()
    assert p.claim("a1", "a", "a", "serving", "L4") == (0,)
    with pytest.raises(CardRefused) as e:
        p.claim("b1", "b", "b", "serving", "L4:2")          # card 1 is free, but one is not two
    err = e.value
    assert err.reason == "gpu_busy" and "only 1 such card(s) free" in err.detail, err.detail
    assert "every card of this machine is held" not in err.detail and err.details["free_cards"] == [1]
    assert "card 0 by a (serving worker a); card 1 free" in err.detail, err.detail


def test_a_fallback_list_takes_the_first_type_with_room_and_low_stock_names_the_free_type():
    p = pool()
    assert p.claim("a1", "a", "a", "serving", ["H100", "L4"]) == (2,)
    assert p.claim("b1", "b", "b", "serving", ["H100", "L4"]) == (3,)
    assert p.claim("c1", "c", "c", "serving", ["H100", "L4"]) == (0,)      # the H100s are held: an L4
    assert p.claim("d1", "d", "d", "serving", "L4") == (1,)
    p.release("c1")
    p.release("d1")
    with pytest.raises(CardRefused) as e:
        p.claim("e1", "e", "e", "serving", "H100")
    assert e.value.reason == "gpu_low_stock" and e.value.details["free_types"] == ["L4"]
    assert "every H100 card of this machine is held (H100: card 2 by a" in e.value.detail
    assert "gpu=['H100', 'L4']" in e.value.hint
    with pytest.raises(CardRefused) as e:
        p.claim("f1", "f", "f", "serving", "A100")
    assert e.value.reason == "gpu_unavailable" and "this machine does not have; it has H100, L4" in e.value.detail
    with pytest.raises(ValueError, match="same card count"):
        p.claim("g1", "g", "g", "serving", ["H100:2", "L4"])
    with pytest.raises(ValueError, match="whole number >= 1"):
        requested_cards("L4:0")


def test_one_deployments_workers_share_its_card_when_none_is_free_and_max_gpus_caps_new_cards():
    p = CardPool(fake_cards("L4"))
    assert p.claim("a1", "a", "a", "serving", "L4", max_gpus=1) == (0,)
    assert p.claim("a2", "a", "a.build", "build", "L4") == (0,)           # a rolling deploy on one card
    assert p.claim("a3", "a", "a@v1", "side", "L4", max_gpus=1) == (0,)
    with pytest.raises(CardRefused) as e:
        p.claim("b1", "b", "b", "serving", "L4")
    assert e.value.reason == "gpu_busy"
    p2 = pool()
    assert p2.claim("a1", "a", "a", "serving", "L4", max_gpus=1) == (0,)
    assert p2.claim("a2", "a", "a@v1", "side", "L4", max_gpus=1) == (0,)   # its own card, not a new one
    with pytest.raises(CardRefused) as e:
        p2.claim("a3", "a", "a@v2", "side", "H100", max_gpus=1)
    assert e.value.reason == "deployment_full" and e.value.code == "deployment_full"
    assert "already holds its max_gpus=1" in e.value.detail and e.value.details["max_gpus"] == 1
    with pytest.raises(CardRefused) as e:
        p2.claim("b1", "b", "b", "serving", "H100", limit=1)
    assert e.value.reason == "gpu_limit_reached" and e.value.code == "gpu_limit_reached"
    assert "this machine allows 1 at once" in e.value.detail
    p3 = pool()                                   # a build that took over counts as the serving worker
    assert p3.claim("a1", "a", "a.build", "build", "L4") == (0,)
    p3.bind("a1", Proc(pid=4321))
    p3.relabel({"a": 4321})
    assert [(c.worker, c.role) for c in p3.claims()] == [("a", "serving")]
    with pytest.raises(CardRefused, match="max_gpus=1"):
        p3.claim("a2", "a", "a@v1", "side", "H100", max_gpus=1)


def test_two_deployments_share_a_card_only_when_both_declare_memory_that_fits():
    p = CardPool(fake_cards("L4=24"))
    assert p.claim("a1", "a", "a", "serving", "L4", memory=10) == (0,)
    assert p.claim("b1", "b", "b", "serving", "L4", memory=(4, 12)) == (0,)      # 10 + 12 <= 24 GiB
    with pytest.raises(CardRefused):
        p.claim("c1", "c", "c", "serving", "L4", memory=4)                        # 26 > 24
    with pytest.raises(CardRefused):
        p.claim("d1", "d", "d", "serving", "L4")                                  # undeclared: the whole card
    q = CardPool(fake_cards("L4=24"))
    q.claim("a1", "a", "a", "serving", "L4")
    with pytest.raises(CardRefused):
        q.claim("b1", "b", "b", "serving", "L4", memory=1)                        # a holder declared none
    assert declared_memory_mib(16) == 16384 and declared_memory_mib((1, 2)) == 2048
    assert declared_memory_mib(None) is None and declared_memory_mib(-1) is None and declared_memory_mib("8") is None


def test_cards_are_released_when_the_worker_exits_or_its_start_fails_and_kept_across_a_restart(tmp_path):
    p = pool(tmp_path)
    w = Proc(pid=0)
    assert p.claim("a1", "a", "a", "serving", "L4") == (0,)
    p.bind("a1", w)
    assert p.holders(0)[0].deployment == "a"
    w.exit(0)
    assert p.holders(0) == [] and p.claim("b1", "b", "b", "serving", "L4") == (0,)
    p.release("b1")
    assert p.claim("c1", "c", "c", "serving", "L4") == (0,)
    # a live process's claim is kept for the next gateway on the data dir; a dead one's is not
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        p.bind("c1", live)
        p.claim("d1", "d", "d", "serving", "H100")
        p.bind("d1", SimpleNamespace(pid=dead.pid, poll=lambda: None))
        again = pool(tmp_path)
        assert [(c.deployment, c.cards, c.pid) for c in again.claims()] == [("c", (0,), live.pid)]
        assert json.loads((tmp_path / "cards.json").read_text())[0]["holder"] == "c1"
    finally:
        live.kill()
        live.wait()
    assert pool(tmp_path).claims() == []


def _spec(tmp_path, **kw) -> WorkerLaunchSpec:
    base = dict(name="a", role="serving", version=1, policy_file=str(tmp_path / "p.py"), class_name=None,
                cwd=str(tmp_path), secret="s", run_dir=tmp_path, run_key="a.1.abc", weights_dir=tmp_path,
                log_path=tmp_path / "a.log")
    return WorkerLaunchSpec(**{**base, **kw})


def test_pins_set_the_spec_cards_and_the_environment_pins_the_worker(tmp_path):
    inv = inventory(fake=FOUR)
    pins = CardPins(CardPool(inv["cards"]), lambda gpu: gpu_refusal(gpu, inv))
    spec = pins.pin(_spec(tmp_path, resources={"gpu": "H100:2"}), "a")
    assert spec.cards == (2, 3)
    assert spec.card_environment() == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                                       "NVIDIA_VISIBLE_DEVICES": "2,3"}
    cpu = pins.pin(_spec(tmp_path, run_key="b.1", name="b", resources={}), "b")
    assert cpu.cards == () and cpu.card_environment()["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu.card_environment()["NVIDIA_VISIBLE_DEVICES"] == "void"
    lacking = pins.pin(_spec(tmp_path, run_key="c.1", name="c", resources={"gpu": "A100"}), "c")
    assert lacking.cards is None and lacking.card_environment() == {}     # the load-time check refuses it
    from sequence_ai_server.common.errors import ApiError
    with pytest.raises(ApiError) as e:
        pins.pin(_spec(tmp_path, run_key="d.1", name="d", resources={"gpu": "L4:x"}), "d")
    assert e.value.code == "invalid_request" and "the count after ':'" in e.value.detail
    pins.release(spec)
    assert pins.pool.holders(2) == []


# ------------------------------------------------------------------ a real gateway and its workers

ENV_POLICY = '''
import json, os
from pathlib import Path
import seq


@seq.policy(gpu={gpu!r})
class Pinned(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        keys = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
        Path(__file__).with_suffix(".env.json").write_text(json.dumps({{k: os.environ.get(k) for k in keys}}))

    @seq.infer
    def infer(self, inputs):
        return {{"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}}
'''


def _policy(tmp_path: Path, name: str, gpu) -> Path:
    f = tmp_path / f"{name}.py"
    f.write_text(ENV_POLICY.format(gpu=gpu))
    return f


def test_a_gateway_with_fake_cards_pins_each_worker_to_its_card_and_names_the_holder(tmp_path):
    gw = GatewayProcess.start(tmp_path, env={"SEQ_FAKE_GPUS": "L4,L4,H100"})
    try:
        a, b, c, cpu = (_policy(tmp_path, n, g) for n, g in (("a", "L4"), ("b", "L4"), ("c", "L4"), ("cpu", "cpu")))
        for f in (a, b, cpu):
            d = gw.deploy(str(f), f.stem)
            assert d["status"] == "ready", d
        envs = {f.stem: json.loads(f.with_suffix(".env.json").read_text()) for f in (a, b, cpu)}
        assert envs["a"] == {"CUDA_VISIBLE_DEVICES": "0", "NVIDIA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        assert envs["b"]["CUDA_VISIBLE_DEVICES"] == "1" and envs["cpu"]["CUDA_VISIBLE_DEVICES"] == ""

        g = gw.client.get("/v1/gpus").json()
        assert g["source"] == "fake" and [c["type"] for c in g["cards"]] == ["L4", "L4", "H100"]
        pids = {n: gw.status(n)["pid"] for n in ("a", "b")}
        held = {c["index"]: [(h["deployment"], h["worker"], h["role"], h["pid"]) for h in c["held_by"]] for c in g["cards"]}
        assert held == {0: [("a", "a", "serving", pids["a"])], 1: [("b", "b", "serving", pids["b"])], 2: []}
        assert g["free"] == {"L4": 0, "H100": 1} and g["held"]["a"]["cards"] == {"L4": 1}
        assert g["held"]["cpu"] == {"workers": 1, "cards": {}}

        r = gw.client.post("/v1/deployments", json={"name": "c", "file": str(c)})
        assert r.status_code == 503, r.text
        body = r.json()
        assert body["details"]["reason"] == "gpu_low_stock" and body["details"]["free_types"] == ["H100"]
        assert "every L4 card of this machine is held (L4: card 0 by a (serving worker a" in body["detail"]

        out = seq_cli(gw, "gpus")
        assert out.returncode == 0, out.stderr
        assert "source      fake" in out.stdout and f"a (serving a, pid {pids['a']})" in out.stdout
        assert "free        H100 1/1, L4 0/2" in out.stdout

        d = gw.status("c")                       # recorded, stopped for want of a card; a connect tries again
        assert (d["status"], d["phase"]) == ("stopped", "no_card") and "every L4 card" in d["error"]
        r = gw.connect("c")
        assert r.status_code == 503 and r.json()["details"]["reason"] == "gpu_low_stock", r.text

        b.write_text(b.read_text() + "\n# v2\n")   # a rolling deploy on b's own card, then it serves there
        assert (gw.deploy(str(b), "b").get("build") or {}).get("status") == "ready"
        held = {c["index"]: [(h["deployment"], h["worker"], h["role"]) for h in c["held_by"]]
                for c in gw.client.get("/v1/gpus").json()["cards"]}
        assert held[1] == [("b", "b", "serving")], held

        gw.stop("a")
        deadline = time.monotonic() + 20
        while gw.client.get("/v1/gpus").json()["cards"][0]["held_by"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gw.client.get("/v1/gpus").json()["cards"][0]["held_by"] == []
        gw.connect_ready("c")                    # a's card is free: c's worker starts on it
        assert json.loads(c.with_suffix(".env.json").read_text())["CUDA_VISIBLE_DEVICES"] == "0"
    finally:
        gw.close()


def test_a_restarted_gateway_knows_the_card_its_adopted_worker_holds(tmp_path):
    env = {"SEQ_FAKE_GPUS": "L4,L4"}
    first = gateway_on_data_dir(tmp_path, env=env)
    gws = [first]
    try:
        a, b = _policy(tmp_path, "a", "L4"), _policy(tmp_path, "b", "L4")
        assert first.deploy(str(a), "a")["status"] == "ready"
        pid = first.status("a")["pid"]
        first.client.close()
        first.proc.send_signal(signal.SIGKILL)      # the worker outlives its gateway and is adopted
        first.proc.wait()
        gws.append(gateway_on_data_dir(tmp_path, env=env))
        g = gws[-1].client.get("/v1/gpus").json()
        assert [(h["deployment"], h["pid"]) for h in g["cards"][0]["held_by"]] == [("a", pid)], g["cards"]
        assert gws[-1].deploy(str(b), "b")["status"] == "ready"
        assert json.loads(b.with_suffix(".env.json").read_text())["CUDA_VISIBLE_DEVICES"] == "1"
    finally:
        for g in gws:
            if g.proc.poll() is None:
                g.close()
