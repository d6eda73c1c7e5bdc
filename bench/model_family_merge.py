"""How often a family's chat template lets the trainer merge a multi-turn tool rollout into one sequence, measured
on the kit's real tokenizers and templates (testkit/model_kit) without an engine: each call's prompt is what the
template renders for the history so far, each completion is the tokenization of what the model wrote (then the
family's end-of-turn token), and trainer/transitions.py's `merge_trajectory` (the exact-prefix rule the trainer
applies) turns the calls into sequences.

    .venv/bin/python bench/model_family_merge.py            # writes bench/results/model_family_merge.txt

Per family, rollout shape and how the model writes its tool-call JSON, it prints the merge ratio (calls per
trained sequence), the tokens the trainer reads per call (every sequence's prompt and completion, against one
merged sequence of the whole rollout), and for the alternative, a merge by content (the last call's whole
sequence as context, training only the earlier completions whose sampled ids appear in it unchanged, every
other call as a sequence of its own), the share of sampled tokens that alternative could still train in the
merged sequence and what it reads per call.

Shapes: `tools` is one user question then N tool rounds then an answer (the agent loop of a tool-using agent);
`chat` is several user turns of a few tool rounds each. JSON: `spaced` is `{"expr": "1+2"}` (what the template's
`tojson` writes back), `compact` is `{"expr":"1+2"}` (a model that writes no spaces): vLLM hands the template the
parsed arguments, so the history always holds the spaced form. gpt-oss writes its call's header as harmony's
documentation shows it (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`), after its
analysis, and its answer on the final channel ending in `<|return|>`.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.model_kit import build_model  # noqa: E402
from trainer.transitions import merge_trajectory  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate an arithmetic expression.",
                                           "parameters": {"type": "object",
                                                          "properties": {"expr": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object",
                                                          "properties": {"word": {"type": "string"},
                                                                         "lang": {"type": "string"}}}}}]
SYSTEM = "You solve problems with the tools. Think first, then call one tool or answer."
FAMILIES = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "chatml": "<|im_end|>", "gpt-oss": "<|call|>"}
ANSWER_END = {"gpt-oss": "<|return|>"}  # an answer's end where it is not a call's


def arguments(rng: random.Random) -> tuple[str, dict]:
    if rng.random() < 0.5:
        return "calc", {"expr": f"{rng.randint(2, 999)}*{rng.randint(2, 99)}+{rng.randint(1, 9)}"}
    return "lookup", {"word": rng.choice(["otter", "heron", "lynx", "vole"]), "lang": rng.choice(["en", "de"])}


def sampled_text(family: str, name: str, args: dict, style: str, thought: str) -> str:
    """What the model writes for a call: the family's call syntax, its JSON spaced or compact."""
    text = json.dumps(args) if style == "spaced" else json.dumps(args, separators=(",", ":"))
    if family == "llama3":
        return f'{{"name": "{name}", "parameters": {text}}}'
    if family == "gpt-oss":  # the call's header as gpt-oss writes it (the recipient in the channel's header)
        return (f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant<|channel|>commentary "
                f"to=functions.{name} <|constrain|>json<|message|>{text}")
    call = f'<tool_call>\n{{"name": "{name}", "arguments": {text}}}\n</tool_call>'
    return f"<think>\n{thought}\n</think>\n\n{call}" if family == "qwen3" else call


def answer_text(family: str, thought: str, value: str) -> str:
    if family == "gpt-oss":
        return (f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant<|channel|>final<|message|>"
                f"The answer is {value}.")
    return f"<think>\n{thought}\n</think>\n\nThe answer is {value}." if family == "qwen3" else f"The answer is {value}."


def rollout(tokenizer, family: str, shape: str, turns: int, style: str, seed: int) -> list[dict]:
    """One rollout's calls as the trainer reads them."""
    rng = random.Random(seed)
    end = tokenizer.convert_tokens_to_ids(FAMILIES[family])
    users, rounds = (1, turns) if shape == "tools" else (max(1, turns // 4), 3)
    history = [{"role": "system", "content": SYSTEM}]
    calls = []

    def call(text: str, answer: bool = False) -> None:
        prompt = tokenizer.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, tokenize=False,
                                               date_string="02 Dec 2026", conversation_date="2026-12-02")
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        last = tokenizer.convert_tokens_to_ids(ANSWER_END[family]) if answer and family in ANSWER_END else end
        completion = tokenizer(text, add_special_tokens=False)["input_ids"] + [last]
        calls.append({"call_id": f"c{len(calls)}", "prompt_ids": prompt_ids, "completion_ids": completion,
                      "logprobs": [-0.5] * len(completion), "extends_previous": bool(calls), "advantage": 1.0,
                      "rollout_id": "r", "sampled": None})

    for user in range(users):
        history.append({"role": "user", "content": f"Question {user + 1}: work out the code for case {seed}."})
        for index in range(rounds):
            name, args = arguments(rng)
            thought = f"Step {index + 1}: I need {name} for this."
            call(sampled_text(family, name, args, style, thought))
            call_id = f"call_{user}_{index}"
            history.append({"role": "assistant", "content": "", "reasoning_content": thought,
                            "tool_calls": [{"id": call_id, "type": "function",
                                            "function": {"name": name, "arguments": args}}]})
            history.append({"role": "tool", "tool_call_id": call_id, "content": str(rng.randint(10, 99999))})
        thought, value = "All parts are known.", str(rng.randint(1, 999))
        call(answer_text(family, thought, value), answer=True)
        history.append({"role": "assistant", "content": f"The answer is {value}.", "reasoning_content": thought})
    return calls


def contains_at(sequence: list[int], part: list[int], start: int) -> int:
    """Where `part` occurs in `sequence` at or after `start` (-1: nowhere)."""
    for at in range(start, len(sequence) - len(part) + 1):
        if sequence[at:at + len(part)] == part:
            return at
    return -1


def measure(calls: list[dict]) -> dict:
    sequences = merge_trajectory(calls, max_seq_len=1 << 20)
    read = sum(len(t) for t in sequences)
    last = calls[-1]
    final = last["prompt_ids"] + last["completion_ids"]
    sampled = sum(len(c["completion_ids"]) for c in calls)
    # content merge: earlier completions (without their end token) found unchanged in the final sequence
    kept, cursor, separate = len(last["completion_ids"]), 0, 0
    for c in calls[:-1]:
        at = contains_at(final, c["completion_ids"][:-1], cursor)
        if at >= 0:
            kept += len(c["completion_ids"])
            cursor = at + len(c["completion_ids"]) - 1
        else:
            separate += len(c["prompt_ids"]) + len(c["completion_ids"])
    return {"calls": len(calls), "sequences": len(sequences), "read": read, "ideal": len(final),
            "sampled": sampled, "content_kept": kept, "content_read": len(final) + separate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, nargs="+", default=[8, 30])
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "model_family_merge.txt")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from engine.model import default_model_path

    folders = {"qwen3": build_model("qwen3"), "llama3": build_model("llama3"), "gpt-oss": build_model("gpt-oss"),
               "chatml": default_model_path()}
    header = (f"{'family':7} {'shape':5} {'turns':>5} {'json':7} {'calls':>5} {'seqs':>5} {'merge':>6} "
              f"{'read/call':>9} {'x ideal':>7} | {'content: kept':>13} {'read/call':>9} {'x ideal':>7}")
    lines = [header, "-" * len(header)]
    for family, folder in folders.items():
        tokenizer = AutoTokenizer.from_pretrained(folder)
        for shape in ("tools", "chat"):
            for turns in args.turns:
                for style in ("spaced", "compact"):
                    runs = [measure(rollout(tokenizer, family, shape, turns, style, seed))
                            for seed in range(args.rollouts)]
                    total = {key: sum(run[key] for run in runs) for key in runs[0]}
                    calls = total["calls"]
                    lines.append(
                        f"{family:7} {shape:5} {turns:5d} {style:7} {calls / len(runs):5.0f} "
                        f"{total['sequences'] / len(runs):5.1f} {calls / total['sequences']:6.2f} "
                        f"{total['read'] / calls:9.0f} {total['read'] / total['ideal']:7.1f} | "
                        f"{total['content_kept'] / total['sampled']:12.0%} {total['content_read'] / calls:9.0f} "
                        f"{total['content_read'] / total['ideal']:7.1f}")
                    print(lines[-1], flush=True)
    text = "\n".join([f"bench/model_family_merge.py --turns {' '.join(map(str, args.turns))} "
                      f"--rollouts {args.rollouts}", "", *lines, ""])
    args.out.write_text(text)


if __name__ == "__main__":
    main()
