"""From rewarded rollouts to transitions: which calls are trained, their credit and advantage (LightningRL),
and multi-turn merging where the proxy recorded an exact prefix link. Pure: no I/O, no torch."""
from __future__ import annotations

from core.checks import reward_problem
from core.settings import TrainingSettings
from rewards import assign_credit, group_advantages
from store.models import PrefixKind
from store.training import RolloutData
from trainer.staleness import Staleness
from trainer.transitions import Call, SkipReasons, Transition, merge_trajectory

NOT_TRAINED_AGENT = "agent_not_trained"
NOT_POLICY = "not_served_by_policy"
OTHER_POLICY = "other_policy"  # a call another named policy answered: that policy's to train
STALE = "stale_policy"
NO_CALLS = "rollout_without_calls"
ZERO_ADVANTAGE = "zero_advantage"
INVALID_REWARD = "invalid_reward"
SAMPLING_ALTERED = "sampling_altered"  # sampled at another temperature, top-p, ...: its log-probs are not its behaviour


def build_transitions(rollouts: list[RolloutData], config: TrainingSettings, active_version: int,
                      skips: SkipReasons, *, keep_zero: bool = False, policy: str | None = None,
                      lineage: dict[int, int] | None = None, staleness: Staleness | None = None,
                      usable: set[str] | None = None) -> list[Transition]:
    """One transition per call and choice (merged along exact prefix links). With `policy`, only the calls that
    named policy answered (another role's calls in the same episode are its own policy's); `lineage` (version ->
    position in that policy's line, store.policies.lineage) measures staleness in that policy's versions, and
    `staleness` counts it (trainer/staleness.py). `usable` collects the ids of the rollouts with a call this step
    may train (zero advantage or not): what is left of the batch once stale and foreign calls are dropped.

    The advantage of call t in rollout i is  A_i + (G_t - R_i):  the episode's advantage within its task
    group (config.advantage_estimator over final rewards R), plus how the call's own credited return G_t
    (config.credit, with its intermediate rewards) departs from the episode return.
    """
    trainable = []  # (rollout, its calls this step trains)
    for rollout in rollouts:
        if reward_problem(rollout.reward) or any(reward_problem(r) for call in rollout.calls for r in call.rewards):
            skips[INVALID_REWARD] += 1  # stored before the doors bounded rewards: its square would overflow below
            continue
        calls = _trainable_calls(rollout, config, active_version, skips, policy, lineage, staleness)
        if calls:
            trainable.append((rollout, calls))
        elif not rollout.calls:  # otherwise each of its calls is counted already, under its own reason
            skips[NO_CALLS] += 1
    # The group is what this step trains: a rollout whose calls all failed or were dropped (stale, another
    # policy's) says nothing about this policy, and counted in the baseline it would give identical successes
    # an advantage (five 1s beside three failed 0s: +0.775 each instead of nothing to learn).
    episode_advantages = group_advantages([(r.task_id, r.reward) for r, _ in trainable], config.advantage_estimator)
    transitions: list[Transition] = []
    for (rollout, calls), episode_advantage in zip(trainable, episode_advantages):
        if usable is not None:
            usable.add(rollout.id)
        returns = assign_credit(rollout.reward, len(calls), mode=config.credit, gamma=config.gamma,
                                intermediate=[call.rewards for call in calls])
        staged: list[Call] = []
        for call, credited in zip(calls, returns):
            advantage = episode_advantage + (credited - rollout.reward)
            for index, (token_ids, logprobs) in enumerate(call.choices or [(None, None)]):
                staged.append(Call(
                    prompt_ids=call.prompt_ids or [], completion_ids=token_ids or [], logprobs=logprobs or [],
                    advantage=advantage, call_id=call.id, rollout_id=rollout.id,
                    policy_version=call.policy_version,
                    # only a single-choice call can continue a chain; n > 1 choices stand alone
                    extends_previous=call.prefix_kind == PrefixKind.EXTENDS and len(call.choices) == 1,
                ))
        for transition in merge_trajectory(staged, max_seq_len=config.max_seq_len, skips=skips):
            if not keep_zero and all(a == 0.0 for a in transition.advantages()):
                skips[ZERO_ADVANTAGE] += 1  # no gradient signal: not worth a forward pass
                continue
            transitions.append(transition)
    return transitions


def _trainable_calls(rollout: RolloutData, config: TrainingSettings, active_version: int, skips: SkipReasons,
                     policy: str | None = None, lineage: dict[int, int] | None = None,
                     staleness: Staleness | None = None):
    def position(version: int) -> int:
        return version if lineage is None else lineage.get(version, 0)

    kept = []
    for call in rollout.calls:
        if config.train_agents and call.agent not in config.train_agents:
            skips[NOT_TRAINED_AGENT] += 1
        elif call.policy_version is None:
            skips[NOT_POLICY] += 1  # the agent asked for another model by name
        elif call.sampling is not None:
            skips[SAMPLING_ALTERED] += 1  # proxy/sampling.py: no importance weight can be computed for it
        elif policy is not None and call.policy != policy:
            skips[OTHER_POLICY] += 1
        elif (lag := position(active_version) - position(call.policy_version)) > config.max_staleness:
            skips[STALE] += 1
            if staleness is not None:
                staleness.drop(lag)
        else:
            kept.append(call)
            if staleness is not None:
                staleness.kept(lag, call.started_at)
    return kept
