"""Print the fuzz session's RESULT line from the tally its conftest wrote (`FUZZ_REPORT`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> int:
    tally = json.loads(Path(path).read_text())
    for surface, n in tally["inputs"].items():
        print(f"{surface}: {n} inputs, slowest answer {tally['max_ms'][surface]:.0f} ms")
    total = sum(tally["inputs"].values())
    surfaces = sum(1 for n in tally["inputs"].values() if n > 0)
    print(
        f"RESULT inputs={total} surfaces={surfaces} failures={tally['failures']} "
        f"max_answer_ms={max(tally['max_ms'].values()):.0f} bound_ms={tally['bound_ms']:.0f}"
    )
    return 0 if tally["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
