# Two commands do everything (see README): `make demo` and `make test`.
# Each one creates or refreshes .venv first; a second run skips the setup when nothing changed.

VENV := .venv
STAMP := $(VENV)/.kfast-setup-done
SETUP_INPUTS := setup.cfg pyproject.toml constraints.txt scripts/setup_env.sh scripts/install_horovod.sh

.PHONY: demo test setup multihost-setup clean

setup: $(STAMP)

$(STAMP): $(SETUP_INPUTS)
	bash scripts/setup_env.sh
	touch $@

demo: $(STAMP)
	bash scripts/demo.sh

# OpenSSH's server for the multi-host tests (tests/multihost/), never started as a service; returns at
# once when it is installed, and only says why it skips when not root.
multihost-setup:
	bash scripts/setup_multihost.sh

test: $(STAMP) multihost-setup
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV) build *.egg-info
