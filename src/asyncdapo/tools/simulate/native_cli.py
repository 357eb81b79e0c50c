"""`python -m asyncdapo.tools.simulate.native_cli build|status`: compile the simulator's event loop with
mypyc for the current sources (`make sim-native`), or say whether a build for them exists."""

from __future__ import annotations

import argparse
import sys

from asyncdapo.tools.simulate.native import build, cache_root, current_build, current_digest, enabled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m asyncdapo.tools.simulate.native_cli", description=__doc__.split("\n")[0]
    )
    p.add_argument("command", choices=["build", "status"])
    p.add_argument("--force", action="store_true", help="rebuild even when a build for these sources exists")
    a = p.parse_args(argv)
    if a.command == "build":
        build(force=a.force)
        return 0
    where = current_build()
    state = (
        f"{where}: built" if where else f"{cache_root() / current_digest()}: not built (plain Python runs)"
    )
    print(f"{state}; ASYNCDAPO_SIM_NATIVE={'on' if enabled() else 'off'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
