#!/usr/bin/env bash
# The one command to run ON a lent GPU machine (docs/gpu-check.md): installs the wheels that
# `make gpu-check-bundle` put in build/gpu-wheels next to the image's torch (never replacing it),
# then runs bench/gpu_check.py within its budget. Output: the log and the RESULT line on stdout;
# with $OUT set, $OUT/gpu_check.log and $OUT/gpu_check.jsonl.
#
#   bash bench/gpu_check.sh [gpu_check.py arguments]     # e.g. --size 0.5b --budget-s 300
#
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S (default 420), GPU_CHECK_SITE (where the
# wheels are installed, default a fresh temporary directory).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-420}
WHEELS=build/gpu-wheels
SITE=${GPU_CHECK_SITE:-$(mktemp -d /tmp/asyncdapo-gpu-site.XXXXXX)}
LOG=${OUT:+$OUT/gpu_check.log}
LOG=${LOG:-/dev/null}
[ -n "${OUT:-}" ] && mkdir -p "$OUT"

fail() { echo "gpu-check: $*" | tee -a "$LOG" >&2; exit 2; }

"$PY" - <<'EOF' 2>&1 | tee -a "$LOG" || fail "the interpreter cannot run the check (above)"
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Python {sys.version.split()[0]}: the project needs >= 3.11; set PYTHON to a newer interpreter")
try:
    import numpy, torch
except ImportError as err:
    sys.exit(f"{err}: the check uses the image's torch and numpy (not in the wheel bundle)")
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"available: {torch.cuda.is_available()}), numpy {numpy.__version__}")
EOF

[ -f "$WHEELS/requirements.txt" ] ||
  fail "$WHEELS/requirements.txt is missing: run \`make gpu-check-bundle\` on a machine with network and carry $WHEELS"
# --target: the bundle's pins shadow older copies in the image (PYTHONPATH comes first); torch and
# numpy stay the image's. No pip configuration of the image applies (no index, no constraints).
t0=$SECONDS
PIP_CONFIG_FILE=/dev/null PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
  --find-links "$WHEELS" --target "$SITE" -r "$WHEELS/requirements.txt" 2>&1 | tee -a "$LOG" ||
  fail "installing the wheels of $WHEELS failed (above)"
echo "installed $(wc -l < "$WHEELS/requirements.txt") distributions into $SITE in $((SECONDS - t0))s" | tee -a "$LOG"

export PYTHONPATH="$SITE:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# the budget bounds the check itself; the timeout is only a backstop for a hung collective
timeout --signal=TERM --kill-after=15 "$((${BUDGET%.*} + 90))" \
  "$PY" bench/gpu_check.py --budget-s "$BUDGET" "$@" 2>&1 | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
