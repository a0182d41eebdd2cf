#!/usr/bin/env bash
# Mutation testing of the numerical core with mutmut 2 (`pip install "mutmut>=2.5,<3"`).
#
#   .ci/mutation.sh [MINUTES_PER_FILE] [FILE ...]     (default: 10 minutes, every file below)
#
# Each file is mutated in its own scratch copy of the working tree (the tree itself is never
# touched), and each mutant runs that file's fast tests in a fresh Python process, stopping at
# the first failure (mutmut 2 runs the runner as a subprocess: no fork after jax starts, no
# stale jit cache). A file whose time runs out reports the mutants it reached, in file order.
# Per file it prints killed / survived / timed out / untested and the surviving rate, then the
# survivors' diffs: a survivor is a change to the code that no test noticed. mutmut 3 is not
# used: it forks its workers after importing the code under test, which jax does not survive.
set -uo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}; shift || true
declare -A TESTS=(
  [vapo_jax/gae.py]="tests/rl/test_gae.py"
  [vapo_jax/losses.py]="tests/rl/test_losses.py"
  [vapo_jax/rl/advantages.py]="tests/config/test_config.py tests/rl/test_gae.py tests/rl/test_rl_advantages.py"
  [vapo_jax/rl/update.py]="tests/rl/test_rl_update.py"
  [vapo_jax/rl/train_state.py]="tests/rl/test_rl_update.py"
  [vapo_jax/run/checkpoint_store.py]="tests/run/test_checkpoint.py"
  [vapo_jax/rewards/scorer.py]="tests/rewards/test_rewards_scorer.py"
  [vapo_jax/run/evaluation.py]="tests/run/test_evaluation.py"
)
files=("$@"); [ ${#files[@]} -gt 0 ] || files=("${!TESTS[@]}")
for f in "${files[@]}"; do
  scratch=$(mktemp -d /tmp/mutation.XXXX)
  git ls-files -co --exclude-standard | tar -cT - | tar -x -C "$scratch"
  echo "== $f (${minutes} min cap; runner: pytest -x ${TESTS[$f]})"
  (cd "$scratch" && timeout "$((minutes * 60))" mutmut run --paths-to-mutate "$f" \
     --runner "python -m pytest -x -q -p no:cacheprovider ${TESTS[$f]}" >/dev/null 2>&1
   python - "$f" <<'PY'
import sqlite3, sys
rows = sqlite3.connect(".mutmut-cache").execute(
    "select m.id, m.status from Mutant m").fetchall()
count = lambda s: sum(st == s for _, st in rows)
killed, survived = count("ok_killed"), count("bad_survived")
timeout, tested = count("bad_timeout"), len(rows) - count("untested")
rate = survived / max(tested, 1)
print(f"{sys.argv[1]}: {len(rows)} mutants, {tested} tested: {killed} killed, "
      f"{survived} survived, {timeout} timed out, {count('ok_suspicious')} suspicious, "
      f"{count('untested')} untested; surviving rate {rate:.0%} of those tested")
PY
   for id in $(python -c "import sqlite3; print(*[i for i, in sqlite3.connect('.mutmut-cache').execute(\"select id from Mutant where status='bad_survived'\")])"); do
     echo "--- survivor $id"; mutmut show "$id" 2>/dev/null | grep '^[-+][^-+]'
   done)
  rm -rf "$scratch"
done
