# usage: memprobe.sh NAME [env...]: VAPO on the real config, 2 VP steps, 4 RL steps, no eval; RSS sampled
NAME=$1; shift
W=/tmp/memprobe/$NAME; rm -rf $W; mkdir -p $W
cd /work/main
env "$@" python -m vapo_jax.main --config=configs/smollm2_135m.py --workdir=$W --noprogress \
  --config.value_pretrain.max_steps=2 --config.value_pretrain.min_steps=2 --config.rl.steps=4 \
  --config.eval.every=0 --config.eval.num_examples=16 --config.eval.samples_per_problem=2 --config.checkpoint.every=0 > $W/log.txt 2>&1 &
PID=$!
while kill -0 $PID 2>/dev/null; do
  echo "$(date +%s) $(grep VmRSS /proc/$PID/status | awk '{print $2}')" >> $W/rss.log; sleep 5
done
echo done >> $W/rss.log
