"""`asyncdapo data synth|longtail|longtail-stats|gsm8k|show`: make, measure and inspect verl-layout datasets."""

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

    lt = dsub.add_parser(
        "longtail",
        help="the long-tail workload's problems and a dataset per valid rate (asyncdapo.tools.data.longtail)",
    )
    lt.add_argument("--out", required=True, help="output directory")
    lt.add_argument(
        "--valid-rates",
        default="0.3",
        help="comma-separated target valid-group rates (within the reach CLASS_VALID_RATE gives)",
    )
    lt.add_argument("--size", type=int, default=112, help="problems per dataset (distinct; at most)")
    lt.add_argument("--seed", type=int, default=0)
    lt.add_argument(
        "--pass-rates",
        help="a `longtail-stats --trace` over problems.parquet: mix each dataset from the problems' measured "
        "pass rates (asyncdapo.tools.data.pass_rates) instead of the per-class valid rates",
    )
    lt.add_argument(
        "--n", type=int, default=8, help="the group size the valid rate is for (with --pass-rates)"
    )
    lt.set_defaults(func=_longtail)

    lts = dsub.add_parser(
        "longtail-stats",
        help="measure a workload on real generations (vLLM in-process, math-verify): lengths, truncation, "
        "length-correctness, within-group CV, valid rate",
    )
    lts.add_argument("--model", required=True, help="model directory (e.g. the long-tail warm-start)")
    lts.add_argument("--data", required=True, nargs="+", help="verl-layout files, one statistic block each")
    lts.add_argument("--n", type=int, default=8, help="responses per problem (the group size)")
    lts.add_argument("--max-response-length", type=int, default=512)
    lts.add_argument("--overlong-buffer", type=int, default=64, help="reward.overlong_buffer.len")
    lts.add_argument("--temperature", type=float, default=1.0)
    lts.add_argument("--seed", type=int, default=0)
    lts.add_argument("--json", help="write every block's figures to this JSON file")
    lts.add_argument("--markdown", help="write the Markdown blocks to this file")
    lts.add_argument(
        "--trace",
        help="write the groups (prompt_tokens, lengths, acc) as JSONL for `asyncdapo simulate --replay` "
        "(with several --data files: one file each, the data file's stem appended)",
    )
    lts.set_defaults(func=_longtail_stats)

    gsm = dsub.add_parser("gsm8k", help="convert GSM8K's question/answer JSONL to verl's layout")
    gsm.add_argument("src", help="GSM8K JSONL (question, answer ending in '#### N')")
    gsm.add_argument("--out", required=True, help="output .parquet or .jsonl")
    gsm.set_defaults(func=_gsm8k)

    show = dsub.add_parser("show", help="validate verl-layout files and print a summary")
    show.add_argument(
        "files", nargs="+", help=".parquet, .jsonl or .json (JSON Lines or an array) in verl's layout"
    )
    show.add_argument("--prompt-key", default="prompt", help="the prompt column (data.prompt_key)")
    show.set_defaults(func=_show)


def _synth(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.tools.data.synth import SynthSpec, synth_splits

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


def _longtail(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.verl_format import write_examples
    from asyncdapo.tools.data.longtail import dataset, dataset_by_pass_rates, problems
    from asyncdapo.tools.data.pass_rates import load_pass_rates

    out = Path(args.out)
    for suffix in ("parquet", "jsonl"):
        write_examples(problems(), out / f"problems.{suffix}")
    rates = load_pass_rates(Path(args.pass_rates), len(problems())) if args.pass_rates else None
    for rate in (float(r) for r in args.valid_rates.split(",") if r.strip()):
        how = ""
        if rates is None:
            rows = dataset(rate, size=args.size, seed=args.seed)
        else:
            rows, mix_ = dataset_by_pass_rates(rate, rates, args.n, max_size=args.size, seed=args.seed)
            how = (
                f", {mix_.low} from the low-valid stratum, expected valid rate {mix_.expected_valid_rate:.3f}"
            )
        for suffix in ("parquet", "jsonl"):
            write_examples(rows, out / f"train-v{rate:g}.{suffix}")
        mix = {d: sum(e.extra_info["difficulty"] == d for e in rows) for d in ("easy", "medium", "hard")}
        print(f"valid rate {rate:g}: {len(rows)} problems {mix}{how} -> {out}/train-v{rate:g}.parquet")
    print(f"all {len(problems())} problems (the warm-start's) -> {out}/problems.parquet")
    return 0


def _longtail_stats(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from asyncdapo.contracts.verl_format import load_examples
    from asyncdapo.tools.data.longtail_stats import markdown, measure, summarize

    blocks, figures = [], {}
    for path in args.data:
        examples = load_examples([path])
        groups = asyncio.run(
            measure(args.model, examples, n=args.n, max_response_length=args.max_response_length,
                    temperature=args.temperature, seed=args.seed)
        )  # fmt: skip
        stats = summarize(groups, args.max_response_length, args.overlong_buffer)
        figures[path] = stats.as_dict()
        if args.trace:
            trace = Path(args.trace)
            if len(args.data) > 1:
                trace = trace.with_name(f"{trace.stem}-{Path(path).stem}{trace.suffix}")
            trace.parent.mkdir(parents=True, exist_ok=True)
            trace.write_text(
                "".join(
                    json.dumps(g.trace_line(f"{Path(path).stem}-{k}")) + "\n" for k, g in enumerate(groups)
                )
            )
            print(f"trace of {len(groups)} groups -> {trace}", flush=True)
        block = markdown(
            stats, f"{Path(path).name}: n = {args.n}, max_response_length {args.max_response_length}"
        )
        blocks.append(block)
        print(block, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(blocks))
    return 0


def _gsm8k(args: argparse.Namespace) -> int:
    from asyncdapo.contracts.verl_format import gsm8k_examples, write_examples

    examples = gsm8k_examples(args.src)
    write_examples(examples, args.out)
    print(f"{len(examples)} GSM8K problems written to {args.out}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from collections import Counter

    from asyncdapo.contracts.verl_format import load_examples

    examples = load_examples(args.files, args.prompt_key)
    sources = Counter(e.data_source for e in examples)
    chat = sum(e.is_chat for e in examples)
    print(f"{len(examples)} examples; sources: {dict(sources)}")
    print(f"prompts: {chat} chat, {len(examples) - chat} text")
    index_kinds = Counter(
        type(e.source_index).__name__ if e.source_index is not None else "none" for e in examples
    )
    columns = sorted({c for e in examples for c in e.columns})
    print(f"extra_info.index: {dict(index_kinds)}; other columns: {columns}")
    if examples:
        e = examples[0]
        print(
            f"first: prompt={e.prompt!r} ground_truth={e.ground_truth!r} extra_info.index={e.source_index!r}"
        )
    return 0
