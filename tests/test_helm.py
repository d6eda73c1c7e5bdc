"""The Helm chart (helm/rlproxy), rendered and linted by Helm itself (its Go SDK as a library, no cluster),
every manifest validated against the Kubernetes API schemas (bundled with kubernetes-validate, offline)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="needs helm-python-sdk (pip install -e '.[test]')")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate")
from kubernetes_validate.utils import latest_version  # noqa: E402

CHART = Path(__file__).resolve().parent.parent / "helm" / "rlproxy"
EVERYTHING = yaml.safe_load((CHART / "ci" / "everything-values.yaml").read_text())
# The oldest Kubernetes the chart claims (policy/v1 PDBs, batch/v1 Jobs) and the newest schemas we have.
KUBERNETES_VERSIONS = ("1.27.0", latest_version())
# The optional bundled Postgres is declared but not vendored, so Helm's lint warns that charts/ lacks it.
EXPECTED_LINT_WARNINGS = {"chart directory is missing these dependencies: postgresql"}


def render(values: dict | None = None) -> list[dict]:
    with helm.Chart.load(CHART) as chart:
        files = chart.render(values=values or {}, name="prod", namespace="ml", is_install=True)
    documents = []
    for name, text in sorted(files.items()):
        if name.endswith(".txt"):
            continue
        documents += [doc for doc in yaml.safe_load_all(text) if doc]
    return documents


def by_kind(documents: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in documents if doc["kind"] == kind}


def env_of(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def check_service_monitor(doc: dict) -> None:
    """ServiceMonitor is a Prometheus Operator CRD (no bundled schema): the fields it needs."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["spec"]["selector"]["matchLabels"]
    for endpoint in doc["spec"]["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization"}
        assert endpoint["port"] and endpoint["path"] == "/metrics"


def validate_all(documents: list[dict]) -> None:
    for doc in documents:
        if doc["kind"] == "ServiceMonitor":
            check_service_monitor(doc)
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} is invalid for Kubernetes {version}: "
                            f"{exc.message} at {'.'.join(map(str, exc.path))}")


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_helm_lint_finds_no_problem(values):
    report = helm.lint(CHART, values)
    assert report["total_charts_linted"] == 1 and not report["errors"]
    problems = {m["error"] for m in report["messages"] if m["severity"] >= 2}
    assert problems <= EXPECTED_LINT_WARNINGS, problems


def test_default_values_render_valid_manifests_for_one_gpu_engine():
    documents = render()
    validate_all(documents)
    deployments = by_kind(documents, "Deployment")
    assert set(deployments) == {"prod-rlproxy-proxy", "prod-rlproxy-trainer", "prod-rlproxy-engine-0"}
    assert not by_kind(documents, "ServiceMonitor") and not by_kind(documents, "NetworkPolicy")

    proxy = deployments["prod-rlproxy-proxy"]["spec"]["template"]["spec"]["containers"][0]
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = env_of(proxy)
    assert env["RLPROXY_UPSTREAM"] == "http://prod-rlproxy-engine-0:8000"
    assert env["RLPROXY_MIGRATE"] == "false"  # the migration Job does it
    database = {"secretKeyRef": {"name": "rlproxy-database", "key": "database-url"}}
    assert env["RLPROXY_DATABASE_URL"] == database
    assert env["RLPROXY_ADMIN_KEY"] == {"secretKeyRef": {"name": "prod-rlproxy", "key": "admin-key"}}
    assert deployments["prod-rlproxy-proxy"]["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]

    engine = deployments["prod-rlproxy-engine-0"]["spec"]["template"]["spec"]["containers"][0]
    assert engine["image"].startswith("vllm/vllm-openai:")
    args = engine["args"]
    for flag in ("--enable-lora", "--max-lora-rank", "--max-loras", "--enable-auto-tool-choice",
                 "--tool-call-parser"):
        assert flag in args
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in engine["env"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    trainer = deployments["prod-rlproxy-trainer"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in trainer["containers"][0]["resources"].get("limits", {})

    # adapters: one claim, mounted at the same path by the trainer (writes) and the engine (reads)
    assert len(by_kind(documents, "PersistentVolumeClaim")) == 1
    containers = [d["spec"]["template"]["spec"]["containers"][0] for d in deployments.values()]
    mounts = [m for c in containers for m in c["volumeMounts"] if m["name"] == "adapters"]
    assert len(mounts) == 2 and len({m["mountPath"] for m in mounts}) == 1
    assert env_of(trainer["containers"][0])["RLPROXY_ADAPTERS_DIR"] == mounts[0]["mountPath"]

    [job] = by_kind(documents, "Job").values()
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]

    dashboard = by_kind(documents, "ConfigMap")["prod-rlproxy-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "rlproxy.json").read_text())
    assert json.loads(dashboard["data"]["rlproxy.json"]) == shipped


def test_everything_on_renders_valid_manifests():
    documents = render(EVERYTHING)
    validate_all(documents)
    deployments = by_kind(documents, "Deployment")
    engines = sorted(name for name in deployments if "-engine-" in name)
    assert engines == ["prod-rlproxy-engine-0", "prod-rlproxy-engine-1", "prod-rlproxy-engine-2"]
    services = by_kind(documents, "Service")
    assert all(name in services for name in engines)  # one Service per replica: rollouts stay on one

    proxy = deployments["prod-rlproxy-proxy"]["spec"]["template"]["spec"]["containers"][0]
    env = env_of(proxy)
    upstreams = env["RLPROXY_UPSTREAM"].split()
    assert upstreams == [f"http://{name}:8000" for name in engines] + ["http://engine.elsewhere.svc:8000"]
    assert env["RLPROXY_AUTH"] == "on" and env["RLPROXY_RATE_LIMIT"] == "20" and env["RLPROXY_MAX_N"] == "4"
    assert proxy["args"] == ["serve", "--client-max-size", "33554432"]
    trainer = deployments["prod-rlproxy-trainer"]["spec"]["template"]["spec"]["containers"][0]
    assert env_of(trainer)["RLPROXY_UPSTREAM"].split() == upstreams  # adapters go to every engine
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "learning_rate=5e-5" in trainer["args"] and trainer["args"][:3] == ["train", "--nproc-per-node", "4"]
    trainer_pod = deployments["prod-rlproxy-trainer"]["spec"]["template"]["spec"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in trainer_pod["volumes"]
    # engines behind a key: they require it, the proxy and the trainer send it
    key = {"secretKeyRef": {"name": "engine-key", "key": "api-key"}}
    assert env_of(proxy)["RLPROXY_UPSTREAM_API_KEY"] == key and env_of(trainer)["RLPROXY_UPSTREAM_API_KEY"] == key
    for name in engines:
        assert env_of(deployments[name]["spec"]["template"]["spec"]["containers"][0])["VLLM_API_KEY"] == key

    monitors = by_kind(documents, "ServiceMonitor")
    assert set(monitors) == {"prod-rlproxy-proxy", "prod-rlproxy-trainer"}
    [endpoint] = monitors["prod-rlproxy-proxy"]["spec"]["endpoints"]
    assert endpoint["authorization"]["credentials"] == {"name": "prod-rlproxy", "key": "admin-key"}
    assert by_kind(documents, "NetworkPolicy") and by_kind(documents, "PodDisruptionBudget")
    assert by_kind(documents, "ConfigMap")["prod-rlproxy-dashboard"]["metadata"]["namespace"] == "monitoring"

    # the database URL is given: the chart keeps it in its Secret, and a hook Secret for the migration Job
    secrets = by_kind(documents, "Secret")
    assert set(secrets) == {"prod-rlproxy", "prod-rlproxy-migrate"}
    assert secrets["prod-rlproxy-migrate"]["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"


def test_the_bundled_postgres_migrates_after_install():
    documents = render({"postgresql": {"enabled": True}})
    validate_all(documents)
    [job] = by_kind(documents, "Job").values()
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    import base64

    url = base64.b64decode(by_kind(documents, "Secret")["prod-rlproxy"]["data"]["database-url"]).decode()
    assert url == "postgresql+asyncpg://rlproxy:rlproxy@prod-postgresql:5432/rlproxy"


def test_no_database_at_all_is_refused_with_a_message():
    with pytest.raises(helm.HelmError, match="database.url, database.existingSecret or postgresql.enabled"):
        render({"database": {"existingSecret": ""}})


# Variables read outside the CLI's flags (where the prepared base model is cached).
NOT_FLAGS = {"RLPROXY_CACHE_DIR"}


def test_variables_that_are_not_flags_are_read_somewhere():
    from core.settings import locations

    for name in NOT_FLAGS:
        assert f'"{name}"' in Path(locations.__file__).read_text()


def variables(command) -> set[str]:
    """The RLPROXY_* variables a command reads: its settings model's (shown on its flags), or click's own."""
    return {getattr(param, "variable", None) or param.envvar for param in command.params} - {None}


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_every_rlproxy_variable_the_chart_sets_is_a_flag_the_command_reads(values, monkeypatch):
    """Nothing complains of an unknown RLPROXY_* variable, so a typo would silently not configure anything."""
    from rlproxy.cli import main
    from rlproxy.commands.serve import SERVE_FLAGS
    from rlproxy.commands.train import TRAIN_FLAGS

    documents = render(values)
    containers = [c for kind in ("Deployment", "Job") for d in by_kind(documents, kind).values()
                  for c in d["spec"]["template"]["spec"]["containers"]]
    checked = 0
    for container in containers:
        if container["name"] == "vllm":
            continue
        command = main.commands[container["args"][0]]
        read = variables(command)
        ours = {name: value for name, value in env_of(container).items()
                if name.startswith("RLPROXY_") and name not in NOT_FLAGS}
        assert set(ours) <= read, f"{container['name']}: {sorted(set(ours) - read)} are read by nothing"
        for name in read:
            monkeypatch.delenv(name, raising=False)
        for name, value in ours.items():  # values from Secrets get a stand-in
            monkeypatch.setenv(name, value if isinstance(value, str) else "postgresql+asyncpg://u:p@db/x")
        with command.make_context(container["args"][0], list(container["args"][1:])) as context:
            checked += 1
            if command.name == "serve":
                settings = SERVE_FLAGS.build(context.params)
                assert settings.host == "0.0.0.0" and settings.migrate is False
                assert settings.upstreams == tuple(ours["RLPROXY_UPSTREAM"].split())
                assert settings.database_url == "postgresql+asyncpg://u:p@db/x"
            if command.name == "train":
                settings = TRAIN_FLAGS.build(context.params)
                assert settings.upstreams == tuple(ours["RLPROXY_UPSTREAM"].split())
                assert str(settings.adapters_dir) == ours["RLPROXY_ADAPTERS_DIR"]
    assert checked == 3  # proxy, trainer, migrate
