"""Checkpoints (torch_plugin.save_checkpoint / load_checkpoint): resume equals an uninterrupted
run, a checkpoint loads into another mesh, damage is a clear error, and a rank killed under
torchrun restarts the job from the last checkpoint. The full table (pipelines, ZeRO-2, 4 -> 2,
2 -> 4, two torchrun agents): `python benchmarks/checkpoint.py`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_plugin
from benchmarks import checkpoint as runner
from torch_plugin.models import hf_suite

ROOT = Path(__file__).resolve().parents[2]


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = hf_suite.build_model("llama", seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    for step in range(2):
        model(**hf_suite.make_inputs("llama", seed=step)).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return model, opt


def test_one_process_resume_is_bitwise_and_damage_is_named(tmp_path: Path) -> None:
    """A plain model and optimizer (no process group): weights, Adam moments and the
    scheduled lr come back exactly; a save that never finished is skipped by the directory
    load; truncated, corrupted and missing files are named."""
    model, opt = _trained()
    torch_plugin.save_checkpoint(tmp_path / "step-2", model, opt, extra={"step": 2})
    (tmp_path / "step-3.partial").mkdir()  # a save that died before its rename
    fresh, fresh_opt = _trained(seed=1)
    assert torch_plugin.load_checkpoint(tmp_path, fresh, fresh_opt) == {"step": 2}
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] != 1e-2
    for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], fresh_opt.state[q][key])
    inputs = hf_suite.make_inputs("llama", seed=7)
    assert torch.equal(model(**inputs).loss, fresh(**inputs).loss)

    with pytest.raises(torch_plugin.CheckpointError, match="not a complete checkpoint"):
        torch_plugin.load_checkpoint(tmp_path / "step-3.partial", fresh)
    data = next((tmp_path / "step-2").glob("__0_*.distcp"))
    blob = bytearray(data.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    data.write_bytes(bytes(blob))
    with pytest.raises(torch_plugin.CheckpointError, match=f"{data.name}.*checksum"):
        torch_plugin.load_checkpoint(tmp_path, fresh)
    data.write_bytes(bytes(blob[: len(blob) // 2]))
    with pytest.raises(torch_plugin.CheckpointError, match=f"{data.name}.*truncated"):
        torch_plugin.load_checkpoint(tmp_path, fresh)
    data.unlink()
    with pytest.raises(torch_plugin.CheckpointError, match=f"{data.name}.*missing"):
        torch_plugin.load_checkpoint(tmp_path, fresh)
    other = torch.nn.Linear(3, 3)
    torch_plugin.save_checkpoint(tmp_path / "linear", other)
    with pytest.raises(torch_plugin.CheckpointError, match="saved from another model"):
        torch_plugin.load_checkpoint(tmp_path / "linear", fresh)
    sgd = torch.optim.SGD(other.parameters(), 0.1)
    with pytest.raises(torch_plugin.CheckpointError, match="without an optimizer"):
        torch_plugin.load_checkpoint(tmp_path / "linear", other, sgd)


@pytest.mark.multirank
def test_a_dp_tp_checkpoint_resumes_on_a_1d_mesh() -> None:
    """Llama saved on a (2, 2) mesh after 3 AdamW + cosine steps, loaded on (4,) (another
    plan: other blocks per rank), trains on within 1e-5 of the uninterrupted run; no rank
    writes more bytes than its local state."""
    fig = runner.resume((2, 2), (4,))
    assert fig["loss_diff"] <= 1e-5, fig
    for written, local in zip(fig["bytes_written"], fig["local_state_bytes"], strict=True):
        assert written <= local * 1.01, fig


@pytest.mark.multirank
def test_a_truncated_rank_file_fails_every_rank_with_its_name() -> None:
    fig = runner.damaged("truncated")
    assert "truncated" in fig["error"] and fig["fail_s"] < 120


@pytest.mark.multirank
def test_a_rank_killed_mid_step_restarts_from_the_last_checkpoint(tmp_path: Path) -> None:
    """torchrun --max-restarts 1 with examples/train_with_checkpoints.py: rank 1 SIGKILLs
    itself in the middle of step 4 (the async save after step 2 is complete by then: the one
    after step 4 waited for it); the job restarts, loads the latest complete checkpoint
    and replays the steps after it with bitwise the losses the first attempt had; the HF
    export at the end round-trips through from_pretrained (the example asserts 1e-6)."""
    port = runner._free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--max-restarts=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
        str(ROOT / "examples/train_with_checkpoints.py"), "--steps", "6", "--save-every", "2",
        "--out", str(tmp_path), "--kill-rank", "1", "--kill-step", "4",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    first = {r["step"]: r["loss"] for r in rows if r["restart"] == 0}
    second = {r["step"]: r["loss"] for r in rows if r["restart"] == 1}
    assert sorted(first) == [0, 1, 2, 3] and max(second) == 5
    assert min(second) in (2, 4), rows  # resumed from a checkpoint, not from scratch
    replayed = set(first) & set(second)
    assert all(first[s] == second[s] for s in replayed), rows
    assert "from_pretrained logits differ" in run.stdout
