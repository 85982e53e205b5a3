"""The card check for a machine with NVIDIA GPUs: the inventory, each card pinned to its own process
and to its own gateway worker, and a batch-cost curve per card, in a couple of minutes.

    . scripts/env.sh && python bench/gpu_check.py            # needs torch with CUDA for the pinning parts
    python bench/gpu_check.py --no-gateway                   # skip the gateway part

On a machine without a card it prints the inventory, says "no GPU here" and exits 0, so it can sit
in any checklist. Steps, each printed as it runs:

1. The inventory (ops/gpus.py: NVML, else nvidia-smi): index, name, type, memory, UUID.
2. Per card, one process started with the environment the local launcher gives a worker pinned
   to that card (``WorkerLaunchSpec.card_environment``): it must see exactly one CUDA device whose
   UUID is that card's, allocate on it, and (where NVML shows processes) appear on that card only.
   It also times a 4096-wide two-layer MLP forward at batch 1, 2, 4, 8, 16, 32 (median of 20).
3. A real gateway on loopback (temp data dir) deploys one ``gpu="<type>"`` policy per card; each
   worker reports the card it sees, every worker must see a different one, and ``GET /v1/gpus``
   must name each worker as its card's holder.

Exit 0 when every check passed (or there is no card), 1 when one failed (the line says which).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "test"), str(ROOT / "server"), str(ROOT)]

from sequence_ai_server.launchers.base import WorkerLaunchSpec  # noqa: E402
from sequence_ai_server.ops.gpus import inventory  # noqa: E402

CHILD = textwrap.dedent('''
    import json, os, sys, time
    import torch
    out = {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    out["cuda"] = torch.cuda.is_available()
    if out["cuda"]:
        out["count"] = torch.cuda.device_count()
        p = torch.cuda.get_device_properties(0)
        out["name"], out["uuid"] = p.name, str(getattr(p, "uuid", "") or "")
        hold = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda:0")     # 256 MiB, kept until told
        torch.manual_seed(0)
        w1 = torch.randn(4096, 4096, device="cuda:0", dtype=torch.float16)
        w2 = torch.randn(4096, 4096, device="cuda:0", dtype=torch.float16)
        curve = {}
        for b in (1, 2, 4, 8, 16, 32):
            x = torch.randn(b, 4096, device="cuda:0", dtype=torch.float16)
            for _ in range(3):
                torch.relu(x @ w1) @ w2
            torch.cuda.synchronize()
            ts = []
            for _ in range(20):
                t0 = time.perf_counter()
                torch.relu(x @ w1) @ w2
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
            curve[b] = round(sorted(ts)[len(ts) // 2] * 1000, 3)
        out["batch_ms"] = curve
    print(json.dumps(out), flush=True)
    sys.stdin.readline()          # hold the card until the parent has looked
''')

POLICY = textwrap.dedent('''
    import json, os
    from pathlib import Path
    import seq


    @seq.policy(gpu={gpu!r})
    class CardCheck(seq.Policy):
        @seq.load
        def load(self, weights_dir):
            import torch
            p = torch.cuda.get_device_properties(0)
            info = {{"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "count": torch.cuda.device_count(),
                     "uuid": str(getattr(p, "uuid", "") or ""), "name": p.name, "pid": os.getpid()}}
            self.x = torch.ones(1024, device="cuda:0")
            Path(__file__).with_suffix(".card.json").write_text(json.dumps(info))

        @seq.infer
        def infer(self, inputs):
            return {{"ok": True}}
''')


def _uuid_match(torch_uuid: str, nvml_uuid: str) -> bool:
    """torch prints a bare UUID, NVML ``GPU-<uuid>``; MIG slices differ further (reported, not failed)."""
    a, b = torch_uuid.lower().replace("gpu-", ""), nvml_uuid.lower().replace("gpu-", "")
    return bool(a) and a == b


def _spec(index: int, tmp: Path) -> WorkerLaunchSpec:
    return WorkerLaunchSpec(name=f"card{index}", role="serving", version=1, policy_file=str(tmp / "x.py"),
                            class_name=None, cwd=str(tmp), secret="-", run_dir=tmp, run_key=f"card{index}",
                            weights_dir=tmp, log_path=tmp / "x.log", cards=(index,))


def check_processes(inv: dict, tmp: Path) -> list[str]:
    """Step 2; returns the failures."""
    import os
    fails: list[str] = []
    children = []
    for card in inv["cards"]:
        env = {**os.environ, **_spec(card["index"], tmp).card_environment()}
        p = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, env=env)
        children.append((card, p))
    try:
        for card, p in children:
            line = p.stdout.readline()
            if not line:
                fails.append(f"card {card['index']}: the pinned process printed nothing (exit {p.wait()})")
                continue
            r = json.loads(line)
            tag = f"card {card['index']} ({card['name']})"
            if not r["cuda"]:
                fails.append(f"{tag}: CUDA_VISIBLE_DEVICES={r['visible']!r} but torch sees no CUDA device")
                continue
            ok_count = r["count"] == 1
            ok_uuid = _uuid_match(r["uuid"], card["uuid"])
            print(f"  {tag}: CUDA_VISIBLE_DEVICES={r['visible']} -> {r['count']} device(s), {r['name']}, "
                  f"uuid {'matches' if ok_uuid else 'DIFFERS: ' + r['uuid'] + ' vs ' + card['uuid']}; "
                  f"MLP ms by batch {r['batch_ms']}")
            if not ok_count:
                fails.append(f"{tag}: the pinned process sees {r['count']} devices, not 1")
            if r["uuid"] and not ok_uuid:
                fails.append(f"{tag}: the pinned process is on another card (uuid {r['uuid']})")
            card["_pid"] = r["pid"]
        if inv["source"] == "nvml":
            seen = {c["index"]: set(c.get("processes") or []) for c in inventory()["cards"]}
            for card, _p in children:
                pid = card.get("_pid")
                on = sorted(i for i, pids in seen.items() if pid in pids)
                if not any(seen.values()):
                    print("  NVML lists no compute processes here (a container's PID namespace?): not checked")
                    break
                if on != [card["index"]]:
                    fails.append(f"card {card['index']}: NVML shows its pinned pid {pid} on cards {on}")
    finally:
        for _card, p in children:
            if p.stdin:
                p.stdin.write("\n")
                p.stdin.close()
            p.wait(timeout=60)
    return fails


def check_gateway(inv: dict, tmp: Path) -> list[str]:
    """Step 3; returns the failures."""
    from _servers import GatewayProcess
    fails: list[str] = []
    (tmp / "gw").mkdir()
    gw = GatewayProcess.start(tmp / "gw", timeout=60)
    try:
        files = []
        for card in inv["cards"]:
            f = tmp / f"card{card['index']}.py"
            f.write_text(POLICY.format(gpu=card["type"]))
            d = gw.deploy(str(f), f"card{card['index']}", timeout=300)
            if d["status"] != "ready":
                fails.append(f"deploy gpu={card['type']!r}: {d['status']}: {d.get('error')}")
                continue
            files.append((card, f, d))
        seen = {}
        for card, f, d in files:
            info = json.loads(f.with_suffix(".card.json").read_text())
            seen[f.stem] = info
            print(f"  worker {f.stem} (pid {info['pid']}): CUDA_VISIBLE_DEVICES={info['visible']}, {info['count']} "
                  f"device(s), {info['name']}")
            if info["count"] != 1:
                fails.append(f"worker {f.stem} sees {info['count']} devices, not 1")
        uuids = [i["uuid"] for i in seen.values() if i["uuid"]]
        if len(set(uuids)) != len(uuids):
            fails.append(f"two workers share a card: {uuids}")
        g = gw.client.get("/v1/gpus").json()
        held = []
        for c in g["cards"]:
            holders = [h["deployment"] for h in c["held_by"]]
            held += holders
            print(f"  GET /v1/gpus card {c['index']}: held by {holders or 'nothing'}")
            if len(holders) != 1:      # one deployment per card (which card of a type each got is the pool's choice)
                fails.append(f"card {c['index']} has holders {holders}, expected one worker")
        if sorted(held) != sorted(seen):
            fails.append(f"GET /v1/gpus names holders {sorted(held)}, the workers are {sorted(seen)}")
    finally:
        gw.close()
    return fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-gateway", action="store_true", help="skip step 3 (the gateway's workers)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    inv = inventory()
    print(f"inventory: source {inv['source']}" + (f" ({inv['error']})" if inv.get("error") else ""))
    for c in inv["cards"]:
        print(f"  card {c['index']}: {c['name']} ({c['type']}), {c['memory_mib']} MiB, {c['uuid']}")
    if not inv["cards"]:
        print(f"no GPU here (a CPU machine: {inv['cpu']['cores']} cores): nothing to pin; exit 0")
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: the inventory is all this script can check here; exit 0")
        return 0
    fails: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        tmp = Path(d)
        print("pinned processes (one per card):")
        fails += check_processes(inv, tmp)
        if not args.no_gateway:
            print("gateway workers (one gpu=<type> deployment per card):")
            fails += check_gateway(inv, tmp)
    for f in fails:
        print(f"FAIL {f}")
    print(f"{'FAILED' if fails else 'ok'}: {len(inv['cards'])} card(s) in {time.monotonic() - t0:.1f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
