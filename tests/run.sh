#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
#   bash tests/run.sh [PYTEST ARGS...]
# Idempotent: a second run reuses the virtualenv, the browser and the cached kube-apiserver.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi; }

# System packages: a real Chromium for the browser tests, etcd for the real kube-apiserver.
missing=()
command -v chromium >/dev/null || missing+=(chromium chromium-driver)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v node >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null \
    || echo "warning: could not install ${missing[*]}; the tests that need them will be skipped" >&2
fi

# Python environment. torch is pinned to the build this project is tested with.
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
export PATH=$ROOT/.venv/bin:$PATH
python -m pip install -q -U pip
python -m pip install -q "torch==2.13.0"
echo "== pip install -e .[test] (builds the JupyterLab extension)"
python -m pip install -q -e ".[test]"

# A real kube-apiserver (built once from Debian's source package, cached outside the repo).
KUBE_CACHE=${KUBE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-apiserver-1.20.2}
if [ -z "${JUPYTER_PAUSE_SKIP_APISERVER:-}" ] && [ ! -x "$KUBE_CACHE/kube-apiserver" ]; then
  echo "== building kube-apiserver into $KUBE_CACHE (first run only, 5-10 minutes)"
  as_root true && bash tests/kube/scripts/build.sh "$KUBE_CACHE" >/dev/null \
    || echo "warning: kube-apiserver build failed; the real-apiserver tests will be skipped" >&2
fi
export KUBE_APISERVER_BIN=$KUBE_CACHE/kube-apiserver

echo "== frontend unit tests"
(cd labextension && jlpm test)

echo "== pytest"
exec python -m pytest "$@"
