"""The value model: transformer backbone + float32 scalar head.

  V(s_t) = <hidden(s_t), w>,   w in R^D (float32), no bias   (`Critic`)
  V(s_t) = <hidden(s_t), w> + b,   b a float32 scalar         (`CriticWithBias`),

where hidden(s_t) is the final hidden state at the last token of state s_t.
For a row `concat(prompt left-padded to P, response)` the state before
response token t is everything up to column P + t - 1, so

  values[:, t] = V(s_t) = <hidden[:, P + t - 1], w>,   t in [0, R),

the same alignment as `policy.response_logprobs`. The head is stored like an
HF `*ForSequenceClassification` model with one label (`score.weight` [1, D]),
so critic checkpoints are HF reward-model directories and HF reward models
load as critics (the bias as `score.bias` [1], which transformers' classification heads
lack: it loads back here, and transformers warns that it is unused).

`HEAD` names the head's parameters: they are trained under LoRA too (`lora.split_trainable`)
and may take their own learning rate (`run.learners.optimizer`, optim.critic_head_lr).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp

from vapo_jax import hub
from vapo_jax import sharding as shd
from vapo_jax.models import hf_io
from vapo_jax.models import lora
from vapo_jax.models import safetensors_io as st_io
from vapo_jax.models.config import SUPPORTED, ModelConfig
from vapo_jax.models.transformer import Transformer, positions_from_mask

_SEQ_CLS = {k: v[0].replace("ForCausalLM", "ForSequenceClassification")
            for k, v in SUPPORTED.items()}
HEAD = lora.HEAD  # the value head's parameters (top-level names: "score", "score_bias")


class Critic(nnx.Module):
  """Backbone transformer (no LM head) and a float32 [D] value head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.backbone = Transformer(cfg, rngs=rngs, lm_head=False)
    self.score = nnx.Param(jnp.zeros((cfg.hidden_size,), jnp.float32),
                           out_sharding=("embed",), eager_sharding=False)

  def __call__(self, tokens_BxT: jax.Array, mask_BxT: jax.Array, *,
               positions_BxT: jax.Array | None = None,
               segment_ids_BxT: jax.Array | None = None) -> jax.Array:
    """Values of all prefixes, float32 [B, T]: out[:, i] = V(tokens[:, :i+1]).

    Padded rows: positions from the mask. Packed rows (`packing`): their restarting
    positions and segment ids (attention kept inside each segment), mask = segment ids > 0;
    out[r, j] is then the value of slot j's segment's prefix up to j.
    """
    mask_BxT = mask_BxT.astype(jnp.int32)
    positions = (positions_from_mask(mask_BxT) if positions_BxT is None
                 else positions_BxT.astype(jnp.int32))
    if segment_ids_BxT is None:
      hidden, _ = self.backbone(tokens_BxT, positions, mask_BxT)
    else:
      hidden, _ = self.backbone(tokens_BxT, positions, mask_BxT,
                                segment_ids_BxT=segment_ids_BxT.astype(jnp.int32))
    return self.head(hidden)

  def head(self, hidden_BxTxD: jax.Array) -> jax.Array:
    """V = <h, w>, float32 [B, T]."""
    return jnp.einsum("btd,d->bt", hidden_BxTxD.astype(jnp.float32), self.score[...])

  @classmethod
  def from_policy(cls, policy: Transformer, *, head_scale: float = 0.0,
                  rngs: nnx.Rngs | None = None) -> "Critic":
    """A critic whose backbone starts from `policy`, with a fresh head.

    The head is zeros (head_scale=0) or normal(0, head_scale / sqrt(D)). The
    backbone reuses the policy's arrays (immutable, so training one does not
    touch the other); an untied LM head is dropped. The head is placed on the
    mesh of the policy's embedding, replicated.
    """
    cfg = policy.cfg
    graphdef, state = nnx.split(
        nnx.eval_shape(lambda: cls(cfg, rngs=nnx.Rngs(0))))
    d = cfg.hidden_size
    if head_scale:
      rngs = rngs or nnx.Rngs(0)
      w = head_scale / d ** 0.5 * jax.random.normal(rngs.params(), (d,))
    else:
      w = jnp.zeros((d,), jnp.float32)
    sharding = getattr(policy.embed[...], "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
      w = jax.device_put(w, jax.sharding.NamedSharding(
          sharding.mesh, jax.sharding.PartitionSpec()))
    backbone = nnx.to_pure_dict(nnx.state(policy, nnx.Param))
    backbone.pop("lm_head", None)
    pure = {"backbone": backbone, "score": w}
    if "score_bias" in state:  # (CriticWithBias: b = 0, replicated like w)
      pure["score_bias"] = jax.device_put(jnp.zeros((), jnp.float32), getattr(w, "sharding", None))
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)

  @classmethod
  def from_pretrained(cls, path: str, *, mesh=None,
                      rules: shd.Rules = shd.DEFAULT_RULES,
                      param_dtype: Any = jnp.float32, dtype: Any = None,
                      **overrides) -> tuple["Critic", ModelConfig]:
    """Loads a critic from an HF directory.

    A `*ForSequenceClassification` directory with one label (a reward model,
    or a checkpoint written by `save_pretrained` below) gives its `score`
    head; a causal-LM directory (the policy) gives a fresh zero head and its
    `lm_head.weight` is ignored. `path` may also be a Hub id, `org/name[@revision]`
    (see `vapo_jax.hub`). With lora_rank > 0 (in overrides) fresh adapters are added
    to the loaded backbone.
    """
    path = hub.resolve(path, what="critic checkpoint")
    hf = hf_io.read_config(path)
    cfg = ModelConfig.from_hf(hf, param_dtype=param_dtype,
                              dtype=param_dtype if dtype is None else dtype,
                              **overrides)
    files = st_io.CheckpointFiles(path)
    if ("score.weight" in files
        and files.shape("score.weight") != (1, cfg.hidden_size)):
      raise ValueError(
          f"{path}: score.weight has shape {files.shape('score.weight')}; a "
          f"critic needs one label, i.e. (1, {cfg.hidden_size}).")
    mesh = hf_io.default_mesh() if mesh is None else mesh
    graphdef, abs_state = nnx.split(
        nnx.eval_shape(lambda: cls(lora.base_config(cfg), rngs=nnx.Rngs(0))))
    shardings = shd.state_shardings(abs_state, mesh, rules)
    state = hf_io.load_state(files, abs_state, shardings, _name,
                             ignore=(r"lm_head\.weight",),
                             zeros_if_missing=HEAD)
    return lora.attach(nnx.merge(graphdef, state), cfg, mesh, rules, seed=1), cfg


class CriticWithBias(Critic):
  """A critic whose head has a bias: V = <hidden, w> + b (w, b float32; b starts at 0).

  A bias lets the head carry the returns' mean without moving w along the hidden states'
  common direction (with SmolLM2's final-norm gains, Σ|g| ≈ 1,045, every Adam step on w
  moves all values together by ~lr·Σ|h_i|)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    super().__init__(cfg, rngs=rngs)
    self.score_bias = nnx.Param(jnp.zeros((), jnp.float32), out_sharding=(),
                                eager_sharding=False)

  def head(self, hidden_BxTxD: jax.Array) -> jax.Array:
    """V = <h, w> + b, float32 [B, T]."""
    return super().head(hidden_BxTxD) + self.score_bias[...]


def critic_type(head_bias: bool) -> type[Critic]:
  """The critic class of a run: `CriticWithBias` with model.critic_head_bias, else `Critic`."""
  return CriticWithBias if head_bias else Critic


def builder(cfg: ModelConfig, *, head_bias: bool, full: bool):
  """rngs -> a fresh critic on the policy's ModelConfig `cfg`: with a head bias, and
  without adapters when `full` (full fine-tuning, model.critic_lora=False); what the memory
  estimate and the compile check build abstractly."""
  cls, ccfg = critic_type(head_bias), lora.base_config(cfg) if full else cfg
  return lambda rngs: cls(ccfg, rngs=rngs)


def _name(path: str) -> tuple[str, str]:
  if path == "score":
    return "score.weight", hf_io.ROW
  if path == "score_bias":
    return "score.bias", hf_io.ROW
  if path.startswith("backbone/"):
    return hf_io.hf_name(path[len("backbone/"):])
  raise KeyError(f"No HF name for critic parameter {path!r}.")


def save_pretrained(critic: Critic, path: str, *, dtype: Any = None,
                    max_shard_bytes: int = 4 << 30) -> None:
  """Writes the critic as an HF `*ForSequenceClassification` dir (1 label).

  The score head is always stored in float32; LoRA adapters are merged into the weights.
  """
  if dtype is None and critic.cfg.lora_rank:
    dtype = critic.cfg.param_dtype  # (merged weights are float32)
  critic = lora.merged(critic)
  cfg = critic.cfg
  state = nnx.state(critic, nnx.Param)
  tensors = hf_io.state_tensors(state, _name, dtype, skip=HEAD)
  tensors["score.weight"] = lambda: hf_io.to_hf_layout(
      hf_io.ROW, hf_io.gather(critic.score[...]).astype("float32"))
  if isinstance(critic, CriticWithBias):
    tensors["score.bias"] = lambda: hf_io.to_hf_layout(
        hf_io.ROW, hf_io.gather(critic.score_bias[...]).astype("float32"))
  hf_cfg = cfg.to_hf(_SEQ_CLS[cfg.model_type])
  hf_cfg.update(num_labels=1, id2label={"0": "LABEL_0"},
                label2id={"LABEL_0": 0})
  if dtype is not None:
    hf_cfg["dtype"] = jnp.dtype(dtype).name
  hf_io.write_checkpoint(path, tensors, hf_cfg, max_shard_bytes)


def last_token_values(critic: Critic, tokens_BxL: jax.Array, mask_BxL: jax.Array,
                      prompt_len: int, lengths_B: jax.Array) -> jax.Array:
  """The scalar after each whole response, float32 [B]: out[b] = critic(...)[b, P + l_b − 1]

  (the value of the state that holds the full response: an outcome reward model's score;
  for l_b = 0 the prompt's last token).
  """
  v = critic(tokens_BxL, mask_BxL)
  last = prompt_len + jnp.asarray(lengths_B, jnp.int32) - 1
  return jnp.take_along_axis(v, last[:, None], axis=1)[:, 0]


def response_values(critic: Critic, tokens_BxL: jax.Array, mask_BxL: jax.Array,
                    prompt_len: int) -> jax.Array:
  """values[:, t] = V(s_t) = head(hidden[:, P + t - 1]), float32 [B, R].

  Same layout and alignment as `policy.response_logprobs`; entries at padded
  response positions are 0.
  """
  if prompt_len < 1:
    raise ValueError(f"prompt_len must be >= 1, got {prompt_len}.")
  v = critic(tokens_BxL, mask_BxL)[:, prompt_len - 1:-1]
  return v * mask_BxL[:, prompt_len:].astype(jnp.float32)



# ------------------------------------------------------------ standardised critic targets


class ReturnStats(NamedTuple):
  """Running statistics of the critic's targets (rl.value_norm="running").

  After batches 1..n with token-weighted return means m_k and second moments s_k:
    weight = 1 − d^n,   mean = Σ_k (1−d) d^(n−k) m_k,   sq = the same of s_k,
  so μ = mean / weight and σ² = sq / weight − μ² are bias-corrected EMAs (decay d) of the
  return's mean and variance; with no batch yet, μ = 0 and σ = 1 (the identity).

  Why running and not per batch: the values of a batch are un-standardised for its GAE
  before its returns may be used, so a per-batch (μ, σ) of the batch's own returns would
  put each response's own outcome into its baseline (a 1/B leak) and move every value of
  the batch with the batch's luck. The running statistics of earlier batches are known
  before the batch is drawn; they are updated with its returns right after its values are
  read (`run.trainer.Trainer.critic_targets`), and its targets are standardised by them.
  With the policy frozen (value pretraining) the returns' distribution is fixed and the
  EMA settles on it; in RL it follows the policy's drift at a horizon of ~1/(1 − d) batches.
  """
  weight: float = 0.0
  mean: float = 0.0
  sq: float = 0.0

  def scale(self, floor: float = 1e-3) -> tuple[float, float]:
    """(μ, σ), σ at least `floor` (a batch whose returns are all equal)."""
    if self.weight <= 0:
      return 0.0, 1.0
    mu = self.mean / self.weight
    var = max(self.sq / self.weight - mu * mu, 0.0)
    return mu, max(var ** 0.5, floor)


def update_stats(stats: ReturnStats, returns_BxR, mask_BxR, decay: float) -> ReturnStats:
  """`stats` after one more batch: its token-weighted mean and second moment of R (float64
  on the host; the two sums are reduced on the device)."""
  m = jnp.asarray(mask_BxR, jnp.float32)
  r = jnp.asarray(returns_BxR, jnp.float32)
  n, s1, s2 = (float(x) for x in jax.device_get((jnp.sum(m), jnp.sum(r * m),
                                                 jnp.sum(r * r * m))))
  if n <= 0:
    return stats
  return ReturnStats(decay * stats.weight + (1 - decay), decay * stats.mean + (1 - decay) * s1 / n,
                     decay * stats.sq + (1 - decay) * s2 / n)


def standardise(x_BxR: jax.Array, mask_BxR: jax.Array, stats: ReturnStats) -> jax.Array:
  """(x − μ) / σ on the real tokens, 0 elsewhere: returns (or values) in the critic's units."""
  mu, sigma = stats.scale()
  return (jnp.asarray(x_BxR, jnp.float32) - mu) / sigma * jnp.asarray(mask_BxR, jnp.float32)


def unstandardise(v_BxR: jax.Array, mask_BxR: jax.Array, stats: ReturnStats) -> jax.Array:
  """σ·v + μ on the real tokens, 0 elsewhere: the critic's outputs in units of the returns
  (what GAE and the metrics read). The inverse of `standardise` on the real tokens."""
  mu, sigma = stats.scale()
  return (sigma * jnp.asarray(v_BxR, jnp.float32) + mu) * jnp.asarray(mask_BxR, jnp.float32)


def in_return_units(critic: Critic, stats: ReturnStats) -> Critic:
  """A critic trained on standardised targets with its head rescaled to give V = σ·v + μ
  itself (w' = σ·w, b' = σ·b + μ): what workdir/critic holds, so that it loads anywhere as
  a critic in units of the returns. Needs the bias for μ: a bias-free critic comes back
  unchanged with a warning (its saved values stay standardised)."""
  mu, sigma = stats.scale()
  if (mu, sigma) == (0.0, 1.0):
    return critic
  if not isinstance(critic, CriticWithBias):
    warnings.warn("rl.value_norm without model.critic_head_bias: the saved critic's values are "
                  f"standardised (V = {sigma:.4g}·v + {mu:.4g}); add a head bias to save them "
                  "in units of the returns")
    return critic
  out = nnx.clone(critic)  # (its own Variables; the arrays, immutable, are shared)
  out.score[...] = sigma * critic.score[...]
  out.score_bias[...] = sigma * critic.score_bias[...] + mu
  return out

