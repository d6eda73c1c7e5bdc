"""The bundled demo: a tool-using agent on locally generated tasks (see docs/demo-tasks.md).

    from demo.tasks import train_tasks, heldout_tasks
    from demo.agent import run_episode, evaluate

Nothing here downloads anything: tasks come from a seeded generator, the tool runs in-process. Importing this
package loads nothing else: the agent needs `openai`, which the proxy alone (`pip install rlproxy`) does not
install, while the command line reads the demo settings (core/settings/demo.py).
"""
