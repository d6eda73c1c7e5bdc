#!/bin/sh
# The verifier of examples/run_harness_tasks.jsonl for `rlproxy run --harness ...`: run in the attempt's working
# folder afterwards with the task in $RLPROXY_TASK; its exit status is the reward (0: 1.0, else 0.0).
expect=$(python3 -c 'import json, os; print(json.loads(os.environ["RLPROXY_TASK"])["expect"])')
for file in hello.txt answer.txt; do
    [ -f "$file" ] && [ "$(tr -d '[:space:]' < "$file")" = "$expect" ] && exit 0
done
exit 1
