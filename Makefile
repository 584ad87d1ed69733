# Two commands matter: `make demo` and `make test`. Both build everything they need from scratch.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.k3-installed
DEMO_DIR ?= demo-model

.PHONY: test demo install bench-index clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Reinstall (and rebuild the C++ extension) whenever the build inputs change.
$(STAMP): $(PY) pyproject.toml CMakeLists.txt $(wildcard native/*)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/k3 make-model $(DEMO_DIR) --shape tiny --seed 0 --if-missing
	$(VENV)/bin/k3 run $(DEMO_DIR) --ids 1,2,3,4,5,6,7,8 --gen 12

bench-index: $(STAMP)
	$(PY) benchmarks/index_bench.py

clean:
	rm -rf $(VENV) build $(DEMO_DIR)

# NEON backend == scalar, byte for byte, under qemu-aarch64 (installs the cross toolchain and qemu from
# Debian if missing). Kept out of `make test` so that stays quick; .ci/run runs both.
.PHONY: neon-check
neon-check:
	bash native/neon-check.sh
