"""Other model families than the bundled one, without an engine: the model kit's tiny models carry each family's
real vocabulary and special-token ids, their chat templates behave as the family's do (thinking kept for the
last turn only, tool calls re-rendered, the generation prompt, the end tokens), and the engine serves each
folder with its family's parsers unless the operator says otherwise (engine/families.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.settings import EngineSettings
from engine.families import UnknownFamily, serving_plan

pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "Evaluate an arithmetic expression.",
                                           "parameters": {"type": "object",
                                                          "properties": {"expr": {"type": "string"}}}}}]
CALL = {"type": "function", "id": "c1", "function": {"name": "calc", "arguments": {"expr": "17*23"}}}
ROLLOUT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 17*23?"},
           {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [CALL]},
           {"role": "tool", "tool_call_id": "c1", "content": "391"}]


def tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_qwen3_has_qwens_ids_and_special_tokens(family_model):
    qwen = tokenizer(family_model("qwen3"))
    assert qwen("Hello world, what is 17*23?")["input_ids"] == [9707, 1879, 11, 1128, 374, 220, 16, 22, 9, 17, 18,
                                                                30]  # Qwen's own ids: digits one by one
    assert qwen.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
                                       "<think>", "</think>"]) == [151643, 151644, 151645, 151657, 151658, 151667,
                                                                  151668]
    assert qwen("<|im_start|>user\n")["input_ids"] == [151644, 872, 198]
    config = json.loads((family_model("qwen3") / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["vocab_size"] == 151936


def test_llama3_has_llamas_ids_and_end_tokens(family_model):
    llama = tokenizer(family_model("llama3"))
    assert llama("Hello world, what is 17*23?")["input_ids"] == [9906, 1917, 11, 1148, 374, 220, 1114, 9, 1419, 30]
    assert llama.convert_tokens_to_ids(["<|begin_of_text|>", "<|start_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                        "<|python_tag|>"]) == [128000, 128006, 128008, 128009, 128010]
    generation = json.loads((family_model("llama3") / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [128001, 128008, 128009]


def test_mistral_ships_tekken_with_its_control_tokens(family_model):
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tekken = Tekkenizer.from_file(family_model("mistral") / "tekken.json")
    assert (tekken.bos_id, tekken.eos_id) == (1, 2)
    assert tekken.get_special_token("[INST]") == 3 and tekken.get_special_token("[TOOL_CALLS]") == 9
    assert json.loads((family_model("mistral") / "config.json").read_text())["vocab_size"] == tekken.n_words


def test_gpt_oss_has_the_o200k_harmony_ids_and_the_file_harmony_reads_offline(family_model, monkeypatch):
    folder = family_model("gpt-oss")
    oss = tokenizer(folder)
    assert oss("Hello world, what is 17*23?")["input_ids"] == [13225, 2375, 11, 1412, 382, 220, 1422, 9, 1860, 30]
    assert oss.convert_tokens_to_ids(["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                                      "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]) == [
        199998, 199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012]
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_local_experts"]) == ("gpt_oss", 201088, 4)
    harmony = pytest.importorskip("openai_harmony")
    plan = serving_plan(folder)  # the engine is started with the folder openai_harmony reads o200k from
    assert dict(plan.env) == {"TIKTOKEN_ENCODINGS_BASE": str(folder / "harmony")}
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder / "harmony"))
    encoding = harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)  # no download
    assert sorted(encoding.stop_tokens_for_assistant_actions()) == [200002, 200012]  # <|return|>, <|call|>


def test_the_harmony_file_is_refused_unless_it_is_o200k_byte_for_byte(tmp_path):
    from testkit.model_kit.harmony import EncodingMismatch, write_encoding

    with pytest.raises(EncodingMismatch, match="not o200k_base's"):
        write_encoding(tmp_path, {b"a": 0, b"b": 1})
    assert not (tmp_path / "o200k_base.tiktoken").exists()


def test_gpt_oss_template_writes_what_harmony_writes_for_vllms_chat_route(family_model, monkeypatch):
    """vLLM's chat route renders gpt-oss chats with openai_harmony; its /tokenize renders them with the folder's
    template (the proxy's Messages token count reads it): the two agree on the kit's folder."""
    folder = family_model("gpt-oss")
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder / "harmony"))
    monkeypatch.setenv("VLLM_SYSTEM_START_DATE", "2026-12-02")
    harmony = pytest.importorskip("vllm.entrypoints.openai.parser.harmony_utils")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    grep = {"type": "function", "function": {"name": "grep", "description": "Search.", "parameters": {
        "type": "object", "properties": {"pattern": {"type": "string", "description": "What to find."},
                                         "limit": {"type": "integer"}, "all": {"type": "boolean"}},
        "required": ["pattern"]}}}
    call = {**CALL, "function": {"name": "calc", "arguments": '{"expr": "17*23"}'}}
    chats = [(None, ROLLOUT[1:2]), (None, ROLLOUT[:2]),
             (TOOLS, ROLLOUT[:2] + [{"role": "assistant", "content": None, "tool_calls": [call]}, ROLLOUT[3]]),
             (TOOLS + [grep], ROLLOUT[:2] + [{"role": "assistant", "content": "Let me see.", "reasoning": "Use it.",
                                              "tool_calls": [call]}, ROLLOUT[3]]),
             (None, [ROLLOUT[1], {"role": "assistant", "content": "391", "reasoning": "Dropped: a final follows."},
                     {"role": "user", "content": "And 2+2?"}, {"role": "assistant", "content": "4", "reasoning": "x"},
                     {"role": "user", "content": "Sure?"}])]
    oss = tokenizer(folder)
    for tools, chat in chats:
        instructions, rest = harmony.extract_instructions_from_messages(list(chat))
        messages = harmony.build_harmony_preamble(
            instructions=instructions, with_custom_tools=bool(tools),
            tools=[ChatCompletionToolsParam(**tool) for tool in tools] if tools else None)
        wanted = harmony.render_for_completion(messages + harmony.parse_chat_inputs_to_harmony_messages(rest))
        ids = oss.apply_chat_template(chat, tools=tools, add_generation_prompt=True, conversation_date="2026-12-02")
        assert (ids["input_ids"] if hasattr(ids, "keys") else ids) == wanted, oss.decode(wanted)


def test_qwen3_keeps_thinking_for_the_last_turn_and_strips_it_before(family_model):
    qwen = tokenizer(family_model("qwen3"))
    now = qwen.apply_chat_template(ROLLOUT, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<think>\nUse the tool.\n</think>\n\n<tool_call>\n" in now
    later = qwen.apply_chat_template(ROLLOUT + [{"role": "assistant", "content": "391"},
                                                {"role": "user", "content": "And 2+2?"}],
                                     tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "Use the tool." not in later  # stripped once a later user turn follows: the prefix is not shared
    assert not later.startswith(now)
    assert '<tool_call>\n{"name": "calc", "arguments": {"expr": "17*23"}}\n</tool_call><|im_end|>' in later
    assert "<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>" in later
    assert now.endswith("<|im_start|>assistant\n")
    silent = qwen.apply_chat_template(ROLLOUT[:2], tokenize=False, add_generation_prompt=True,
                                      enable_thinking=False)
    assert silent.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llama3_dates_its_system_turn_and_writes_calls_as_json(family_model):
    llama = tokenizer(family_model("llama3"))
    text = llama.apply_chat_template(ROLLOUT, tools=TOOLS, tokenize=False, add_generation_prompt=True,
                                     date_string="02 Dec 2026")
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: 02 Dec 2026\n\nBe brief.<|eot_id|>")
    assert '\n\n{"name": "calc", "parameters": {"expr": "17*23"}}<|eot_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\n391<|eot_id|>" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = llama.apply_chat_template(ROLLOUT[:2], add_generation_prompt=True, date_string="02 Dec 2026")
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == 128000 and ids.count(128000) == 1  # the template's one <|begin_of_text|>


@pytest.mark.parametrize("family, parsers", [
    ("qwen3", ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]),
    ("llama3", ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]),
    ("mistral", ["--enable-auto-tool-choice", "--tool-call-parser", "mistral", "--tokenizer-mode", "mistral"]),
    ("gpt-oss", ["--enable-auto-tool-choice", "--tool-call-parser", "openai", "--reasoning-parser", "openai_gptoss"]),
])
def test_the_engine_serves_each_family_with_its_parsers(family_model, family, parsers):
    plan = serving_plan(family_model(family))
    assert plan.family.name == family and plan.args() == parsers
    assert not plan.missing_end_tokens


def test_the_operator_overrides_what_the_folder_says(family_model, tmp_path):
    folder = family_model("qwen3")
    plan = serving_plan(folder, tool_call_parser="none", reasoning_parser="deepseek_r1", chat_template=tmp_path / "t")
    assert plan.args() == ["--reasoning-parser", "deepseek_r1", "--chat-template", str(tmp_path / "t")]
    assert serving_plan(folder, family="llama3").tool_call_parser == "llama3_json"
    with pytest.raises(UnknownFamily, match="unknown model family 'llama2'"):
        serving_plan(folder, family="llama2")
    settings = EngineSettings(tool_call_parser="qwen3_xml")
    from engine.command import family_plan

    assert family_plan(settings, folder).args()[:3] == ["--enable-auto-tool-choice", "--tool-call-parser",
                                                        "qwen3_xml"]


def test_a_folder_that_would_not_stop_at_a_family_end_token_says_which(family_model, tmp_path):
    import shutil

    folder = tmp_path / "llama"
    shutil.copytree(family_model("llama3"), folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": 128001}))
    plan = serving_plan(folder)
    assert plan.stop_ids == (128001, 128009)  # config.json's eos_token_id is <|eot_id|>
    assert plan.missing_end_tokens == ("<|eom_id|>",)
    assert "would not stop at <|eom_id|>: add their ids" in plan.describe()


def test_an_unknown_folder_is_served_as_before_and_says_so(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phi3"}))
    plan = serving_plan(tmp_path)
    assert plan.args() == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert "no known family" in plan.describe()


def test_the_trainer_loads_gpt_oss_with_eager_attention_and_the_others_with_sdpa(family_model, tmp_path):
    """transformers' SDPA path refuses gpt-oss (its attention sinks); eager computes them (bench/model_family_train.py:
    the engine and the trainer agree to 4.5e-7 nats a token on the kit's gpt-oss)."""
    from trainer.loading import attention_implementation

    assert attention_implementation(family_model("gpt-oss")) == "eager"
    assert attention_implementation(family_model("qwen3")) == "sdpa"
    assert attention_implementation(tmp_path) == "sdpa"  # no config.json: as before
