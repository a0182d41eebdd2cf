"""The forward passes of a rollout batch: old log-probs and values (steps 1–3 of an RL step).

They score a whole rollout before the update, with the weights that sampled it; the train
steps (`rl.update`) run the same model code inside their losses. Kept apart from the update
so that rollout-time code (`rl.experience`, `run.forwards`) does not import the train steps.

Each is written once over the rows a row layout gives it (`rl.layout`: `layout.forward(name,
partial(fn, graphdef), ...)` jits it, runs it in micro-batches and plans packed rows).

Shapes: B rows, P prompt columns (left-padded), R response columns, L = P + R.
"""

from flax import nnx


def policy_logprobs(graphdef, params, rows, *, temperature: float, vocab_chunk: int = 128):
  """Teacher-forced log-probs and entropies of the response tokens, [B, R] each."""
  return rows.logprobs(nnx.merge(graphdef, params), temperature=temperature, chunk=vocab_chunk)


def critic_values(graphdef, params, rows):
  """V(s_t) for every response token, [B, R]."""
  return rows.values(nnx.merge(graphdef, params))
