"""The trainer (`rlproxy train`): the worker (`trainer.worker`) claims rewarded rollouts from the store, turns
their recorded calls into transitions (`trainer.batch`, `trainer.transitions`: plain Python), takes a LoRA PPO
step on them (`trainer.ppo` with `trainer.logprobs` and `trainer.step_metrics`, torch; across processes
`trainer.parallel` and `trainer.sharding`), saves the adapter atomically (`trainer.adapter`), loads it into every
engine and records the version (`trainer.publish`), and lets a gate decide whether it serves (`trainer.gates`).
Between steps it expires, judges (`trainer.judge`) and prunes (`trainer.housekeeping`). `rlproxy export` is
`trainer.export`.

Import the module you need: importing this package loads nothing else, so the plain parts (transitions, export,
gates) work without torch."""
