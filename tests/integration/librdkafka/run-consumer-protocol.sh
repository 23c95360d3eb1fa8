#!/usr/bin/env bash
# librdkafka's own consumer-group tests with the consumer protocol (KIP-848) on, against
# one semel broker. Not part of CI (minutes per test). Usage:
#   tests/integration/librdkafka/run-consumer-protocol.sh LIBRDKAFKA_DIR [TEST ...]
# LIBRDKAFKA_DIR is a librdkafka checkout built with `./configure && make && make -C tests build`
# (its tests/test-runner). Each test runs alone (TESTS=NNNN) with TEST_CONSUMER_GROUP_PROTOCOL
# =consumer; a line per test goes to stdout and the logs to $OUT_DIR (default /tmp/rdk-cp).
set -u
RDK=${1:?librdkafka build directory}; shift
TESTS_LIST=${*:-"0018 0029 0030 0033 0045 0056 0089 0102 0106 0113 0116 0118 0130 0132 0153"}
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=python3
OUT_DIR=${OUT_DIR:-/tmp/rdk-cp}
PER_TEST_S=${PER_TEST_S:-300}
PORT=${PORT:-29092}
mkdir -p "$OUT_DIR"
DATA=$(mktemp -d)
PYTHONPATH=$REPO "$PY" -m semel broker start --data-dir "$DATA" --port "$PORT" --auto-create-topics \
  --default-partitions 4 --group-initial-rebalance-delay-ms 0 --flush-mode interval \
  > "$OUT_DIR/broker.log" 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null; wait $BROKER 2>/dev/null; rm -rf "$DATA"' EXIT
for _ in $(seq 60); do (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.5; done
cd "$RDK/tests"
export LD_LIBRARY_PATH="$RDK/src:$RDK/src-cpp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
printf 'bootstrap.servers=127.0.0.1:%s\ntest.timeout.multiplier=2\n' "$PORT" > test.conf
for t in $TESTS_LIST; do
  start=$(date +%s)
  TESTS=$t TEST_CONSUMER_GROUP_PROTOCOL=consumer TEST_KAFKA_VERSION=${TEST_KAFKA_VERSION:-4.0.0} \
    timeout "$PER_TEST_S" ./test-runner > "$OUT_DIR/$t.log" 2>&1
  rc=$?
  verdict=PASS; [ $rc -ne 0 ] && verdict=FAIL; [ $rc -eq 124 ] && verdict=TIMEOUT
  if [ $rc -eq 0 ] && grep -aq "SKIPPED =====" "$OUT_DIR/$t.log"; then
    verdict="PASS (some parts skipped)"
    grep -aqE "Test [0-9]{4}_[a-z0-9_]+ PASSED" "$OUT_DIR/$t.log" || verdict=SKIPPED
  fi
  echo "$t $verdict $(( $(date +%s) - start ))s"
done
