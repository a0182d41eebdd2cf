"""Sizing a run for a TPU pod from a CPU: does it fit, and how long is a step.

  fitting, compile_check   AOT-compile every program for a slice (libtpu, no TPU), its peak
                           memory per chip; `python -m vapo_jax.pod.compile_check`
  programs                 the run's own programs at abstract shapes (the trainer's builders)
  hlo_stats, train_hlo,    collectives and overlap read from compiled HLO
  decode_hlo
  slices, archs, lengths   TPU slices by name, model architectures, response-length specs
  host_gap                 the engine's host work per decode chunk, timed on this CPU
  step/, step_model        the step model: FLOPs, bytes, collectives and time of one RL step
                           and its floor; `python -m vapo_jax.pod.step_model`

The pass sizes and prompt buckets come from `run.pass_sizes`, as the trainer's do.
"""
