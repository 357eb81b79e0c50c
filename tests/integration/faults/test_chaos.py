"""A short chaos soak (`make chaos` runs the long one): the whole loop on real processes —
redis-server (AOF, fsync always), verifier, scheduler, trainer, two SIMULATOR gateways — at default
settings, under the first 6 faults of a seeded random schedule (Redis SIGTERMed and restarted from
its AOF, twice; the scheduler's Redis connections cut; a gateway and the scheduler SIGTERMed and
restarted at once; a scheduler RECORD reply lost after Redis acted). `make chaos` runs 110 faults of
every kind; this variant is kept short (about a minute and a half) because it runs in `make test`:
the schedule's next fault, a trainer SIGKILL, alone costs the trainer lease (30 s) to recover.
Any lost or duplicated prompt or group, any stall, any invariant violation, any service that does
not come back fails it; the report printed on failure holds the history of what went wrong.

The seed fixes the schedule so that a failure can be replayed (`bench/chaos.py --seed 5 --faults
6`); it was not picked to pass: every seed must.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncdapo.tools.faults.chaos import ChaosOptions, ChaosRun
from asyncdapo.tools.faults.chaos_plan import FaultKind

pytestmark = pytest.mark.slow

SEED = 5
FAULTS = 6


def test_a_short_seeded_chaos_soak_loses_duplicates_and_stalls_nothing(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    opts = ChaosOptions(
        workdir=tmp_path / "chaos",
        seed=SEED,
        faults=FAULTS,
        time_budget_s=120,
        model_dir=tiny_model_dir,
        controls_every=0,
    )
    report = ChaosRun(opts).run()
    text = report.render()
    print(text)
    assert report.ok, text
    assert report.groups_duplicated == 0 and report.groups_lost == 0 and report.prompts_lost == 0, text
    assert report.stalls == 0 and report.crashes == [], text
    injected = report.injected
    # a lost reply that finds no matching command within 30 s is skipped, not injected
    assert len(injected) >= FAULTS - 1, f"only {len(injected)} faults injected\n{text}"
    # the schedule reached processes, Redis and connections alike
    services = {r.fault.kind.service for r in injected}
    assert {"scheduler", "gateway", "redis"} <= services, services
    assert any(r.fault.kind.how in ("kill", "term") for r in injected)
    assert any(r.fault.kind in (FaultKind.REDIS_CONN_CUT, FaultKind.GATEWAY_CONN_CUT) for r in injected)
    # every committed group is accounted for: trained, dropped or still in the stream
    g = report.groups
    assert g["committed"] > 0 and g["trained"] > 0 and g["lost"] == 0, g
