"""Research experiments built on vapo_jax (outside the package: they import it, never the reverse).

  experiments/ablation/          the paper's ablation table: runner, report, SFT band check
  experiments/value_mechanisms/  the value model's mechanisms against Monte-Carlo ground truth

Run from the repository root (`python -m experiments.ablation.ablate ...`), which puts the
root on the import path; each folder's README says what it asks and where its results are.
"""
