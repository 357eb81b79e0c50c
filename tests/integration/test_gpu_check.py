"""`make gpu-check`'s CPU mode (bench/gpu_check.py --device cpu --size tiny): the trainer's FSDP2
update, packing, checkpoint/resume and weight export on a tiny Qwen2 in one gloo process, as a
subprocess, judged by its RESULT line and its JSON record; a broken packing or an optimizer that is
not restored turns the line's verdicts to 0; a budget too small skips the size, and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.py"

# the same run with two faults put in: packed sequences that attend across each other (one sequence,
# positions not restarting), and a restore that skips the optimizer's state
SABOTAGED = """
import dataclasses, sys, runpy, torch
from asyncdapo.services.trainer import checkpoint, model, packing

real_pack = packing.pack_rows
def pack_rows(batch):
    p = real_pack(batch)
    one = {"position_ids": torch.arange(p.num_tokens).unsqueeze(0), "lengths": [p.num_tokens]}
    return dataclasses.replace(p, **{k: v for k, v in one.items() if hasattr(p, k)})
model.pack_rows = pack_rows

def load_into(self, path, module, optimizer, lr_scheduler, device):
    module.load_state_dict(torch.load(path / "model.pt", map_location=device, weights_only=True))
    lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    return self.load_state(path)
checkpoint.CheckpointStore.load_into = load_into

sys.argv = [sys.argv[1], *sys.argv[2:]]
sys.path.insert(0, sys.argv[0].rpartition("/")[0])  # as `python SCRIPT` does: its siblings import
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(*args: str, sabotage: bool = False, out: Path | None = None) -> tuple[int, dict[str, str], str]:
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--size", "tiny", *args]
    if sabotage:
        cmd = [sys.executable, "-c", SABOTAGED, *cmd[1:]]
    if out is not None:
        cmd += ["--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("RESULT "), proc.stdout[-2000:] + proc.stderr[-4000:]
    fields = dict(kv.split("=", 1) for kv in lines[-1].split()[1:])
    return proc.returncode, fields, proc.stdout + proc.stderr


def test_cpu_mode_proves_the_trainer_path(tmp_path: Path) -> None:
    rc, r, log = _run(out=tmp_path)
    assert rc == 0, log[-4000:]
    assert r["gpu"] == "cpu"
    assert r["packed_equal"] == "1" and r["resume_equal"] == "1", log[-4000:]
    assert r["checks_on"] == "tiny" and r["skipped"] == "none" and r["errors"] == "none"
    assert float(r["model_tiny_tok_per_s"]) > 0
    assert float(r["peak_mem_gib_tiny"]) > 0
    assert float(r["export_s_per_gb"]) > 0
    records = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    assert len(records) == 1
    rec = records[0]
    assert rec["result"].split()[1:] == [f"{k}={v}" for k, v in r.items()]
    tiny = rec["sizes"]["tiny"]
    # the packed update ran fewer tokens than the padded batch holds (a long tail of lengths)
    assert 0 < tiny["tokens_per_step"] < tiny["padded_tokens_per_step"]
    assert len(tiny["step_s"]) == 2 and tiny["export_gb"] > 0
    assert tiny["checks"]["resume"]["restored_step"] == tiny["checks"]["resume"]["step"] == 3


def test_cpu_mode_fails_on_broken_packing_and_an_unrestored_optimizer() -> None:
    rc, r, log = _run(sabotage=True)
    assert rc == 1, log[-4000:]
    assert r["packed_equal"] == "0" and r["resume_equal"] == "0", log[-4000:]
    assert "DIFFERENT" in log


def test_a_budget_too_small_skips_the_size_and_reports_it() -> None:
    rc, r, log = _run("--budget-s", "1")
    assert rc == 1, log[-4000:]  # nothing was proven
    assert r["model_tiny_tok_per_s"] == "skipped" and r["peak_mem_gib_tiny"] == "skipped"
    assert r["skipped"] == "tiny" and r["packed_equal"] == "na" and r["resume_equal"] == "na"
    assert "tiny: skipped" in log
