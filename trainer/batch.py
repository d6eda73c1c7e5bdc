"""From rewarded rollouts to transitions: which calls are trained, their credit and advantage (LightningRL),
and multi-turn merging where a call's prompt starts with the exact tokens of the conversation so far. Pure: no
I/O, no torch."""
from __future__ import annotations

from core.checks import reward_problem
from core.settings import TrainingSettings
from rewards import assign_credit, group_advantages
from store.training import RolloutData
from trainer.sampled import MEDIA_IN_PROMPT, SAMPLING_ALTERED, GREEDY, sampled_with, unreproducible  # noqa: F401 (names of skip reasons)
from trainer.staleness import Staleness
from trainer.transitions import Call, SkipReasons, Transition, merge_trajectory

NOT_TRAINED_AGENT = "agent_not_trained"
NOT_POLICY = "not_served_by_policy"
OTHER_POLICY = "other_policy"  # a call another named policy answered: that policy's to train
STALE = "stale_policy"
NO_CALLS = "rollout_without_calls"
ZERO_ADVANTAGE = "zero_advantage"
INVALID_REWARD = "invalid_reward"
CHOICE_NOT_CONTINUED = "choice_not_continued"  # n > 1 and no later call says which choice the agent went on from
TRAINED = "trained"  # the decision stored for a call a step trained (calls.train_decision)


def build_transitions(rollouts: list[RolloutData], config: TrainingSettings, active_version: int,
                      skips: SkipReasons, *, keep_zero: bool = False, policy: str | None = None,
                      lineage: dict[int, int] | None = None, staleness: Staleness | None = None,
                      usable: set[str] | None = None) -> list[Transition]:
    """One transition per call and choice (merged along exact prefix links). With `policy`, only the calls that
    named policy answered (another role's calls in the same episode are its own policy's); `lineage` (version ->
    position in that policy's line, store.policies.lineage) measures staleness in that policy's versions, and
    `staleness` counts it (trainer/staleness.py). `usable` collects the ids of the rollouts with a call this step
    may train (zero advantage or not): what is left of the batch once stale and foreign calls are dropped.

    The advantage of call t in rollout i is  d_t * A_i + w * r_t:  the episode's advantage within its task
    group (config.advantage_estimator over final rewards R), discounted by d_t (config.credit: 1, or
    gamma ** calls-until-the-end), plus the call's own intermediate rewards r_t (per-call and AIR rewards).
    """
    trainable = []  # (rollout, its calls this step trains)
    for rollout in rollouts:
        if reward_problem(rollout.reward) or any(reward_problem(r) for call in rollout.calls for r in call.rewards):
            skips.skip(INVALID_REWARD, _answered_by(rollout, policy))  # stored before the doors bounded rewards: its square would overflow below
            continue
        calls = _trainable_calls(rollout, config, active_version, skips, policy, lineage, staleness)
        if calls:
            trainable.append((rollout, calls))
        elif not rollout.calls:  # otherwise each of its calls is counted already, under its own reason
            skips[NO_CALLS] += 1
    # The group is what this step trains: a rollout whose calls all failed or were dropped (stale, another
    # policy's) says nothing about this policy, and counted in the baseline it would give identical successes
    # an advantage (five 1s beside three failed 0s: +0.775 each instead of nothing to learn).
    # A task id names a task within its project: two projects sharing a policy and a benchmark's ids ("gsm8k-17")
    # may still ask different things of it, and one's successes must not be the other's baseline.
    episode_advantages = group_advantages(
        [((r.project, r.task_id) if r.task_id is not None else None, r.reward) for r, _ in trainable],
        config.advantage_estimator)
    transitions: list[Transition] = []
    for (rollout, calls), episode_advantage in zip(trainable, episode_advantages):
        if usable is not None:
            usable.add(rollout.id)
        # The episode's advantage is what is discounted: discounting its raw return before the undiscounted R is
        # taken off (the earlier form) made every early call of a success negative, even in a group of equal
        # rewards, and of a negative-reward failure positive.
        discounts = assign_credit(1.0, len(calls), mode=config.credit, gamma=config.gamma)
        own = assign_credit(0.0, len(calls), intermediate=[call.rewards for call in calls])
        staged: list[Call] = []
        continued = continued_choices(rollout.calls) if config.choices_trained == "continued" else {}
        for call, discount, own_reward in zip(calls, discounts, own):
            advantage = discount * episode_advantage + own_reward
            choices = call.choices or [(None, None)]
            if len(choices) > 1 and config.choices_trained == "continued":
                if call.id not in continued:
                    skips.skip(CHOICE_NOT_CONTINUED, [call.id])
                    continue
                choices = [choices[continued[call.id]]]
            for token_ids, logprobs in choices:
                staged.append(Call(
                    prompt_ids=call.prompt_ids or [], completion_ids=token_ids or [], logprobs=logprobs or [],
                    advantage=advantage, call_id=call.id, rollout_id=rollout.id,
                    policy_version=call.policy_version, sampled=sampled_with(call),
                    # Only a single-choice call can continue a chain (n > 1 choices stand alone). merge_trajectory
                    # merges only where the call's prompt starts with the chain's exact tokens, so the store's link
                    # is not asked: it names the agent's latest call, which may be a failed one the engine never
                    # prompted (a 503, a timeout: no ids, no link), and a retry after it would re-read the whole
                    # conversation as a prompt of its own.
                    extends_previous=len(choices) == 1,
                ))
        for transition in merge_trajectory(staged, max_seq_len=config.max_seq_len, skips=skips):
            if not keep_zero and all(a == 0.0 for a in transition.advantages()):
                skips.skip(ZERO_ADVANTAGE, transition.call_ids)  # no gradient signal: not worth a forward pass
                continue
            transitions.append(transition)
            for call_id in transition.call_ids:
                skips.decisions.setdefault(call_id, TRAINED)
    return transitions


def continued_choices(calls: list) -> dict[str, int]:
    """For each call with several choices, the index of the one the same agent went on from: the first later call
    of that agent whose prompt extends this call's prompt holds that choice's tokens right after it (what the agent
    did with the others is not part of the trajectory). Calls that no later call extends, or whose extension holds
    none of the choices, are absent.

    Later calls that do not extend the prompt are passed over: an agent running two conversations at once (parallel
    workers under one agent name) goes on from a choice after the other conversation's call. When one choice is the
    start of another (a choice cut by max_tokens or a stop string has no end-of-turn token), the longest one the
    prompt holds is the one continued: the prompt holds the shorter one too, but not as what was sampled."""
    chosen: dict[str, int] = {}
    for position, call in enumerate(calls):
        if len(call.choices) < 2 or not call.prompt_ids:
            continue
        head = call.prompt_ids
        following = next((later for later in calls[position + 1:] if later.agent == call.agent and later.prompt_ids
                          and len(later.prompt_ids) > len(head) and later.prompt_ids[:len(head)] == head), None)
        if following is None:
            continue
        tail = following.prompt_ids[len(head):]
        held = [i for i, (tokens, _) in enumerate(call.choices) if tokens and tail[:len(tokens)] == tokens]
        if held:
            chosen[call.id] = max(held, key=lambda i: len(call.choices[i][0]))  # the first of the longest
    return chosen


def _trainable_calls(rollout: RolloutData, config: TrainingSettings, active_version: int, skips: SkipReasons,
                     policy: str | None = None, lineage: dict[int, int] | None = None,
                     staleness: Staleness | None = None):
    def position(version: int) -> int:
        return version if lineage is None else lineage.get(version, 0)

    kept = []
    for call in rollout.calls:
        if config.train_agents and call.agent not in config.train_agents:
            skips.skip(NOT_TRAINED_AGENT, [call.id])
        elif call.policy_version is None:
            skips.skip(NOT_POLICY, [call.id])  # the agent asked for another model by name
        elif (reason := unreproducible(call)) is not None:  # trainer/sampled.py: no importance weight can be computed
            skips.skip(reason, [call.id])
        elif policy is not None and call.policy != policy:
            skips[OTHER_POLICY] += 1  # not this policy's to decide: its own policy's line does
        elif (lag := position(active_version) - position(call.policy_version)) > config.max_staleness:
            skips.skip(STALE, [call.id])
            if staleness is not None:
                staleness.drop(lag)
        else:
            kept.append(call)
            if staleness is not None:
                staleness.kept(lag, call.started_at)
    return kept


def _answered_by(rollout: RolloutData, policy: str | None) -> list[str]:
    """The ids of the rollout's calls this policy's line decides on (all of them without a named policy)."""
    return [call.id for call in rollout.calls if policy is None or call.policy == policy or call.policy_version is None]
