"""Where the engine and the trainer run, and in what precision, decided from what the machine shows: GPUs counted
from CUDA_VISIBLE_DEVICES or the driver's list (faked here: there is no GPU on CI), the engine's --dtype, and the
trainer's check of free device memory before it loads."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import RlproxyError
from core.hardware import (GiB, DeviceMemoryError, engine_dtype, trainer_bytes, trainer_memory_problem,
                           visible_gpus)
from core.settings import EngineSettings
from engine.command import engine_command, vllm_available


@pytest.fixture
def driver(tmp_path) -> Path:
    """/proc/driver/nvidia/gpus of a machine with eight GPUs."""
    for i in range(8):
        (tmp_path / f"0000:{i:02x}:00.0").mkdir()
    return tmp_path


def test_gpus_are_counted_from_the_driver_unless_cuda_visible_devices_says(driver, tmp_path):
    assert visible_gpus({}, driver) == 8
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0"}, driver) == 1
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,2,3"}, driver) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, driver) == 0  # hidden
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, driver) == 0
    assert visible_gpus({}, tmp_path / "no-driver") == 0  # a CPU machine


def test_the_engine_serves_bf16_on_gpus_and_float32_on_a_cpu():
    assert engine_dtype(0) == "float32"  # the CPU trainer's precision: the recorded log-probs match it
    assert engine_dtype(1) == engine_dtype(8) == "auto"  # the checkpoint's bf16


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_the_engine_command_line_takes_its_dtype_from_the_gpus_it_will_see():
    def dtype(command: list[str]) -> str:
        return command[command.index("--dtype") + 1]

    assert dtype(engine_command(EngineSettings(), Path("/m"), gpus=0)) == "float32"
    assert dtype(engine_command(EngineSettings(), Path("/m"), gpus=4)) == "auto"
    assert dtype(engine_command(EngineSettings(), Path("/m"), dtype="bfloat16", gpus=0)) == "bfloat16"  # chosen


def test_a_trainer_on_the_engines_gpu_is_told_to_move_in_one_line():
    needed = trainer_bytes(8_000_000_000, ranks=1)
    assert 16 * GiB < needed < 17 * GiB  # 16 GB (14.9 GiB) of bf16 weights and 2 GiB besides
    # an 80 GiB card of which vLLM took 90%
    problem = trainer_memory_problem("cuda:0", free=8 * GiB, total=80 * GiB, needed=needed)
    assert problem is not None and "\n" not in problem
    assert "cuda:0 has 8.0 GiB free of 80.0 GiB" in problem
    assert "CUDA_VISIBLE_DEVICES" in problem and "--gpu-memory-utilization" in problem
    # an empty card too small for the model: shard it instead
    small = trainer_memory_problem("cuda:0", free=15 * GiB, total=16 * GiB, needed=needed)
    assert "--nproc-per-node" in small and "offload_base" in small
    assert trainer_memory_problem("cuda:0", free=70 * GiB, total=80 * GiB, needed=needed) is None


def test_sharding_divides_what_each_rank_needs():
    one, eight = trainer_bytes(8_000_000_000, 1), trainer_bytes(8_000_000_000, 8)
    assert eight < one / 3  # a shard, the gathered units and the fixed part
    assert issubclass(DeviceMemoryError, RlproxyError)


def test_the_mesh_replicates_a_base_that_fits_one_device_and_shards_one_that_does_not():
    from trainer.sharding import mesh_shape

    eight_b, h100 = 16_400_000_000, 80 * GiB
    assert mesh_shape("auto", 8, 8, eight_b, h100) == (8, 1)  # a third of the card at most: ddp
    assert mesh_shape("auto", 8, 8, 4 * eight_b, h100) == (1, 8)  # 32B on one node: fsdp
    assert mesh_shape("auto", 16, 8, 4 * eight_b, h100) == (2, 8)  # two nodes: hsdp, gathers inside a node
    assert mesh_shape("auto", 2, 2, 1000, None) == (1, 2)  # CPUs: always sharded
    assert mesh_shape("fsdp", 16, 8, eight_b, h100) == (1, 16)  # as set
    assert mesh_shape("hsdp", 16, 8, eight_b, h100) == (2, 8)
    with pytest.raises(ValueError, match="same ranks on every node"):
        mesh_shape("hsdp", 12, 8, eight_b, h100)


def test_the_trainer_refuses_to_load_onto_a_gpu_without_room_before_reading_a_weight(tiny_model, monkeypatch):
    torch = pytest.importorskip("torch")
    from trainer.loading import check_device_memory, checkpoint_parameters

    from transformers import AutoModelForCausalLM

    parameters = checkpoint_parameters(str(tiny_model))  # from the safetensors headers alone
    assert parameters == AutoModelForCausalLM.from_pretrained(tiny_model).num_parameters()
    needed = trainer_bytes(parameters, 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (needed - 1, 16 * GiB))  # an engine took it
    with pytest.raises(DeviceMemoryError, match="cuda:0 has .* GiB free of 16.0 GiB.*CUDA_VISIBLE_DEVICES"):
        check_device_memory(torch.device("cuda", 0), str(tiny_model), ranks=1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (needed, 16 * GiB))
    check_device_memory(torch.device("cuda", 0), str(tiny_model), ranks=1)  # just enough
    check_device_memory(torch.device("cpu"), str(tiny_model), ranks=1)  # nothing to check on a CPU


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_an_engine_given_no_gpu_in_its_environment_serves_float32():
    from engine.local import Engine

    command = Engine(EngineSettings(), model_path=Path("/m"), env={"CUDA_VISIBLE_DEVICES": ""}).command()
    assert command[command.index("--dtype") + 1] == "float32"
