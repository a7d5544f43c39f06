# Two commands do everything (see README): `make demo` and `make test`.
# Each one creates or refreshes .venv first; a second run skips the setup when nothing changed.
# `make docs` builds the documentation site (mkdocs.yml, docs/) into site/.
# `make check` runs the fast tier of the tests, in minutes: the ones to run often while working.

VENV := .venv
STAMP := $(VENV)/.kfast-setup-done
SETUP_INPUTS := setup.cfg pyproject.toml constraints.txt scripts/setup_env.sh scripts/install_horovod.sh
GPU_VENV := .venv-gpu-build
# Keras on JAX and on PyTorch (CPU builds), without TensorFlow: the tests of what kfast offers on every backend;
# and .venv-nightly, .venv-jax with the next Keras (keras-nightly at the dated build in constraints-nightly.txt).
NIGHTLY_STAMP := .venv-nightly/.kfast-setup-done
BACKEND_STAMPS := .venv-jax/.kfast-setup-done .venv-torch/.kfast-setup-done $(NIGHTLY_STAMP)
BACKEND_INPUTS := setup.cfg pyproject.toml constraints.txt constraints-backends.txt scripts/setup_backend_env.sh
# The slow tiers (pytest markers, registered in setup.cfg and given in tests/conftest.py): `make check` runs
# every test that has none of them.
SLOW_TIERS := distributed or multihost or slurm or slow
# `make test` runs the `timing` tests alone, one at a time (they assert on measured time, which a test beside them
# would stretch), and every other test on two pytest-xdist workers; `--dist loadgroup` keeps the namespace hosts'
# tests on one worker (tests/conftest.py groups them), which start their harness once. Each phase runs even when
# one before failed, so one run shows every failure.
PARALLEL := -n 2 --dist loadgroup
define phases
status=0; for phase in $(1); do eval "$$phase" || status=1; done; exit $$status
endef

.PHONY: demo test check docs setup multihost-setup gpu-build-check backend-setup test-backends test-nightly clean

setup: $(STAMP)

$(STAMP): $(SETUP_INPUTS)
	bash scripts/setup_env.sh
	touch $@

demo: $(STAMP)
	bash scripts/demo.sh

# The documentation site: guides in docs/, the API reference from the docstrings (mkdocstrings).
# NO_MKDOCS_2_WARNING silences Material's banner about MkDocs 2, printed on every build.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: $(STAMP)
	$(MKDOCS) build

# OpenSSH's server for the multi-host tests (tests/multihost/), never started as a service; returns at
# once when it is installed, and only says why it skips when not root.
multihost-setup:
	bash scripts/setup_multihost.sh

# Horovod's GPU build (CUDA + NCCL) compiled and checked in a venv of its own, on any machine, GPU or not.
# The first run compiles for several minutes; later runs reuse the cached wheel.
gpu-build-check:
	bash scripts/gpu_build_check.sh $(GPU_VENV)

backend-setup: $(BACKEND_STAMPS)

$(BACKEND_STAMPS): $(BACKEND_INPUTS)
	bash scripts/setup_backend_env.sh $(patsubst .venv-%/.kfast-setup-done,%,$@)
	touch $@

# Moving the nightly pin redoes .venv-nightly alone.
$(NIGHTLY_STAMP): constraints-nightly.txt

# The tests marked `backends` (tests/conftest.py's BACKEND_MODULES), with Keras on JAX and on PyTorch.
# .venv-jax has JAX's CUDA plugin (kfast[plan-gpu], to compile for a named GPU): without a GPU, JAX_PLATFORMS=cpu
# keeps it from looking for CUDA (and printing why it found none) at every JAX import.
# PyTorch's OpenMP threads spin while they wait: on a busy 2-core machine they stretched the tests' 1 ms steps
# to as much as 120 ms and flipped timing verdicts, so its run computes on one thread.
test-backends: $(BACKEND_STAMPS)
	@$(call phases, \
	  'KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-jax/bin/pytest $(PARALLEL) -m "backends and not timing"' \
	  'KERAS_BACKEND=jax JAX_PLATFORMS=cpu .venv-jax/bin/pytest -m "backends and timing"' \
	  'KERAS_BACKEND=torch OMP_NUM_THREADS=1 .venv-torch/bin/pytest $(PARALLEL) -m "backends and not timing"' \
	  'KERAS_BACKEND=torch OMP_NUM_THREADS=1 .venv-torch/bin/pytest -m "backends and timing"' \
	  '$(MAKE) --no-print-directory test-nightly')

# The JAX tier on the next Keras (.venv-nightly): the tests marked `backends` but the JAX engine's, then the JAX
# engine's (tests/distributed/test_jax_engine.py, the only `backends` tests that are also `distributed`), so that a
# Keras change shows before the release that carries it. The `timing` tests measure the machine, not Keras: not here.
test-nightly: $(NIGHTLY_STAMP)
	@$(call phases, \
	  'KERAS_BACKEND=jax .venv-nightly/bin/pytest $(PARALLEL) -m "backends and not timing and not distributed"' \
	  'KERAS_BACKEND=jax .venv-nightly/bin/pytest $(PARALLEL) -m "backends and distributed and not timing"')

# The fast tier: no job of several ranks, no harness, no whole recipe, docs site or type check.
check: $(STAMP)
	$(VENV)/bin/pytest -m "not ($(SLOW_TIERS))"

# Every tier. The docs site is built once, with --strict, by tests/test_docs.py (a broken link, a missing page
# or an API name that does not resolve fails it).
test: $(STAMP) multihost-setup gpu-build-check backend-setup
	@$(call phases, \
	  '$(VENV)/bin/pytest $(PARALLEL) -m "not timing"' \
	  '$(VENV)/bin/pytest -m timing' \
	  '$(MAKE) --no-print-directory test-backends')

clean:
	rm -rf $(VENV) $(GPU_VENV) .venv-jax .venv-torch .venv-nightly build site *.egg-info
