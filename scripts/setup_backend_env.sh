#!/usr/bin/env bash
# Create or update .venv-jax or .venv-torch: kfast on Keras's JAX or PyTorch backend, CPU builds, and no
# TensorFlow, for the backend tests `make test` runs there (see docs/backends.md); or .venv-nightly: .venv-jax
# with the next Keras, keras-nightly at the dated build in constraints-nightly.txt, instead of keras.
#
# Usage: scripts/setup_backend_env.sh jax|torch|nightly     (the Makefile calls it when the venv is missing or stale)
# Env:   PYTHON=python3.11  the interpreter for a new venv
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

name=${1:-}
keras=keras
pins=(constraints.txt constraints-backends.txt)
case "$name" in
  jax) backend=jax; framework=(jax jaxlib) ;;
  # `+cpu` in the pin (constraints-backends.txt) keeps pip from taking PyPI's CUDA build instead; where
  # no CPU build is on pip's indexes, pass PyTorch's CPU wheel index with PIP_EXTRA_INDEX_URL.
  torch) backend=torch; framework=(torch) ;;
  nightly) backend=jax; framework=(jax jaxlib); keras=keras-nightly; pins+=(constraints-nightly.txt) ;;
  *) echo "usage: scripts/setup_backend_env.sh jax|torch|nightly (got '${name}')" >&2; exit 2 ;;
esac
venv=.venv-$name
constraints=()
for pin in "${pins[@]}"; do constraints+=(-c "$pin"); done

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [[ ! -x $venv/bin/python ]]; then
  echo "Creating $venv with $PYTHON ($("$PYTHON" --version))"
  "$PYTHON" -m venv "$venv"
fi
py=$venv/bin/python

echo "Installing kfast with $keras and ${framework[*]} into $venv (pinned by ${pins[*]})"
"$py" -m pip install -q --upgrade "pip>=24" "setuptools>=69" wheel
# No extra: kfast's own requirements hold no TensorFlow, and the test extra's notebook tools are not needed here.
tools=(pytest pytest-timeout pytest-xdist "${framework[@]}")
# The JAX tier also compiles for a named GPU without one (kfast plan --device): the plan-gpu extra.
# Packed shards are read on every backend: the packed extra (ArrayRecord) everywhere.
kfast=".[packed]"
[[ $name == jax ]] && kfast=".[plan-gpu,packed]"
if [[ $keras == keras ]]; then
  "$py" -m pip install -q "${constraints[@]}" -e "$kfast" "${tools[@]}"
else
  # keras-nightly installs the same `keras` package as the `keras` distribution that setup.cfg requires, and two
  # distributions owning one folder break each other's uninstall: kfast goes in without its dependencies, which
  # are setup.cfg's install_requires but keras, and keras-nightly stands in for keras (pip check names only that).
  mapfile -t requires < <("$py" -c '
import configparser, re
setup = configparser.ConfigParser(interpolation=None)
setup.read("setup.cfg")
for line in setup["options"]["install_requires"].splitlines():
    requirement = line.split("#")[0].strip()
    if requirement and re.match(r"[A-Za-z0-9._-]+", requirement).group().lower() != "keras":
        print(requirement)')
  # The packed extra, as the other backend venvs have it (the packed tests are backend tests).
  "$py" -m pip install -q "${constraints[@]}" "$keras" "${requires[@]}" "${tools[@]}" "array-record>=0.8,<0.9"
  "$py" -m pip install -q --no-deps -e .
  if "$py" -m pip show keras >/dev/null 2>&1; then
    echo "error: the keras distribution is installed in $venv beside $keras, which owns the same files;" \
         "remove both and set up again: $py -m pip uninstall -y keras $keras && bash scripts/setup_backend_env.sh $name" >&2
    exit 1
  fi
fi

# The point of this venv: kfast must work where TensorFlow is absent, so TensorFlow must really be absent.
if "$py" -c "import tensorflow" >/dev/null 2>&1; then
  echo "error: TensorFlow is importable in $venv, so its tests would not show that kfast runs without it;" \
       "remove it: $py -m pip uninstall -y tensorflow tensorflow-cpu" >&2
  exit 1
fi
KERAS_BACKEND=$backend "$py" -c "
import importlib.metadata, keras, kfast.callbacks, kfast.data
assert keras.backend.backend() == '$backend', keras.backend.backend()
assert keras.__version__ == importlib.metadata.version('$keras'), (keras.__version__, '$keras')
print('$venv ready: $keras', keras.__version__, 'on', keras.backend.backend(), '(TensorFlow not installed)')"
