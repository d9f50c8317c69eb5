#!/usr/bin/env bash
# Install everything and run the whole test suite (what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
export AREAL_REQUIRE_RESOURCES=1
set +e
.venv/bin/python -m pytest --doctest-modules --durations=30 areal_agents tests "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi
exit $rc
