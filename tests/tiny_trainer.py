"""The tiny trainer config the run's tests share, one RL step of it, and a tree comparison.

`tiny()` is a one-layer model on the synthetic task with the `trainer_plugins:even_digits`
reward (tests/ is on sys.path, see conftest.py); `tiny(**{"rl.steps": 3})` overrides a field.
"""

import jax
import numpy as np

from vapo_jax import config as config_lib
from vapo_jax.run import trainer as trainer_lib


def tiny(**overrides):
  """The tiny Config, with `{"section.field": value}` overrides."""
  c = config_lib.default_config_dict()
  c.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                 num_kv_heads=1, head_dim=16)
  c.data.update(max_prompt_tokens=32, num_train=64, num_eval=8)
  c.sampling.max_new_tokens = 8
  c.reward.fn = "trainer_plugins:even_digits"
  c.optim.update(policy_lr=1e-3, critic_lr=1e-3)
  c.value_pretrain.update(enabled=True, max_steps=1, min_steps=1)
  c.rl.update(steps=1, prompts_per_step=8, responses_per_prompt=2, num_minibatches=2,
              micro_batch_size=4, nll_threshold=1.0)
  c.eval.update(num_examples=8, samples_per_problem=2, batch_prompts=8)
  for dotted, value in overrides.items():
    section, name = dotted.split(".")
    c[section][name] = value
  return config_lib.from_config_dict(c)


def run_rl_step(cfg):
  """Value pretraining then RL; returns (policy params, critic params, last RL record)."""
  t = trainer_lib.Trainer(cfg, progress=False)
  try:
    t.value_pretrain()
    history = t.rl()["history"]
    return (jax.device_get(t.state.train_state("policy").params),
            jax.device_get(t.state.train_state("critic").params), history[-1])
  finally:
    t.close()


def assert_trees_close(a, b, atol):
  """Leaf by leaf |a - b| <= atol + 1e-4 |b|."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=1e-4)
