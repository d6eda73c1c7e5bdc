"""`rlproxy train --teacher ...` (core/settings/teacher.py): one teacher per policy, `NAME=VALUE` for one policy and a
plain value for every one; what cannot be used is refused with the setting's name, not ignored."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from core.settings import TrainerSettings
from core.settings.teacher import Teacher, Teachers


def teachers(*policies: str, **given) -> dict[str, Teacher]:
    return TrainerSettings(policies=policies or ("default",), distillation=given).distillation.resolve(
        policies or ("default",))


def test_a_plain_value_is_every_policys_and_a_named_one_wins(tmp_path):
    examples = tmp_path / "examples.txt"
    examples.write_text("Worked example: 2 * 3 = 6")
    got = teachers("writer", "critic", teacher=("self", "critic=http://teacher:8000/v1/"),
                   teacher_context_file=(f"writer={examples}",), teacher_context_at=("writer=before_last_user",))
    assert got == {"writer": Teacher("writer", "self", "Worked example: 2 * 3 = 6", "before_last_user"),
                   "critic": Teacher("critic", "http://teacher:8000")}  # /v1 and the slash dropped: a base URL
    assert teachers() == {}  # no teacher: nothing changes


@pytest.mark.parametrize("given, refusal", [
    ({"teacher_context": ("x",)}, "teacher_context given for 'default', which has no teacher"),
    ({"teacher": ("self", "self")}, "teacher given 2 times for every policy"),
    ({"teacher": ("ftp://host",)}, "a teacher is `self` or an http"),
    ({"teacher": ("self",), "teacher_context_file": ("/nonexistent/examples.txt",)}, "teacher_context_file"),
    ({"teacher": ("self",), "teacher_context": ("  ",)}, "the teacher context is empty"),
    ({"teacher": ("self",), "teacher_model": ("m",)}, "teacher_model is for a URL teacher"),
    ({"teacher": ("self",), "teacher_context_at": ("middle",)}, "teacher_context_at must be one of"),
])
def test_what_cannot_be_used_is_refused_by_name(given, refusal):
    with pytest.raises(ValidationError, match=refusal):
        TrainerSettings(distillation=given)


def test_the_teachers_key_is_a_secret_from_the_environment(monkeypatch):
    monkeypatch.setenv("RLPROXY_TEACHER_API_KEY", "s3cret")
    settings = TrainerSettings.from_command_line({"distillation": {"teacher": ("http://teacher:8000",)}})
    assert settings.distillation.api_key() == "s3cret"
    assert "s3cret" not in repr(settings)
    assert Teachers().api_key() is None
