# Two commands do everything (see README): `make demo` and `make test`.
# Each one creates or refreshes .venv first; a second run skips the setup when nothing changed.

VENV := .venv
STAMP := $(VENV)/.kfast-setup-done
SETUP_INPUTS := setup.cfg pyproject.toml constraints.txt scripts/setup_env.sh scripts/install_horovod.sh

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): $(SETUP_INPUTS)
	bash scripts/setup_env.sh
	touch $@

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP)
	$(VENV)/bin/pytest

clean:
	rm -rf $(VENV) build *.egg-info
