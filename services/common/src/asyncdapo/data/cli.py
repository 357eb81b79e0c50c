"""`asyncdapo data synth|gsm8k|show`: make and inspect verl-layout datasets."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="datasets in verl's layout")
    dsub = p.add_subparsers(dest="data_command", required=True)

    synth = dsub.add_parser("synth", help="synthetic arithmetic problems (train/val, parquet + JSONL)")
    synth.add_argument("--out", required=True, help="output directory")
    synth.add_argument("--n-train", type=int, default=600)
    synth.add_argument("--n-val", type=int, default=200)
    synth.add_argument("--ops", default="+,-", help="comma-separated subset of + - *")
    synth.add_argument("--max-operand", type=int, default=20)
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(func=_synth)

    gsm = dsub.add_parser("gsm8k", help="convert GSM8K's question/answer JSONL to verl's layout")
    gsm.add_argument("src", help="GSM8K JSONL (question, answer ending in '#### N')")
    gsm.add_argument("--out", required=True, help="output .parquet or .jsonl")
    gsm.set_defaults(func=_gsm8k)

    show = dsub.add_parser("show", help="validate verl-layout files and print a summary")
    show.add_argument("files", nargs="+")
    show.set_defaults(func=_show)


def _synth(args: argparse.Namespace) -> int:
    from asyncdapo.data.synth import SynthSpec, synth_splits
    from asyncdapo.data.verl_format import write_examples

    spec = SynthSpec(
        ops=tuple(o.strip() for o in args.ops.split(",") if o.strip()), max_operand=args.max_operand
    )
    train, val = synth_splits(args.n_train, args.n_val, seed=args.seed, spec=spec)
    out = Path(args.out)
    for name, rows in (("train", train), ("val", val)):
        for suffix in ("parquet", "jsonl"):
            write_examples(rows, out / f"{name}.{suffix}")
    print(f"{len(train)} train / {len(val)} val problems written to {out}/{{train,val}}.{{parquet,jsonl}}")
    return 0


def _gsm8k(args: argparse.Namespace) -> int:
    from asyncdapo.data.verl_format import gsm8k_examples, write_examples

    examples = gsm8k_examples(args.src)
    write_examples(examples, args.out)
    print(f"{len(examples)} GSM8K problems written to {args.out}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from collections import Counter

    from asyncdapo.data.verl_format import load_examples

    examples = load_examples(args.files)
    sources = Counter(e.data_source for e in examples)
    print(f"{len(examples)} examples; sources: {dict(sources)}")
    if examples:
        e = examples[0]
        print(f"first: prompt={e.prompt!r} ground_truth={e.ground_truth!r}")
    return 0
