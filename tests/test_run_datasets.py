"""`rlproxy run --tasks` given a Parquet file or a Hugging Face `datasets` folder (`save_to_disk`): read with the
`datasets` package when it is installed (against the real proxy in front of the stand-in engine); without it,
refused before anything starts with how to install it."""
from __future__ import annotations

import importlib.util
import json

import pytest

from tests.run_support import TASKS, finished, rlproxy_run, stored

HAS_DATASETS = importlib.util.find_spec("datasets") is not None
ROWS = [json.loads(line) for line in TASKS.read_text().splitlines()[:3]]  # {"id", "question", "answer"}


@pytest.mark.skipif(not HAS_DATASETS, reason="the datasets package is not installed")
@pytest.mark.parametrize("form", ["parquet", "saved folder"])
def test_a_parquet_file_or_a_saved_dataset_is_a_task_set(proxy_url, tmp_path, form):
    import datasets  # optional: only these tests need it (and pyarrow, which it brings)
    import pyarrow
    import pyarrow.parquet

    tasks = tmp_path / "tasks.parquet"
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(ROWS), tasks)
    if form == "saved folder":  # as `save_to_disk` leaves one
        saved = tmp_path / "tasks"
        datasets.Dataset.from_parquet(str(tasks), cache_dir=str(tmp_path / "cache")).save_to_disk(str(saved))
        tasks = saved
    log = tmp_path / "run.jsonl"
    result = rlproxy_run(proxy_url, log, "--tasks", str(tasks), "--agent", "examples.run_agent:solve",
                         "--task-id-field", "id", "--attempts", "2")
    assert result.exit_code == 0, result.output
    entries = finished(log)
    assert sorted(e["task_id"] for e in entries) == sorted(row["id"] for row in ROWS for _ in range(2))
    for entry in entries:
        assert entry["status"] == "rewarded"
        assert stored(proxy_url, entry["rollout_id"])["reward"] == entry["reward"]


@pytest.mark.skipif(HAS_DATASETS, reason="the datasets package is installed")
@pytest.mark.parametrize("form", ["parquet", "saved folder"])
def test_without_the_datasets_package_it_says_how_to_install_it(tmp_path, form):
    if form == "parquet":
        tasks = tmp_path / "tasks.parquet"
        tasks.write_bytes(b"PAR1")
    else:
        tasks = tmp_path / "tasks"
        tasks.mkdir()
        (tasks / "dataset_info.json").write_text("{}")
    result = rlproxy_run("http://127.0.0.1:9", tmp_path / "log.jsonl", "--tasks", str(tasks),
                         "--agent", "examples.run_agent:solve")
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert result.output.strip() == (f"rlproxy run: {tasks}: reading a Parquet file or a datasets folder needs the "
                                     "datasets package (pip install datasets); or give JSON lines")
