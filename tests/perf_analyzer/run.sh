#!/usr/bin/env bash
# `make test-perf-analyzer`: every perf_analyzer mode a Triton user runs, against a real stack
# (tests/perf_analyzer/modes.py; a few minutes). perf_analyzer is installed first when missing
# (bench/perf_analyzer.py: PyPI's wheel and Debian 13's C runtime, under build/perf_analyzer).
# Exit status: 0 every mode completed, 1 one did not, 77 skipped: this machine cannot have
# perf_analyzer (not Debian, no PyPI or Debian mirror), with the reason printed.
set -euo pipefail
SKIPPED=77
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
rc=0
"$PY" -m bench.perf_analyzer --install >/dev/null || rc=$?
if [ "$rc" = $SKIPPED ]; then
    echo "SKIP test-perf-analyzer: perf_analyzer cannot be installed here (reason above)"
    exit $SKIPPED
elif [ "$rc" != 0 ]; then
    echo "FAIL test-perf-analyzer: installing perf_analyzer failed (exit $rc)"
    exit 1
fi
exec "$PY" -m pytest tests/perf_analyzer/modes.py -q -p no:cacheprovider "$@"
