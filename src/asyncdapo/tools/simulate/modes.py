"""The modes a simulation compares, each a change of the user's `RunConfig` (nothing else differs
between two modes of one comparison: same workload, cluster, seed and every other knob).

    sync           rollout.mode sync (verl's DAPO loop: generation batches of
                   max_concurrent_prompts, filter, train, sync)
    async          async, s = 0, early_stop_order any (stop at B valid groups, abort + requeue)
    async-fifo     async, s = 0, early_stop_order fifo (the first B valid in admission order)
    fully-async    async, s = 1, weight_update_mode keep (responses span versions)
    fully-async-sK async, s = K, keep; K may be fractional (fully-async-s0.5: verl fully-async's
                   staleness_threshold 0.5, see `rollout.max_staleness`)
    pdsr           async, s = 0, long_tail.policy pdsr (cap on the fast pool, continue on heavy)
    pdsr-sK        pdsr with s = K (K may be fractional)
    …+greedy       any async mode with admission.policy greedy (e.g. async+greedy)
    …+mX           admission.margin X (e.g. async+m1.5)
"""

from __future__ import annotations

import re
from typing import Any

from asyncdapo.contracts.config import RunConfig
from asyncdapo.contracts.errors import AsyncdapoError


class ModeError(AsyncdapoError, ValueError):
    pass


_BASE = re.compile(r"^(sync|async|async-fifo|fully-async|pdsr)(?:-s(\d+(?:\.\d+)?))?$")


def mode_config(base: RunConfig, mode: str) -> RunConfig:
    """`base` with the changes `mode` names (see the module docstring)."""
    head, *mods = mode.split("+")
    m = _BASE.match(head)
    if m is None:
        raise ModeError(
            f"unknown mode {mode!r}: sync, async[-sK], async-fifo[-sK], fully-async[-sK], pdsr[-sK] "
            "(K a staleness such as 1 or 0.5), optionally +greedy or +m<margin>"
        )
    kind, s_txt = m.group(1), m.group(2)
    data = base.model_dump(mode="json")
    ro: dict[str, Any] = data["rollout"]
    ro["long_tail"]["policy"] = "none"
    if kind == "sync":
        if s_txt:
            raise ModeError("sync has no staleness")
        ro.update(mode="sync", max_staleness=0)
    else:
        ro.update(mode="async", early_stop_order="fifo" if kind == "async-fifo" else "any")
        default_s = 1 if kind == "fully-async" else 0
        ro["max_staleness"] = (float(s_txt) if "." in s_txt else int(s_txt)) if s_txt else default_s
        if kind == "fully-async":
            ro["weight_update_mode"] = "keep"
        if kind == "pdsr":
            ro["long_tail"]["policy"] = "pdsr"
    for mod in mods:
        if kind == "sync":
            raise ModeError(f"{mode!r}: sync takes no admission modifiers")
        if mod == "greedy":
            ro["admission"]["policy"] = "greedy"
        elif mod.startswith("m"):
            try:
                ro["admission"]["margin"] = float(mod[1:])
            except ValueError:
                raise ModeError(f"{mode!r}: +m takes a number (+m1.5)") from None
        else:
            raise ModeError(f"{mode!r}: unknown modifier {mod!r} (+greedy, +m<margin>)")
    return RunConfig.model_validate(data)
