#!/usr/bin/env bash
# A/B of two source trees side by side: both servers on CPU 0, wrk on CPU 1, loaded alternately.
# usage: benchmarks/ab_servers.sh OLD_SRC BODY_FILE URL_PATH CONCURRENCY SECONDS ROUNDS
#   OLD_SRC: the src/ folder of the baseline (e.g. from `git worktree add /tmp/old HEAD~1`);
#   the working tree's code is B. Models: benchmarks/out/models (bench_core.py writes them).
set -euo pipefail
cd "$(dirname "$0")/.."
old_src=$1 body=$2 path=$3 conc=$4 seconds=$5 rounds=$6
serve() {  # port, extra env
  env "$2" taskset -c 0 .venv/bin/python -m ortserve serve --model-repository benchmarks/out/models \
    --http-port "$1" --intra-op-threads 1 --grpc-port -1 --metrics-port -1 --log-level WARNING &
}
serve 8124 "PYTHONPATH=$old_src"
serve 8125 "ORTSERVE_AB=new"
trap 'kill $(jobs -p) 2>/dev/null' EXIT
for port in 8124 8125; do
  until curl -sf "http://127.0.0.1:$port/v2/health/ready" >/dev/null; do sleep 0.2; done
done
for _ in $(seq "$rounds"); do
  for port in 8124 8125; do
    label=$([ "$port" = 8124 ] && echo A-old || echo B-new)
    echo -n "$label "
    BODY=$body URL_PATH=$path taskset -c 1 wrk -t1 -c"$conc" -d"$seconds"s --latency -s benchmarks/post.lua \
      "http://127.0.0.1:$port" | grep -E "Requests/sec|50%|99%" | tr -s ' ' | tr '\n' ' '
    echo
  done
done
