#!/usr/bin/env bash
# The dependency floors hold: ckptbench installed with the oldest releases pyproject.toml allows (its
# dependencies, the s3 and crt extras, the test extra's moto) passes the tests that need no Ceph.
# Not part of the default test run: it makes a virtualenv, installs about 100 packages and builds the engine
# (2-3 minutes), then runs the tests (about 10 minutes on 2 cores).
#
#   tests/perf/floors_check.sh [PYTEST ARGS...]     (default: the no-Ceph tests below)
#
#   FLOORS_VENV   the virtualenv, made anew (default: ${TMPDIR:-/tmp}/ckptbench-floors)
#   FLOORS_TORCH  torch's requirement (default: torch==2.13.0, the README's). torch is the one dependency not
#                 taken at its floor (2.2): a CPU wheel of it is hundreds of MB, the PyPI one gigabytes.
#   FLOORS_PINS   the floors of what the dependencies pin among themselves (default below), replaced whole
#
# Every "name>=X" in [project] dependencies and in the s3 and crt extras, and moto's in the test extra, is
# installed as "name==X"; the test extra's tools (pytest, hypothesis, ...) as pip resolves them.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${FLOORS_VENV:-${TMPDIR:-/tmp}/ckptbench-floors}
torch=${FLOORS_TORCH:-torch==2.13.0}
# botocore: boto3 1.28.0 takes 1.31.x, s3fs 2024.3.0's oldest aiobotocore (2.5.4) only 1.31.17. Raising the
# boto3 or s3fs floor may move it (pip then says the pins conflict).
extra_pins=${FLOORS_PINS:-botocore==1.31.17}

floors=$(python3 - <<'EOF'
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
wanted = project["dependencies"] + extras["s3"] + extras["crt"] + [r for r in extras["test"] if r.startswith("moto")]
for requirement in wanted:
    match = re.fullmatch(r"([A-Za-z0-9_.\-]+(?:\[[^\]]*\])?)\s*>=\s*([0-9][^,;\s]*)", requirement.strip())
    if match is None:
        raise SystemExit(f"floors_check.sh: {requirement!r} has no floor of the form name>=X")
    if match.group(1) != "torch":
        print(f"{match.group(1)}=={match.group(2)}")
EOF
)

echo "floors_check: a fresh virtualenv in $venv"
python3 -m venv --clear "$venv"
"$venv/bin/pip" install -q "$torch"
# shellcheck disable=SC2086
"$venv/bin/pip" install -q '.[test,s3,crt]' $floors $extra_pins
echo "floors_check: installed"
"$venv/bin/python" - $floors $extra_pins <<'EOF'
import importlib.metadata as metadata
import re
import sys

for pin in sys.argv[1:]:
    name = re.split(r"[\[=]", pin)[0]
    print(f"  {name:12} {metadata.version(name):12} (pinned {pin})")
print(f"  {'torch':12} {metadata.version('torch'):12} (not its floor)")
EOF

if [ "$#" -eq 0 ]; then
  # tests/storage/ needs the Ceph cluster but for these three (moto's S3 server runs in the test process)
  set -- tests/unit tests/cli tests/checkpoint tests/native tests/security tests/integration \
    tests/storage/test_s3_moto.py tests/storage/test_capabilities.py tests/storage/test_scratch_leftovers.py
fi
# The installed copy is tested, as in CI: pytest (not python -m pytest) leaves the source tree off sys.path.
exec nice -n 10 "$venv/bin/pytest" -n 2 --dist loadgroup -p no:cacheprovider "$@"
