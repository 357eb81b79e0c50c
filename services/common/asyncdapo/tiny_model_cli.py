"""`asyncdapo model tiny --out DIR`: build the tiny test/demo model."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="model utilities")
    msub = p.add_subparsers(dest="model_command", required=True)
    tiny = msub.add_parser("tiny", help="build a tiny Qwen2 model (random weights, trained BPE tokenizer)")
    tiny.add_argument("--out", required=True, help="output directory")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden-size", type=int, default=128)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--heads", type=int, default=4)
    tiny.add_argument("--kv-heads", type=int, default=2)
    tiny.add_argument("--vocab-size", type=int, default=512)
    tiny.set_defaults(func=_tiny)


def _tiny(args: argparse.Namespace) -> int:
    from asyncdapo.tiny_model import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=3 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
    )
    out = build_tiny_model(args.out, seed=args.seed, spec=spec)
    print(f"tiny model written to {out}")
    return 0
