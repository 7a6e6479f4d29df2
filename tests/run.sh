#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs it.
#   bash tests/run.sh [PYTEST ARGS...]
# Idempotent: a second run reuses the virtualenv, the browser and the cached kube-apiserver.
# Under CI (CI=true) a failed install stops the run, and a test that would be skipped for a
# missing prerequisite fails instead (see conftest.py); elsewhere such tests are skipped and
# listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
case "$(printf %s "${CI:-}" | tr "[:upper:]" "[:lower:]")" in 1|true|yes) STRICT=1 ;; *) STRICT= ;; esac  # as conftest.py

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else return 1; fi; }
# A prerequisite that could not be installed: fatal under CI, a warning (and skipped tests) elsewhere.
install_failed() {
  if [ -n "$STRICT" ]; then echo "error: $1 (CI=true: stopping)" >&2; exit 1; fi
  echo "warning: $1; the tests that need it will be skipped" >&2
}

# System packages: a real Chromium for the browser tests, etcd for the real kube-apiserver,
# Node.js for the frontend build.
missing=()
command -v chromium >/dev/null || missing+=(chromium chromium-driver)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v node >/dev/null || missing+=(nodejs npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null; } \
    || install_failed "could not install ${missing[*]}"
fi

# Python environment. torch is pinned to the build this project is tested with.
if [ ! -x .venv/bin/python ]; then "$PY" -m venv .venv; fi
export PATH=$ROOT/.venv/bin:$PATH
python -m pip install -q -U pip || install_failed "could not upgrade pip"
python -m pip install -q "torch==2.13.0" || install_failed "could not install torch==2.13.0"
echo "== pip install -e ./kernel-package -e .[test] (builds the JupyterLab extension)"
# The kernel side is its own distribution (kernel-package/), not on PyPI: pip takes it from here.
python -m pip install -q -e ./kernel-package -e ".[test]"  # nothing runs without it: always fatal

# configurable-http-proxy for the JupyterHub tests (from npm, cached outside the repo).
CHP_CACHE=${CHP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-pause-chp}
if [ ! -x "$CHP_CACHE/node_modules/.bin/configurable-http-proxy" ]; then
  echo "== npm install configurable-http-proxy into $CHP_CACHE"
  { mkdir -p "$CHP_CACHE" && npm install --no-save --no-audit --no-fund --loglevel=error \
      --prefix "$CHP_CACHE" configurable-http-proxy >/dev/null; } \
    || install_failed "could not install configurable-http-proxy with npm"
fi
export CHP_BIN=$CHP_CACHE/node_modules/.bin/configurable-http-proxy

# A real kube-apiserver (built once from Debian's source package, cached outside the repo).
KUBE_CACHE=${KUBE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kube-apiserver-1.20.2}
if [ -z "${JUPYTER_PAUSE_SKIP_APISERVER:-}" ] && [ ! -x "$KUBE_CACHE/kube-apiserver" ]; then
  echo "== building kube-apiserver into $KUBE_CACHE (first run only, 5-10 minutes)"
  { as_root true && bash tests/kube/scripts/build.sh "$KUBE_CACHE" >/dev/null; } \
    || install_failed "could not build kube-apiserver with tests/kube/scripts/build.sh (it needs root or sudo)"
fi
export KUBE_APISERVER_BIN=$KUBE_CACHE/kube-apiserver
if [ -n "${JUPYTER_PAUSE_SKIP_APISERVER:-}" ]; then
  # Asked for explicitly: its tests may skip even under CI (conftest.py).
  export JUPYTER_PAUSE_ALLOW_MISSING="${JUPYTER_PAUSE_ALLOW_MISSING:+$JUPYTER_PAUSE_ALLOW_MISSING,}kube-apiserver"
fi

echo "== frontend unit tests"
(cd labextension && jlpm test)

echo "== pytest${STRICT:+ (CI=true: a missing prerequisite fails its tests)}"
# -ra (pyproject's addopts) lists every skip and why at the end; conftest.py adds one line for
# the skips that come from a missing prerequisite. pytest's own summary stays the last line.
exec python -m pytest "$@"
