# Fresh machine: `make demo` and `make test` install everything they need into .venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_STORE ?= demo-models
TARGET ?= synth-target
DRAFT ?= synth-draft
BENCH_ARGS ?=
# cpu, cuda, metal, rocm, or auto: what this machine has (scripts/install-backend.sh)
BACKEND ?= auto

.PHONY: install demo test bench bench-auto-k serve gpu-bench gpu-bundle gpu-prebuilt clean

# The backend check runs every time: a build made for the wrong backend is replaced.
install: $(VENV)/.installed
	@scripts/install-backend.sh $(BIN)/python $(BACKEND)

# A step's output goes to $(VENV)/logs/NAME.log; the screen gets one progress line, and the log's last
# lines if it fails (scripts/build_progress.py). [test] holds the server and bench extras: every command.
# --no-compile: Python compiles each module when it is first imported instead, which halves pip's
# CPU time here (26 s -> 12 s for '.[test]' on 2 cores), most of it for modules nothing here imports.
step = $(PYTHON) scripts/build_progress.py --log $(VENV)/logs/$(1).log --label "$(2)" --

$(VENV)/.installed: pyproject.toml
	@$(call step,venv,creating $(VENV)) $(PYTHON) -m venv $(VENV)
	@$(call step,pip,upgrading pip) $(BIN)/python -m pip install --no-compile --upgrade pip
	@scripts/install-backend.sh $(BIN)/python $(BACKEND)
	@$(call step,ollama-spec,installing ollama-spec and its dependencies) $(BIN)/python -m pip install --no-compile -e '.[test]'
	@touch $@

DEMO_PROMPT ?= Explain the difference between a process and a thread.
# -k auto: what generate does without -k; the target alone first (--compare), then the pair

demo: install
	$(BIN)/ollama-spec demo-store $(DEMO_STORE)
	OLLAMA_MODELS=$(DEMO_STORE) $(BIN)/ollama-spec list
	OLLAMA_MODELS=$(DEMO_STORE) $(BIN)/ollama-spec pair $(TARGET) $(DRAFT)
	OLLAMA_MODELS=$(DEMO_STORE) $(BIN)/ollama-spec generate $(TARGET) --draft $(DRAFT) -k auto -t 0 -n 128 --compare "$(DEMO_PROMPT)" < /dev/null
	@echo "try next: make serve  (this pair behind OpenAI- and Ollama-compatible APIs, http://127.0.0.1:$(PORT))"
	@echo "          OLLAMA_MODELS=$(DEMO_STORE) $(BIN)/ollama-spec chat $(TARGET) --draft $(DRAFT)"
	@echo "          $(BIN)/ollama-spec generate MODEL --draft auto --compare \"a prompt\"  (MODEL: one your Ollama pulled)"

# Benchmark: the synthetic 0.6B F16 pair by default, in process; then 1, 2, 4 and 8 clients at once in process
# (no HTTP) beside the ceiling an ideal schedule reaches, and served to as many clients; `make bench
# TARGET=llama3.1:70b DRAFT=llama3.2:1b` for real models in your Ollama store. With llama.cpp's own server
# built (scripts/build-native-speculative.sh), it is served and timed the same way after ours, with the same draft.
LLAMA_SERVER ?= $(wildcard build/native/bin/llama-server)
bench: install
	@if [ "$(TARGET)" = "synth-target" ]; then $(BIN)/ollama-spec demo-store $(DEMO_STORE); fi
	$(if $(filter synth-target,$(TARGET)),OLLAMA_MODELS=$(DEMO_STORE)) $(BIN)/ollama-spec bench $(TARGET) --draft $(DRAFT) --out bench-results $(BENCH_ARGS)
	$(if $(filter synth-target,$(TARGET)),OLLAMA_MODELS=$(DEMO_STORE)) $(BIN)/ollama-spec bench $(TARGET) --draft $(DRAFT) --concurrency 8 --in-process --max-tokens 96 --ctx 2048 --out bench-results
	$(if $(filter synth-target,$(TARGET)),OLLAMA_MODELS=$(DEMO_STORE)) LLAMA_SERVER=$(LLAMA_SERVER) CLIENTS="1 2 4 8" CEILING=bench-results/results-concurrent.json scripts/bench-serve.sh $(BIN) $(TARGET) $(DRAFT)

# -k auto on three synthetic pairs it was not tuned on (strong, weak, quantized draft), and the hybrid
# on the rewrite prompts: scripts/bench-auto-k.sh (about 15 minutes on 2 cores).
bench-auto-k: install
	scripts/bench-auto-k.sh $(BIN)

# The OpenAI- and Ollama-compatible server on the demo pair: http://127.0.0.1:$(PORT) (Ctrl-C stops it).
PORT ?= 8000
SERVE_ARGS ?=
serve: install
	@if [ "$(TARGET)" = "synth-target" ]; then $(BIN)/ollama-spec demo-store $(DEMO_STORE); fi
	$(if $(filter synth-target,$(TARGET)),OLLAMA_MODELS=$(DEMO_STORE)) $(BIN)/ollama-spec serve $(TARGET) --draft $(DRAFT) --port $(PORT) $(SERVE_ARGS)

# GPU benchmark (docs/benchmark.md): make the bundle here, run gpu-bench on the GPU machine; `make gpu-bench
# GPU_BENCH_FLAGS="--cpu --tiny"` runs the same steps on any machine.
GPU_BENCH_FLAGS ?=
gpu-bundle: install
	scripts/make-gpu-bundle.sh

# the CUDA build compiled here (needs nvcc; ~45 minutes on 2 cores), so the GPU machine compiles nothing
gpu-prebuilt: gpu-bundle
	scripts/make-gpu-prebuilt.sh

gpu-bench:
	scripts/gpu-bench.sh $(GPU_BENCH_FLAGS)

# lint first (ruff's rules as pinned in pyproject.toml), then the whole suite
test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) $(DEMO_STORE) .pytest_cache
