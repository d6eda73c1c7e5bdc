"""Two ranks of the trainer as `rlproxy train` joins them (trainer/parallel.py: the command group, the collective
timeout, the peer watch), without torchrun, so that when a test kills one rank nothing but the trainer's own
code can stop the other. Rank 0 builds the policy everywhere, then either idles as the worker does between
polls (`idle`) or steps on a fixed batch without end (`step`); the other rank follows.

    RANK=R WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=P python tests/parallel_idle.py MODEL idle|step TIMEOUT HEARTBEATS
"""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.settings import TrainingSettings  # noqa: E402
from tests.parallel_step import synthetic_batch  # noqa: E402
from trainer import parallel  # noqa: E402
from trainer.ppo import PolicyTrainer  # noqa: E402


def main() -> None:
    model, mode, timeout, heartbeats = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    collective = parallel.init_from_environment(timeout, heartbeats)
    config = TrainingSettings(micro_batch_tokens=64, ppo_epochs=1)

    def build(adapter_dir):
        return PolicyTrainer(model, config, adapter_dir, collective)

    if collective.rank != 0:
        parallel.follow(build, collective)
        return
    policy = parallel.LeaderPolicy.start(build, None, collective)
    print("ready", flush=True)
    batch = synthetic_batch()
    while True:
        collective.heartbeat.beat()
        if mode == "step":
            policy.step(batch)
            print("stepped", flush=True)
        else:
            time.sleep(0.1)


if __name__ == "__main__":
    main()
