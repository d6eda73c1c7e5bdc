"""Hidden rubrics for the judge stand-in (testkit/judge_standin.py `--rubric tests.judge_rubrics:NAME`),
applied to a trajectory as the judge sees it (rewards/judge.py renders it: `[user] ...`, `[assistant] ...`).
They read the conversation, not the task's scorer: what a judge model with a good rubric would conclude."""
from __future__ import annotations

import re

_ASKED = re.compile(r"List (\d+) ")
_ITEM = re.compile(r"- \S+(?: \S+){0,4}")


def lists_count(trajectory: str) -> float:
    """1.0 when the last answer is a bare list of exactly as many "- " lines as the last request asked for."""
    asked = _ASKED.findall(trajectory.rsplit("[assistant]", 1)[0])
    final = trajectory.rsplit("[assistant]", 1)[1].strip() if "[assistant]" in trajectory else ""
    lines = [line.strip() for line in final.splitlines() if line.strip()]
    return float(bool(asked) and len(lines) == int(asked[-1]) and all(_ITEM.fullmatch(line) for line in lines))
