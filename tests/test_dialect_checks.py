"""The quick validity checks (proxy/dialects/checks.py) only ever vouch for bodies the pydantic models accept:
a body they pass skips the model, so a wrong "yes" would let a bad request through unexplained."""
from __future__ import annotations

import pydantic
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.dialects.checks import plainly_valid_messages, plainly_valid_responses
from proxy.dialects.messages import MessagesRequest
from proxy.dialects.responses import ResponsesRequest

# Values of every JSON type, near the edges the models care about (empty, zero, negative, bool vs int).
json_value = st.recursive(
    st.none() | st.booleans() | st.sampled_from([0, 1, -1, 7, 1.5]) | st.sampled_from(["", "m", "hi"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["type", "text", "role"]), inner,
                                                               max_size=2),
    max_leaves=6)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", 3]), "content": json_value})


def bodies(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    """Dicts holding any subset of `fields`, each a plausible value or any JSON value."""
    return st.fixed_dictionaries({}, optional={name: strategy | json_value for name, strategy in fields.items()})


RESPONSES_BODIES = bodies({
    "model": st.just("m"), "input": st.just("hi") | st.lists(message, max_size=2),
    "instructions": st.just("be brief"), "previous_response_id": st.just("resp_1"), "stream": st.booleans(),
    "store": st.booleans(), "background": st.booleans(), "max_output_tokens": st.integers(-1, 3),
    "tools": st.lists(st.just({"type": "function", "name": "f"}), max_size=2)})
MESSAGES_BODIES = bodies({
    "model": st.just("m"), "max_tokens": st.integers(-1, 3), "messages": st.lists(message, max_size=2),
    "stream": st.booleans(), "stop_sequences": st.lists(st.just("x"), max_size=2),
    "tools": st.lists(st.just({"name": "f", "input_schema": {}}), max_size=2)})


def accepted(model: type[pydantic.BaseModel], body: dict) -> bool:
    try:
        model.model_validate(body)
    except pydantic.ValidationError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(RESPONSES_BODIES)
def test_a_responses_body_the_quick_check_passes_is_one_the_model_accepts(body):
    if plainly_valid_responses(body):
        assert accepted(ResponsesRequest, body)


@settings(max_examples=400, deadline=None)
@given(MESSAGES_BODIES)
def test_a_messages_body_the_quick_check_passes_is_one_the_model_accepts(body):
    if plainly_valid_messages(body):
        assert accepted(MessagesRequest, body)


def test_the_quick_checks_pass_ordinary_requests():
    assert plainly_valid_responses({"model": "m", "input": "hi", "stream": True, "max_output_tokens": 16})
    assert plainly_valid_messages({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
    assert not plainly_valid_messages({"model": "m", "max_tokens": True, "messages": [{"role": "user"}]})
