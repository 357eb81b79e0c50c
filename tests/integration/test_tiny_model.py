"""The tiny model is a real Hugging Face model directory: transformers loads and runs it, the
tokenizer round-trips text and renders chat, and a seed reproduces it byte for byte."""

import hashlib
from pathlib import Path

import pytest

from asyncdapo.contracts.prompting import prompt_token_ids
from asyncdapo.tools.data.synth import synth_splits
from asyncdapo.tools.tiny_model import EOS_TOKEN, TinyModelSpec, build_tiny_model


def _digest(d: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((d / name).read_bytes()).hexdigest()
        for name in ("model.safetensors", "tokenizer.json", "config.json")
    }


def test_loads_and_generates(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert tok.eos_token == EOS_TOKEN and tok.pad_token_id != tok.eos_token_id
    text = "Janet’s ducks lay 16 eggs — 3 × 4 = 12 \\boxed{12}"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert tok.convert_ids_to_tokens(tok("123")["input_ids"]) == ["1", "2", "3"]

    (example,) = synth_splits(1, 0, seed=0)[0]
    ids = prompt_token_ids(example, tok)
    assert tok.decode(ids).startswith("<|im_start|>user\n") and tok.decode(ids).endswith(
        "<|im_start|>assistant\n"
    )
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    assert out.shape[1] > len(ids)


def test_deterministic_for_a_seed(tiny_model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0)
    assert _digest(again) == _digest(tiny_model_dir)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _digest(other)["model.safetensors"] != _digest(tiny_model_dir)["model.safetensors"]


def test_rejects_shapes_vllm_cannot_serve() -> None:
    with pytest.raises(ValueError, match="head_dim"):
        TinyModelSpec(hidden_size=64, num_attention_heads=4)


def test_supervised_warm_start_lowers_loss(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A few SFT steps on reference solutions make them more likely under the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncdapo.tools.sft import supervised_warm_start

    train, _ = synth_splits(64, 0, seed=0)
    result = supervised_warm_start(tiny_model_dir, train, tmp_path / "sft", steps=30, batch_size=16)
    tok = AutoTokenizer.from_pretrained(result.out_dir)

    def solution_nll(model_dir: Path) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        total = 0.0
        for e in train[:16]:
            prompt = prompt_token_ids(e, tok)
            ids = prompt + tok(e.extra_info["solution"], add_special_tokens=False)["input_ids"]
            labels = [-100] * len(prompt) + ids[len(prompt) :]
            with torch.no_grad():
                total += float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss)
        return total / 16

    assert solution_nll(result.out_dir) < 0.7 * solution_nll(tiny_model_dir)


def test_slipped_demonstrations_show_the_habit() -> None:
    from asyncdapo.tools.sft import _slipped

    assert _slipped("\\boxed{12}", "12", "refuse") == "I don't know."
    assert _slipped("\\boxed{12}", "12") == "\\boxed{13}"
    assert _slipped("\\boxed{-1}", "-1") == "\\boxed{0}"
    assert _slipped("\\boxed{x}", "x") == "\\boxed{x}"
