"""The task families of bench/families/: disjoint splits that are the same everywhere, and scorers that accept
exactly the asked-for answer."""
from __future__ import annotations

import json

import pytest

from bench.families import FAMILIES
from bench.families.extract import FAMILY as EXTRACT
from bench.families.lists import FAMILY as LISTS
from bench.families.tools import FAMILY as TOOLS


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_train_and_heldout_share_no_problem_and_are_stable(name):
    family = FAMILIES[name]
    train, heldout = family.items("train"), family.items("heldout")
    assert len(heldout) >= 48 and len(train) >= 2 * len(heldout)
    assert not {item.item_id for item in train} & {item.item_id for item in heldout}
    assert [item.item_id for item in family.items("heldout")] == [item.item_id for item in heldout]


def test_lists_held_out_categories_never_appear_in_training():
    category = lambda item: item.item_id.split(":", 2)[2]  # noqa: E731
    assert not {category(i) for i in LISTS.items("train")} & {category(i) for i in LISTS.items("heldout")}


def test_lists_scores_the_format_only():
    item = next(i for i in LISTS.items("train") if i.expected == 3)
    assert LISTS.score(item, "- apple\n- pear\n- plum\n") == 1.0
    assert LISTS.score(item, "- red apple\n- pear\n- plum") == 1.0
    assert LISTS.score(item, "Sure! Here are three:\n- apple\n- pear\n- plum") == 0.0
    assert LISTS.score(item, "1. apple\n2. pear\n3. plum") == 0.0
    assert LISTS.score(item, "- apple\n- pear") == 0.0
    assert LISTS.score(item, "- apple, which is a fruit that grows on trees\n- pear\n- plum") == 0.0


def test_extract_wants_exactly_the_three_fields():
    item = EXTRACT.items("heldout")[0]
    right = json.dumps(item.expected)
    assert item.expected["name"] in item.messages[-1]["content"]
    assert EXTRACT.score(item, right) == 1.0
    assert EXTRACT.score(item, f"```json\n{right}\n```") == 1.0
    assert EXTRACT.score(item, f"Here it is: {right}") == 0.0
    assert EXTRACT.score(item, json.dumps({**item.expected, "age": str(item.expected["age"])})) == 0.0
    assert EXTRACT.score(item, json.dumps({**item.expected, "job": "teacher"})) == 0.0
    assert EXTRACT.score(item, json.dumps({**item.expected, "city": "Atlantis"})) == 0.0


def test_tools_wants_the_right_name_alone():
    item = next(i for i in TOOLS.items("heldout") if i.expected == "get_weather")
    assert TOOLS.score(item, "get_weather") == 1.0
    assert TOOLS.score(item, " `get_weather()`.\n") == 1.0
    assert TOOLS.score(item, "calculator") == 0.0
    assert TOOLS.score(item, "I would use get_weather") == 0.0
    assert {i.expected for i in TOOLS.items("heldout")} == {"get_weather", "calculator", "translate", "send_email",
                                                           "set_timer"}


def test_tools_samples_are_spread_evenly_over_the_five_tools():
    """The tools have 18 to 120 requests each: a held-out set cycled over items would reward always answering
    the commonest tool; sampled by stratum, each tool is a fifth of the held-out samples and of training draws."""
    import collections
    import random

    heldout = collections.Counter(item.expected for item in TOOLS.sample("heldout", 100))
    assert set(heldout.values()) == {20}
    drawn = collections.Counter(item.expected for item in TOOLS.sample("train", 5000, random.Random(0)))
    assert len(drawn) == 5 and min(drawn.values()) > 900
    assert {item.item_id for item in TOOLS.sample("train", 500, random.Random(0))} <= {
        item.item_id for item in TOOLS.items("train")}
    assert LISTS.sample("heldout", 3) == LISTS.items("heldout")[:3]  # no stratum: the items in turn
