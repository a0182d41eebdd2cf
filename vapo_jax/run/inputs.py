"""What a run reads: the tokenizer and prompt template (`Text`), the train and held-out
examples, and the SFT stage's teacher-forcing batches.

Everything that reads files happens here or in `run.networks`, before any train step is
compiled, so a missing file or a bad data row fails the run at once with a message naming it.
"""

import dataclasses
from typing import Any, Callable

import numpy as np

from vapo_jax import data as data_lib
from vapo_jax.models import hf_io


@dataclasses.dataclass(frozen=True)
class Text:
  """How text becomes tokens and back for one run."""
  encode: Callable[[str], list[int]]    # text -> ids, no special tokens
  decode: Callable[[list[int]], str]
  bos_ids: tuple[int, ...]              # put before every prompt
  template: data_lib.PromptTemplate
  eos_ids: tuple[int, ...]
  pad_id: int
  vocab_size: int                       # tokens the tokenizer knows (≤ embedding rows)

  def prompt_ids(self, problem: str) -> list[int]:
    return list(self.bos_ids) + self.encode(self.template.apply(problem))


def build_text(cfg) -> Text:
  """The tokenizer and prompt template named by the config."""
  fmt = cfg.data.template
  if cfg.model.tokenizer == "char":
    tok = data_lib.CharTokenizer()
    template = data_lib.PromptTemplate(format=fmt)
    return Text(encode=tok.encode, decode=tok.decode, bos_ids=(tok.bos_id,),
                template=template, eos_ids=(tok.eos_id,), pad_id=tok.pad_id,
                vocab_size=tok.vocab_size)
  tok = hf_io.load_tokenizer(cfg.model.hf_path)
  template = (data_lib.PromptTemplate.from_chat_template(tok, fmt) if cfg.data.chat_template
              else data_lib.PromptTemplate(format=fmt))
  eos = tok.eos_token_id
  eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
  pad = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
  return Text(encode=lambda s: tok.encode(s, add_special_tokens=False),
              decode=lambda ids: tok.decode(ids, skip_special_tokens=True),
              bos_ids=(() if tok.bos_token_id is None or cfg.data.chat_template
                       else (int(tok.bos_token_id),)),
              template=template, eos_ids=eos_ids, pad_id=int(pad), vocab_size=len(tok))


def build_examples(cfg, text: Text) -> tuple[list, list, dict]:
  """Train and held-out examples whose prompts fit the budget, and what was dropped."""
  d = cfg.data
  if d.source == "synthetic" and d.synthetic_task == "chain_or_guess":
    spec = mix_spec(d)
    train = data_lib.chain_mix.chain_or_guess(d.num_train, "train", cfg.data_seed, spec)
    test = data_lib.chain_mix.chain_or_guess(d.num_eval, "test", cfg.data_seed, spec)
  elif d.source == "synthetic" and d.synthetic_task == "word":
    spec = data_lib.word_problems.WordSpec(
        min_ops=d.synthetic_min_steps, max_ops=d.synthetic_max_steps,
        max_operand=d.synthetic_max_operand, ops=d.synthetic_ops)
    train = data_lib.word_problems.word_problems(d.num_train, "train", cfg.data_seed, spec)
    test = data_lib.word_problems.word_problems(d.num_eval, "test", cfg.data_seed, spec)
  elif d.source == "reasoning_gym":
    spec = data_lib.reasoning_gym.RGSpec.parse(d.rg_arms, d.rg_weights, d.rg_drop_shortcuts)
    train, test = data_lib.reasoning_gym.splits(d.num_train, d.num_eval, cfg.data_seed, spec)
  elif d.source == "synthetic":
    task = {"arithmetic": (data_lib.synthetic.ArithmeticSpec, data_lib.synthetic.arithmetic),
            "chain": (data_lib.chain.ChainSpec, data_lib.chain.chains)}[d.synthetic_task]
    extra = {"max_value": d.synthetic_max_value} if d.synthetic_task == "chain" else {}
    spec = task[0](min_steps=d.synthetic_min_steps, max_steps=d.synthetic_max_steps,
                   max_operand=d.synthetic_max_operand, ops=d.synthetic_ops, **extra)
    train = task[1](d.num_train, "train", cfg.data_seed, spec)
    test = task[1](d.num_eval, "test", cfg.data_seed, spec)
  else:
    load = {"jsonl": data_lib.load_jsonl, "parquet": data_lib.load_parquet,
            "tfds": data_lib.load_tfds, "hf": data_lib.load_hf}[d.source]

    def kwargs(layout, split=None, config=None):
      out = {"layout": layout} if layout else {}
      if d.source == "hf":
        out.update(split=split, config=config or None)
      if d.problem_field:
        out["problem_field"] = d.problem_field
      if d.answer_field:
        out["answer_field"] = d.answer_field
      return out

    train = load(d.train_path, **kwargs(d.layout, d.train_split, d.hf_config))[:d.num_train]
    test = (load(d.eval_path, **kwargs(d.eval_layout or d.layout, d.eval_split,
                                       d.eval_hf_config or d.hf_config))[:d.num_eval]
            if d.eval_path else [])
  stats = {}
  kept = []
  for name, examples in (("train", train), ("eval", test)):
    if not examples:
      kept.append([])
      continue
    f = data_lib.filter_by_length(examples, lambda s: text.bos_ids + tuple(text.encode(s)),
                                  d.max_prompt_tokens, text.template)
    stats[f"data/{name}_dropped_too_long"] = f.dropped
    kept.append(f.examples)
  return kept[0], kept[1], stats


def mix_spec(d) -> "data_lib.chain_mix.MixSpec":
  """The chain_or_guess mixture of a config's data section."""
  chain = data_lib.chain

  def kind(lo, hi):
    return chain.ChainSpec(min_steps=lo, max_steps=hi, max_operand=d.synthetic_max_operand,
                           max_value=d.synthetic_max_value, ops=d.synthetic_ops)

  return data_lib.chain_mix.MixSpec(
      short=kind(d.synthetic_min_steps, d.synthetic_max_steps),
      long=kind(d.synthetic_long_min_steps, d.synthetic_long_max_steps),
      short_fraction=d.synthetic_short_fraction, guess_fraction=d.synthetic_guess_fraction)


def sft_batch(examples, text: Text, prompt_len: int, response_len: int) -> dict[str, Any]:
  """Teacher-forcing batch of prompt + solution + EOS (solutions cut to response_len)."""
  b = len(examples)
  tokens = np.full((b, prompt_len + response_len), text.pad_id, np.int32)
  mask = np.zeros((b, prompt_len + response_len), np.float32)
  for i, ex in enumerate(examples):
    if ex.solution is None:
      raise ValueError(f"example {ex.uid!r} has no solution to learn from in the SFT stage")
    p = text.prompt_ids(ex.problem)
    r = (text.encode(ex.solution) + [text.eos_ids[0]])[:response_len]
    tokens[i, prompt_len - len(p):prompt_len] = p
    mask[i, prompt_len - len(p):prompt_len] = 1
    tokens[i, prompt_len:prompt_len + len(r)] = r
    mask[i, prompt_len:prompt_len + len(r)] = 1
  return {"tokens_BxL": tokens, "mask_BxL": mask,
          "response_mask_BxR": mask[:, prompt_len:].copy()}
