"""The training core: transitions from recorded calls (`trainer.transitions`, plain Python), LoRA PPO on them
(`trainer.ppo`, torch), atomic adapter publishing (`trainer.publish`), the worker that runs it all against the
store (`trainer.worker`). Import the module you need: importing this package loads nothing else, so the plain
parts (config, transitions, export) work without torch."""
