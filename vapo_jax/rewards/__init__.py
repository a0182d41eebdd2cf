"""Rewards: a safe, exact math answer checker and reward-function plug-ins.

`check_answer` judges one response in-process; `RewardScorer` scores a whole
rollout batch in worker processes with a hard time limit per check.
"""

from vapo_jax.rewards.math import check_answer
from vapo_jax.rewards.math import CheckOptions
from vapo_jax.rewards.math import score
from vapo_jax.rewards.math import score_lenient
from vapo_jax.rewards.math import Verdict
from vapo_jax.rewards.plugins import DEFAULT_REWARD_FN
from vapo_jax.rewards.plugins import fn_for_mode
from vapo_jax.rewards.plugins import LENIENT_REWARD_FN
from vapo_jax.rewards.plugins import load_reward_fn
from vapo_jax.rewards.plugins import to_score
from vapo_jax.rewards.scorer import BatchScores
from vapo_jax.rewards.scorer import RewardScorer
from vapo_jax.rewards.scorer import ScorerView

__all__ = [
    "BatchScores",
    "CheckOptions",
    "DEFAULT_REWARD_FN",
    "LENIENT_REWARD_FN",
    "RewardScorer",
    "ScorerView",
    "Verdict",
    "check_answer",
    "fn_for_mode",
    "load_reward_fn",
    "score",
    "score_lenient",
    "to_score",
]
