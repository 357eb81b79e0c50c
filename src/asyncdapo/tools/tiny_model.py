"""A tiny Qwen2-architecture causal LM for tests and the local demo: random weights and a byte-level
BPE tokenizer trained with `tokenizers` on the synthetic arithmetic corpus.

Nothing is downloaded. The directory is a normal Hugging Face model directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template, generation_config)
so transformers, vLLM and the trainer load it like any real model. Deterministic for a seed: the
same seed gives byte-identical weights and tokenizer.

Shape constraints that matter: head_dim = hidden_size / num_attention_heads must be one vLLM's CPU
attention supports (32, 64, …), and the vocabulary covers every byte so any text can be encoded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", EOS_TOKEN]

# ChatML, as Qwen2 uses it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        head_dim = self.hidden_size // self.num_attention_heads
        if head_dim % 32:
            raise ValueError(
                f"head_dim {head_dim} is not supported by vLLM's CPU attention (use a multiple of 32)"
            )


def _tokenizer_corpus(seed: int) -> list[str]:
    """Text the BPE merges are learned from: the synthetic problems rendered in ChatML."""
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits

    spec = SynthSpec(ops=("+", "-", "*"), max_operand=30)
    train, _ = synth_splits(spec.num_problems, 0, seed=seed, spec=spec)
    corpus = []
    for ex in train[:2000]:
        content = ex.prompt_text()
        corpus.append(
            f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n{ex.extra_info['solution']}"
        )
    corpus.append("The answer is \\boxed{42}. Let's think step by step and output the final answer.")
    return corpus


def train_tokenizer(vocab_size: int, seed: int):  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    # Digits stay single tokens so arithmetic is learnable; byte-level keeps every string encodable.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(seed), trainer=trainer)
    return tok


def build_tiny_model(out_dir: str | Path, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Write a tiny Qwen2 model directory to `out_dir` and return it."""
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyModelSpec()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    raw = train_tokenizer(spec.vocab_size, seed)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=spec.max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    assert isinstance(eos_id, int) and isinstance(pad_id, int), "one token, one id"
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",  # what `torch_dtype` was (transformers 5 reads that as `dtype`)
    )
    torch.manual_seed(seed)
    # transformers types `to` as @wraps(nn.Module.to) of an unbound method: mypy wants self first
    model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    (out / "asyncdapo_tiny_model.json").write_text(json.dumps({"seed": seed, **asdict(spec)}, indent=2))
    return out
