"""A user's evaluation script as the command gate runs it, whose score the test decides: it asks the model it
is given one question through the `openai` SDK (OPENAI_BASE_URL and OPENAI_API_KEY come from the gate), checks
that model answered, appends the model's name to $RUNS_FILE, and prints the score $SCORES (JSON) gives that
model. `--mode` (for `--only` one model) makes it
misbehave the ways a real script can."""
import argparse
import json
import os
import sys
import time

import openai

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--split", required=True)
parser.add_argument("--mode", default="ok", choices=["ok", "exit", "garbage", "hang"])
parser.add_argument("--only", default=None, help="misbehave for this model only")
args = parser.parse_args()
if args.only is not None and args.model != args.only:
    args.mode = "ok"

reply = openai.OpenAI().chat.completions.create(model=args.model, messages=[{"role": "user", "content": "2+2?"}],
                                                max_tokens=4)
assert reply.choices[0].message.content, reply
with open(os.environ["RUNS_FILE"], "a") as runs:
    runs.write(f"{args.model} {args.split}\n")
print(f"asked {args.model}: {reply.choices[0].message.content!r}")  # a line of output for the trainer's log
if args.mode == "exit":
    print("could not reach the grader", file=sys.stderr)
    sys.exit(3)
if args.mode == "garbage":
    print("score: 0.9")
    sys.exit(0)
if args.mode == "hang":
    time.sleep(60)
print(json.dumps({"score": json.loads(os.environ["SCORES"])[args.model], "n": 20}))
