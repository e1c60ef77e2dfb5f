#!/usr/bin/env bash
# tests/torch/run.sh: the Python package's and torch backend's pytest suites
# (make check). Skips (77) with the reason when the build found no torch.
# Sanitizer builds preload the sanitizer runtime into the interpreter and
# run the package's and backend's cases only.
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${DCOMM_TORCH_PYTHON:-}
if [ -z "$py" ]; then
  echo "skip: configure found no Python interpreter that imports torch (apt-get install python3-torch python3-pytest)"
  exit 77
fi
if ! "$py" -c 'import pytest, numpy' 2>/dev/null; then
  echo "skip: $py lacks pytest or numpy (apt-get install python3-pytest python3-numpy)"
  exit 77
fi
: "${DCOMM_LIBRARY:?DCOMM_LIBRARY must name the built libdcomm.so.0}"
export DCOMM_LIBRARY PYTHONPATH="$here/../../python${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
san=$(ldd "$DCOMM_LIBRARY" | awk '/libasan|libubsan|libtsan/ {print $3}' | tr '\n' ':')
if [ -n "$san" ]; then
  export LD_PRELOAD="${san%:}${LD_PRELOAD:+:$LD_PRELOAD}"
  # The interpreter and torch are not built with the sanitizer: their
  # allocations at exit are not dcomm's leaks.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
fi
what=("$here")
if [ -n "$san" ] && [ $# = 0 ]; then
  # The library through Python (the package, every op of the backend);
  # the launcher and recovery cases, processes and timing more than memory,
  # run in the plain build (CI's time budget).
  what=("$here/test_package.py" "$here/test_backend.py")
  echo "# sanitizer build: test_package.py and test_backend.py only"
fi
exec timeout 1500 "$py" -m pytest -q -p no:cacheprovider -x "${what[@]}" "$@"
