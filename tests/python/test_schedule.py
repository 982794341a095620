"""Schedule language (issue 8): primitives on real zoo models, their misuse, the verifier, and
the Megatron-style GPT-2 schedule of examples/slapo_style_gpt.py on 2 gloo ranks."""

from __future__ import annotations

import json
from pathlib import Path

import dist_workers


def test_megatron_gpt2_schedule_equals_single_process(tmp_path: Path) -> None:
    dist_workers.spawn(dist_workers.schedule_gpt2_matches, 2, str(tmp_path))
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        print(r, {k: v for k, v in res.items() if k != "forward_all_reduces"})
        assert res["report"]["grads"] == 53  # every parameter's gradient was compared
        # Gradients of the loss (each rank's blocks against the same blocks of one process).
        assert res["max_grad_diff"] < 1e-5 and res["max_grad"] > 1e-3
        assert res["max_param_diff"] < 1e-5  # after one SGD step
        for a, b in zip(res["losses"], res["expect"], strict=True):
            assert abs(a - b) < 1e-5
        # Megatron: one all-reduce per attention and per MLP in forward (4 layers).
        assert sum(res["forward_all_reduces"].values()) == 8, res["forward_all_reduces"]
        assert res["sharded"] == 4 * 6
        assert res["local_bytes"] < 0.75 * res["full_bytes"]


def test_schedule_misuse_gives_clear_errors(tmp_path: Path) -> None:
    dist_workers.spawn(dist_workers.schedule_misuse, 2, str(tmp_path))
    errors = json.loads((tmp_path / "rank0.json").read_text())
    print(json.dumps(errors, indent=1))
    assert errors["wrong_path"].startswith('sch["model.transformer.h.0"] (GPT2Block) has no sub')
    assert "'atn'; its children: ln_1, attn, ln_2, mlp" in errors["wrong_path"]
    assert "axis out of range" in errors["axis"]
    assert "has no parameter 'weights'" in errors["no_param"]
    assert "nothing in this module is sharded" in errors["sync_unsharded"]
    assert "unknown mode 'after'" in errors["bad_mode"]
    assert ".trace() first" in errors["find_untraced"]
    assert "bias stays whole" in errors["row_bias"]
    assert 'sch["model.transformer.h.0.mlp.c_proj"].sync("fwd_post")' in errors["missing_sync"]
    assert "column-parallel" in errors["missing_bwd_sync"]
    assert 'fails in sch["model.transformer.h.0.attn"]' in errors["verify_fails"]
    assert "h.1.attn" in errors["verify_differs"] and "outputs differ" in errors["verify_differs"]
