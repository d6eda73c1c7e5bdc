"""The Grafana dashboard against a real Prometheus scraping a real `rlproxy serve` and `rlproxy train`.

Every PromQL expression in the dashboard must return data once a short workload has gone through: chat,
completions and streams with the `openai` SDK, an engine failure mid-stream, rollouts with final, per-call
and automatic (tool error) rewards, and enough of them for the trainer to take one step and publish it.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import requests

from core.step_record import gauge_fields
from proxy.metrics import ProxyMetrics
from tests.support import free_port, running, running_proxy, stub_command, trainer_command
from trainer.metrics import TrainerMetrics

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "helm" / "rlproxy" / "dashboards" / "rlproxy.json"
PROMETHEUS = shutil.which("prometheus")
# Grafana's own variables, as Grafana would expand them with a 1 s scrape interval.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1s", "$__range": "5m"}


def panels(dashboard: dict) -> list[dict]:
    """Every panel, including those nested in collapsed rows."""
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query target in the dashboard."""
    return [(panel["title"], target["expr"]) for panel in panels(dashboard)
            for target in panel.get("targets", []) if target.get("expr")]


def promql(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unexpanded variable in {expr!r}"
    return expr


# Panels of what only some deployments have: the live run below has no teacher, so these answer no data there;
# each metric's export is asserted where it is made (tests/test_distill_worker.py: a step of a taught policy).
ONLY_WITH = {"rlproxy_trainer_teacher_kl": "a policy with a teacher"}

SERIES_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


def metric_names(registry) -> set[str]:
    """Every series name the registry can export (labelled metrics have no samples before first use)."""
    return {family.name + suffix for family in registry.collect() for suffix in SERIES_SUFFIXES[family.type]}


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_only_queries_metrics_the_proxy_and_trainer_export():
    dashboard = load_dashboard()
    known = metric_names(ProxyMetrics().registry) | metric_names(TrainerMetrics().registry)
    queried = {name for _, expr in expressions(dashboard) for name in re.findall(r"\brlproxy_[a-z_]+", expr)}
    assert queried and not queried - known, f"unknown metrics: {sorted(queried - known)}"
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
    ids = [panel["id"] for panel in panels(dashboard)]
    assert len(ids) == len(set(ids))


def test_the_training_panels_name_fields_of_the_step_record():
    """The trainer's step gauges are made from the step record's fields (core/step_record.py): a panel that
    queries `rlproxy_trainer_<name>` where no trainer metric of that name exists names a step field that does not
    (renamed or removed), and every step field exported as a gauge is charted."""
    step_metrics = {metric: name for name, (metric, _) in gauge_fields().items()}
    others = metric_names(TrainerMetrics().registry) - set(step_metrics)
    queried = {(title, name) for title, expr in expressions(load_dashboard())
               for name in re.findall(r"\brlproxy_trainer_[a-z_]+", expr)}
    missing = sorted((title, name) for title, name in queried if name not in others and name not in step_metrics)
    assert not missing, "panels name step record fields that do not exist: " + ", ".join(
        f"[{title}] {name.removeprefix('rlproxy_trainer_')}" for title, name in missing)
    assert set(step_metrics) <= {name for _, name in queried}, "a step gauge no panel charts"


def test_every_metric_is_documented():
    documented = (ROOT / "docs" / "metrics.md").read_text()
    for registry in (ProxyMetrics().registry, TrainerMetrics().registry):
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            assert f"`{name}`" in documented, f"{name} is missing from docs/metrics.md"


def test_the_grafana_provisioning_examples_fit_together(tmp_path):
    import yaml

    grafana = ROOT / "docs" / "grafana"
    datasources = yaml.safe_load((grafana / "provisioning/datasources/prometheus.yaml").read_text())
    [source] = datasources["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"]
    [provider] = yaml.safe_load((grafana / "provisioning/dashboards/rlproxy.yaml").read_text())["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((grafana / "docker-compose.yml").read_text())
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in compose["services"]["grafana"]["volumes"])
    assert (grafana / "../../helm/rlproxy/dashboards").resolve() == DASHBOARD.parent
    assert mounts["../../helm/rlproxy/dashboards"] == provider["options"]["path"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    key = tmp_path / "admin-key"
    key.write_text("test-key")
    config = tmp_path / "prometheus.yml"
    example = (grafana / "prometheus.yml").read_text()
    config.write_text(example.replace("/etc/prometheus/rlproxy-admin-key", str(key)))
    checked = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


# ------------------------------------------------------------------------------------------ live run

WIDE_VOCAB = 30208  # the stub engine's token ids go up to 30099


@pytest.fixture(scope="module")
def wide_tiny_model(tmp_path_factory) -> Path:
    """A tiny random Llama whose vocabulary covers the stub engine's token ids, written with numpy alone
    (importing transformers here would cost more than the rest of the setup)."""
    if importlib.util.find_spec("torch") is None:  # not imported here: the trainer process does that
        pytest.skip("the trainer needs torch: pip install -e '.[train]'")
    import numpy as np
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("wide-tiny-llama")
    hidden, inner, heads, kv_heads = 32, 64, 4, 2
    kv = hidden // heads * kv_heads
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": WIDE_VOCAB,
              "hidden_size": hidden, "intermediate_size": inner, "num_hidden_layers": 1,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": 512,
              "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
              "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    shapes = {"model.embed_tokens.weight": (WIDE_VOCAB, hidden), "lm_head.weight": (WIDE_VOCAB, hidden),
              "model.layers.0.self_attn.q_proj.weight": (hidden, hidden),
              "model.layers.0.self_attn.k_proj.weight": (kv, hidden),
              "model.layers.0.self_attn.v_proj.weight": (kv, hidden),
              "model.layers.0.self_attn.o_proj.weight": (hidden, hidden),
              "model.layers.0.mlp.gate_proj.weight": (inner, hidden),
              "model.layers.0.mlp.up_proj.weight": (inner, hidden),
              "model.layers.0.mlp.down_proj.weight": (hidden, inner)}
    rng = np.random.default_rng(0)
    tensors = {name: (rng.standard_normal(shape) * 0.02).astype(np.float32) for name, shape in shapes.items()}
    for norm in ("model.layers.0.input_layernorm", "model.layers.0.post_attention_layernorm", "model.norm"):
        tensors[f"{norm}.weight"] = np.ones(hidden, dtype=np.float32)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config))
    return path


def prometheus_config(path: Path, targets: dict[str, str]) -> Path:
    jobs = "\n".join(f"  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']"
                     for job, target in targets.items())
    path.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}\n")
    return path


def query(prometheus: str, expr: str) -> list:
    answer = requests.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", f"{expr}: {answer}"
    return answer["data"]["result"]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def drive_workload(proxy: str) -> None:
    """Plain, streaming and failing calls, then two full task groups of rewarded rollouts."""
    from openai import APIError, OpenAI

    client = OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0)
    client.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "hello"}])
    client.completions.create(model="stub-model", prompt="once upon a time", max_tokens=8)
    for chunk in client.chat.completions.create(model="stub-model", stream=True,
                                                messages=[{"role": "user", "content": "stream please"}]):
        pass
    assert list(client.completions.create(model="stub-model", prompt="count", max_tokens=6, stream=True))
    with pytest.raises(APIError):  # the engine dies mid-stream: an upstream error the proxy counts
        for chunk in client.chat.completions.create(model="stub-model", stream=True,
                                                    messages=[{"role": "user", "content": "die"}],
                                                    extra_body={"stub_die_after": 2}):
            pass

    def rollout(task: str) -> tuple[str, OpenAI]:
        created = requests.post(f"{proxy}/rollouts", json={"task_id": task, "agent": "solver"}).json()
        return created["rollout_id"], OpenAI(base_url=created["base_url"], api_key="unused", max_retries=0)

    # task "tools": a tool call whose result reports an error (an AIR reward), and a two-turn chat
    tool_rollout, agent = rollout("tools")
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "please use tool to compute"}]
    first = agent.chat.completions.create(model="stub-model", messages=messages, tools=tools)
    [tool_call] = first.choices[0].message.tool_calls
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": tool_call.id,
                  "content": "Traceback (most recent call last): ZeroDivisionError: division by zero"}]
    agent.chat.completions.create(model="stub-model", messages=messages, tools=tools)

    chat_rollout, agent = rollout("tools")
    messages = [{"role": "user", "content": "hi"}]
    raw = agent.chat.completions.with_raw_response.create(model="stub-model", messages=messages)
    answer = raw.parse().choices[0].message
    messages += [{"role": "assistant", "content": answer.content}, {"role": "user", "content": "and then?"}]
    agent.chat.completions.create(model="stub-model", messages=messages)
    call_reward = {"rollout_id": chat_rollout, "reward": 0.1, "call_id": raw.headers["X-Rlproxy-Call-Id"]}
    assert requests.post(f"{proxy}/reward", json=call_reward).status_code == 200

    # task "same": equal rewards, so no advantage: the trainer skips its calls
    same = [rollout("same") for _ in range(2)]
    for _, agent in same:
        agent.chat.completions.create(model="stub-model", messages=[{"role": "user", "content": "same"}])
    rewards = [(same[0][0], 0.5), (same[1][0], 0.5), (tool_rollout, 1.0), (chat_rollout, 0.0)]
    for rollout_id, reward in rewards:
        posted = requests.post(f"{proxy}/reward", json={"rollout_id": rollout_id, "reward": reward})
        assert posted.status_code == 200, posted.text


@pytest.mark.train
@pytest.mark.skipif(PROMETHEUS is None, reason="Prometheus is not installed: `apt-get install prometheus` "
                                               "(scripts/install.sh does it when run as root)")
def test_every_dashboard_query_returns_data(wide_tiny_model, own_database_url, tmp_path):
    from openai import OpenAI

    stub_port, trainer_port, prometheus_port = free_port(), free_port(), free_port()
    stub = f"http://127.0.0.1:{stub_port}"
    trainer_metrics = f"127.0.0.1:{trainer_port}"
    prometheus = f"http://127.0.0.1:{prometheus_port}"
    with ExitStack() as stack:
        stack.enter_context(running(stub_command(stub_port), stub + "/health",
                                    log_path=tmp_path / "stub.log"))
        # The trainer first (its imports take a while); its metrics answer before the model is loaded.
        train = trainer_command(own_database_url, stub, wide_tiny_model, tmp_path / "adapters",
                                "--worker-id", "dashboard-trainer", metrics_port=trainer_port,
                                settings={"batch_rollouts": 4, "group_size": 2, "micro_batch_tokens": 512,
                                          "learning_rate": 1e-3, "track_ref_kl": "true", "num_threads": 1})
        stack.enter_context(running(train, f"http://{trainer_metrics}/metrics",
                                    log_path=tmp_path / "trainer.log"))
        proxy = stack.enter_context(running_proxy([stub], own_database_url, tmp_path))
        targets = {"rlproxy-proxy": proxy.removeprefix("http://"), "rlproxy-trainer": trainer_metrics}
        config = prometheus_config(tmp_path / "prometheus.yml", targets)
        stack.enter_context(running(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            prometheus + "/-/ready", log_path=tmp_path / "prometheus.log"))

        drive_workload(proxy)
        wait_for(lambda: requests.get(f"{proxy}/policies").json()["active"] == 1, 60,
                 "the trainer to train and publish v1 (see trainer.log)")
        client = OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0)
        for _ in range(3):  # served by v1 now: the swap shows in the traffic by policy
            client.chat.completions.create(model="stub-model",
                                           messages=[{"role": "user", "content": "again"}])
        wait_for(lambda: query(prometheus, "rlproxy_trainer_active_policy_version == 1")
                 and query(prometheus, "rlproxy_active_policy_version == 1"), 20, "Prometheus to see v1")
        up = {r["metric"]["job"]: r["value"][1] for r in query(prometheus, "up")}
        assert up == {"rlproxy-proxy": "1", "rlproxy-trainer": "1"}
        # the workload did what the panels need: a trained step, an automatic reward, a skipped group
        assert query(prometheus, "rlproxy_trainer_steps_total >= 1")
        assert query(prometheus, 'rlproxy_rewards_total{kind="air", reason="tool_error", policy="0"}')
        assert query(prometheus, 'rlproxy_trainer_skipped_calls_total{reason="zero_advantage"}')

        # Each expression gets a few seconds: series that appeared last need two scrapes for a rate.
        pending = dict((expr, title) for title, expr in expressions(load_dashboard())
                       if not any(name in expr for name in ONLY_WITH))
        assert len(pending) > 40
        deadline = time.monotonic() + 15
        while pending and time.monotonic() < deadline:
            pending = {expr: title for expr, title in pending.items() if not query(prometheus, promql(expr))}
            if pending:
                time.sleep(1)
        assert not pending, "queries without data:\n" + "\n".join(f"  [{t}] {e}" for e, t in pending.items())
