"""The user commands: `evaluate`, `export`, `import_gguf`, `plot`, `compare`
(`python -m vapo_jax.tools.evaluate`, …). The pod sizing tools are in `vapo_jax.pod`; their
old command names here (`compile_check`, `step_model`, `train_hlo`, `decode_hlo`) still run
them until the next release, after a one-line notice (`moved`)."""
