# kvscale: every target installs what it needs (Python deps in .venv, test bed binaries cached
# under ~/.cache/kvscale). Quick start: `make demo`, `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv test test-unit test-bed test-vllm lint typecheck crds bench demo plan image testbed-build testbed-up testbed-down clean

help:
	@echo "make demo    - run the main demo"
	@echo "make test    - lint, type-check, unit tests and the tests on the real test bed (CI adds make test-vllm)"
	@echo "make bench   - accuracy and speed benchmarks (prints figures)"
	@echo "make test-vllm - a real vLLM (PyPI CPU build) serving a pod on the test bed; captures its /metrics"
	@echo "make crds    - regenerate crds/ from the pydantic models"
	@echo "make image   - build the operator image with podman (no Docker engine or registry needed)"
	@echo "make testbed-up / testbed-down - start/stop the local control plane + Prometheus"

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check operator tests benchmarks demo docs/experiments
	$(VENV)/bin/lint-imports

# The package, then the tests, strict too: one pass per directory, since each has its own conftest and its
# scripts import each other by name, as pytest's rootdir-relative imports do. tests/realvllm runs in vLLM's own
# virtualenv (torch, transformers) and is not checked here.
TEST_MYPY = MYPYPATH=tests/testbed:tests/e2e:tests/bed:tests/support:benchmarks $(VENV)/bin/mypy --explicit-package-bases
typecheck: venv
	$(VENV)/bin/mypy
	$(TEST_MYPY) tests/unit/*.py tests/conftest.py
	$(TEST_MYPY) tests/bed/*.py
	$(TEST_MYPY) tests/e2e/*.py tests/testbed/*.py

crds: venv
	$(PY) -m kvscale.api.crd --out crds/
	cp crds/llmdeployments.kvscale.dev.yaml helm/kvscale/crds/llmdeployments.kvscale.dev.yaml

# The unit tests are pure and independent: one worker per core (on the 2-core CI machine, half the time).
test-unit: venv
	$(VENV)/bin/pytest -q -n auto tests/unit

testbed-build:
	bash tests/testbed/build.sh

testbed-up: venv testbed-build
	bash tests/testbed/up.sh

testbed-down:
	bash tests/testbed/down.sh

test-bed: venv testbed-build
	bash tests/testbed/run-bed-tests.sh

# The real vLLM run is its own target (CI runs it after `make test`): cold it adds about 6.5 minutes, which
# took a cold `make test` past its 60-minute budget on the 2-core machine (docs/testing.md).
test: lint typecheck test-unit test-bed

# A real vLLM (the CPU build from PyPI, in its own cached virtualenv) as one pod of an LLMDeployment on
# the bed; it rewrites the captured /metrics fixture that test-bed replays (tests/realvllm/README.md).
test-vllm: venv testbed-build
	bash tests/realvllm/install.sh
	KVSCALE_BED_TESTS=tests/realvllm KVSCALE_BED_LANES=1 KVSCALE_BED_TEST_TIMEOUT_S=900 bash tests/testbed/run-bed-tests.sh

# The operator image (Dockerfile) with Debian's podman and a base made from Debian packages.
image:
	bash image/build.sh

bench: venv
	$(PY) benchmarks/accuracy.py
	$(PY) benchmarks/model_vs_sim.py
	$(PY) benchmarks/kernel_steps.py
	$(PY) benchmarks/allreduce.py
	$(PY) benchmarks/gemm_shards.py
	$(PY) benchmarks/moe_kernels.py
	$(PY) benchmarks/capacity.py
	$(PY) benchmarks/planner_speed.py
	$(PY) benchmarks/autoscaling.py
	$(PY) benchmarks/forecasters.py

plan: venv
	@for f in examples/*.yaml; do echo "=== $$f"; $(VENV)/bin/kvscale plan -f $$f || exit 1; done

# The main demo: the operator autoscaling a simulated Llama-3.1-8B fleet through a trace-replayed load
# surge on the local test bed (started if needed, and stopped again only then); about five minutes.
demo: venv testbed-build
	$(PY) demo/run_demo.py

clean:
	rm -rf $(VENV) .testbed demo-out bench-out
