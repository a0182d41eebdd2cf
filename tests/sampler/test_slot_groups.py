"""Decode attention in slot groups (`paged_attention.in_slot_groups`): equal to one call.

jax's Pallas kernel prefetches one call's page table into 1 MiB of scalar memory, so the
engine attends more slots in groups; the groups must give the one-call output exactly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vapo_jax import compat
from vapo_jax.models import paged_attention as pa

from tpu_aot import NEEDS_LIBTPU  # pylint: disable=wrong-import-order


def _case(seed, s=7, h=4, k=2, dh=8, n=40, ps=4, m=5):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((s, h, dh)), jnp.float32)
  pages = jnp.asarray(rng.standard_normal((n, ps, 2 * k, dh)), jnp.float32)
  lens = rng.integers(1, m * ps + 1, size=s)
  lens[2] = 0  # an idle slot
  table = rng.permutation(n)[:s * m].reshape(s, m)
  return q, pages, jnp.asarray(lens, jnp.int32), jnp.asarray(table, jnp.int32)


def _ref(q, pages, lens, table):
  """jax's own reference of the Pallas kernel (one query per slot)."""
  s, _, dh = q.shape
  return compat.ragged_paged_attention_kernel().ref_ragged_paged_attention(
      q, pages, lens, table, jnp.arange(s + 1, dtype=jnp.int32),
      jnp.array([s], jnp.int32), sm_scale=1.0 / np.sqrt(dh))


def _pure(q, pages, lens, table):
  return pa.decode_attention(q, pages, lens, table, 2)


@pytest.mark.parametrize("attend", [_pure, _ref], ids=["pure_jax", "jax_reference"])
@pytest.mark.parametrize("group", [1, 2, 3, 6])
def test_groups_equal_one_call_exactly(attend, group):
  q, pages, lens, table = _case(0)
  jit = jax.jit if attend is _pure else (lambda f: f)  # jax's reference reads lens on host
  one = np.asarray(jit(attend)(q, pages, lens, table))
  got = np.asarray(jit(lambda *a: pa.in_slot_groups(attend, *a, group))(
      q, pages, lens, table))
  np.testing.assert_array_equal(got, one)
  if attend is _pure:
    assert np.all(one[2] == 0)  # the idle slot


def test_a_grouping_that_drops_or_shifts_slots_is_caught():
  """Mutants of `in_slot_groups`: every group attending with the first group's table and
  lengths, or the last slot left out, differ from one call (the case's slots are distinct)."""
  q, pages, lens, table = _case(1)
  one = np.asarray(_pure(q, pages, lens, table))

  def shifted(q, pages, lens, table, group):
    parts = [q[i:i + group] for i in range(0, q.shape[0], group)]
    return jnp.concatenate([_pure(x, pages, lens[:len(x)], table[:len(x)]) for x in parts])

  def dropped(q, pages, lens, table, group):
    s = q.shape[0] - 1
    return jnp.concatenate([_pure(q[i:min(i + group, s)], pages, lens[i:min(i + group, s)],
                                  table[i:min(i + group, s)]) for i in range(0, s, group)])

  assert not np.array_equal(np.asarray(shifted(q, pages, lens, table, 3)), one)
  assert dropped(q, pages, lens, table, 3).shape[0] != one.shape[0]
  np.testing.assert_array_equal(np.asarray(pa.in_slot_groups(_pure, q, pages, lens, table, 3)),
                                one)


def test_group_sizes_follow_the_kernels_scalar_memory():
  m = 1344  # qwen32b: ceil((1,024 + 20,480 - 1) / 16) pages per slot
  assert pa.slot_limit(m) == 182                       # 960 KiB / (4 · 1,344)
  assert pa.slot_group_of(128, m) == 128               # one call, as before
  assert pa.slot_group_of(256, m) == 128               # 4,096 slots / 16 replicas: 2 calls
  assert pa.slot_group_of(183, m) == 92                # just over: 2 calls of 92 and 91
  assert pa.slot_group_of(7, 4, limit=3) == 3          # 3 calls: 3, 3, 1
  for s in (1, 100, 182, 183, 256, 500, 1000):
    g = pa.slot_group_of(s, m)
    assert 4 * g * m <= pa.SMEM_TABLE_BYTES and -(-s // g) == -(-s // pa.slot_limit(m))
  # Groups lift the table limit; only a single row over scalar memory is refused.
  assert pa.table_refusal(256, m) is None and pa.table_refusal(4096, m) is None
  assert "one slot's page table row" in pa.table_refusal(1, 300_000)


@NEEDS_LIBTPU
def test_the_kernel_in_groups_compiles_where_one_call_overflows_scalar_memory():
  """256 slots × 1,344 pages (one v5p decode replica at 4,096 slots): one kernel call
  overflows the 1 MiB of scalar memory; the default slot groups (2 × 128) compile."""
  from vapo_jax.pod import slices
  devs = slices.devices(slices.parse("v5p-8"))
  s, m, n = 256, 1344, 64
  q = jax.ShapeDtypeStruct((s, 8, 128), jnp.bfloat16)
  pages = jax.ShapeDtypeStruct((n, 16, 2 * 2, 128), jnp.bfloat16)
  lens = jax.ShapeDtypeStruct((s,), jnp.int32)
  table = jax.ShapeDtypeStruct((s, m), jnp.int32)

  def compile_with(group):
    fn = jax.jit(lambda *a: pa.tpu_decode_attention(*a, pages_per_block=8, slot_group=group))
    with jax.default_device(devs[0]):
      return fn.lower(q, pages, lens, table).compile()

  text = compile_with(0).as_text()
  assert text.count("tpu_custom_call") >= 2, "two kernel calls of 128 slots"
  with pytest.raises(Exception, match="(?i)smem|exceed memory"):
    compile_with(s)   # the mutant: all 256 slots in one call
