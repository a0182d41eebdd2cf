"""PromptIterator determinism, resume and host sharding; synthetic task."""

import json

import pytest

from vapo_jax import data
from vapo_jax import rewards
from vapo_jax.data import synthetic

EXAMPLES = [data.Example(f"p{i}", str(i), uid=str(i)) for i in range(23)]


def _uids(batch):
  return [e.uid for e in batch]


def test_deterministic_and_reshuffled_per_epoch():
  a = data.PromptIterator(EXAMPLES, 4, seed=3)
  b = data.PromptIterator(EXAMPLES, 4, seed=3)
  first = [_uids(next(a)) for _ in range(10)]
  assert first == [_uids(next(b)) for _ in range(10)]
  assert a.batches_per_epoch == 5  # 23 // 4 with drop_remainder.
  epoch0 = sum(first[:5], [])
  epoch1 = sum(first[5:10], [])
  assert len(set(epoch0)) == 20 and epoch0 != epoch1
  c = data.PromptIterator(EXAMPLES, 4, seed=4)
  assert [_uids(next(c)) for _ in range(5)] != first[:5]


def test_no_shuffle_keeps_order():
  it = data.PromptIterator(EXAMPLES, 5, shuffle=False, drop_remainder=False)
  assert sum((_uids(next(it)) for _ in range(5)), []) == [str(i) for i in range(23)]


@pytest.mark.parametrize("stop", [0, 3, 5, 7, 12])
def test_resume_exactly(stop):
  ref = data.PromptIterator(EXAMPLES, 4, seed=1)
  expected = [_uids(next(ref)) for _ in range(15)]
  it = data.PromptIterator(EXAMPLES, 4, seed=1)
  for _ in range(stop):
    next(it)
  state = json.loads(json.dumps(it.get_state()))  # Through a checkpoint.
  resumed = data.PromptIterator.from_state(EXAMPLES, state)
  assert [_uids(next(resumed)) for _ in range(15 - stop)] == expected[stop:]
  fresh = data.PromptIterator(EXAMPLES, 4, seed=1)
  fresh.set_state(state)
  assert _uids(next(fresh)) == expected[stop]


def test_state_mismatch_is_an_error():
  state = data.PromptIterator(EXAMPLES, 4, seed=1).get_state()
  with pytest.raises(ValueError, match="num_examples"):
    data.PromptIterator(EXAMPLES[:-1], 4, seed=1).set_state(state)
  with pytest.raises(ValueError, match="seed"):
    data.PromptIterator(EXAMPLES, 4, seed=2).set_state(state)


@pytest.mark.parametrize("hosts,drop", [(2, False), (3, False), (4, True), (3, True)])
def test_host_shards_are_disjoint_and_cover(hosts, drop):
  per_host = []
  for p in range(hosts):
    it = data.PromptIterator(EXAMPLES, 2, seed=7, process_index=p,
                             process_count=hosts, drop_remainder=drop,
                             num_epochs=1)
    per_host.append(sum((_uids(b) for b in it), []))
  seen = sum(per_host, [])
  assert len(seen) == len(set(seen))
  if drop:
    assert len({len(s) for s in per_host}) == 1  # Lockstep.
    assert len(seen) == 23 - 23 % (2 * hosts)
  else:
    assert sorted(seen, key=int) == [str(i) for i in range(23)]


def test_num_epochs_stops():
  it = data.PromptIterator(EXAMPLES, 10, num_epochs=2)
  assert len(list(it)) == 4


def test_synthetic_is_deterministic_disjoint_and_checkable():
  train = synthetic.arithmetic(300, "train", seed=0)
  assert train == synthetic.arithmetic(300, "train", seed=0)
  assert train != synthetic.arithmetic(300, "train", seed=1)
  test = synthetic.arithmetic(100, "test", seed=0)
  test_other_seed = synthetic.arithmetic(100, "test", seed=5)
  train_problems = {e.problem for e in train}
  assert not train_problems & {e.problem for e in test + test_other_seed}
  assert len(train_problems) == 300
  tok = data.CharTokenizer()
  for ex in train + test:
    assert len(ex.problem) <= 64 and len(ex.solution) <= 96
    assert ex.solution.endswith(f"\\boxed{{{ex.answer}}}")
    assert rewards.check_answer(ex.solution, ex.answer).correct
    assert tok.decode(tok.encode(ex.solution)) == ex.solution
    assert tok.unk_id not in tok.encode(ex.problem + ex.solution)


def test_synthetic_difficulty_and_errors():
  hard = synthetic.arithmetic(
      50, seed=0, spec=synthetic.ArithmeticSpec(min_steps=4, max_steps=4,
                                                max_operand=20))
  assert all(e.solution.count("\n") == 4 for e in hard)
  with pytest.raises(ValueError, match="distinct"):
    synthetic.arithmetic(100, spec=synthetic.ArithmeticSpec(
        min_steps=1, max_steps=1, max_operand=2, ops="+"))
  with pytest.raises(ValueError):
    synthetic.ArithmeticSpec(min_steps=3, max_steps=2)


def test_char_tokenizer():
  tok = data.CharTokenizer()
  ids = tok.encode("1+1=2\n", add_bos=True, add_eos=True)
  assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
  assert tok.decode(ids) == "1+1=2\n"
  assert tok.encode("é") == [tok.unk_id]
  assert max(tok.encode(tok.alphabet)) == tok.vocab_size - 1
  assert len({tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id}) == 4
