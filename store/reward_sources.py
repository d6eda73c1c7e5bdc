"""Who may give a rollout's final reward, and who gave it: the values of `rollouts.reward_source` and
`rollouts.rewarded_by` (migration 0015; store/rollouts.py decides, docs/security.md has the table)."""
from __future__ import annotations


class RewardSource:
    """Who gives a rollout's final reward (`rollouts.reward_source`, chosen by `POST /rollouts`)."""

    AGENT = "agent"  # whoever holds a key of its project or its rollout token (the default, as before 0015)
    GRADER = "grader"  # its creator's program (a verifier): the grader token, an admin key of its project, the operator
    JUDGE = "judge"  # the trainer's judge alone (store/judging.py)


class RewardedBy:
    """Who gave a finished rollout's final reward (`rollouts.rewarded_by`): evaluation figures count only the
    rollouts an evaluation credential rewarded (`EVIDENCE`)."""

    AGENT = "agent"  # a project key, a rollout token, or nobody's (keys off)
    GRADER = "grader"  # the rollout's grader token
    ADMIN = "admin"  # an admin key of its project
    EVAL_KEY = "eval_key"  # a key made for evaluation (`rlproxy keys create --eval`)
    OPERATOR = "operator"  # the operator key (--admin-key)
    JUDGE = "judge"
    EVIDENCE = (GRADER, ADMIN, EVAL_KEY, OPERATOR)
