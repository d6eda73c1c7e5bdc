"""`rlproxy run`: drive an agent over a task set through a running proxy, as a pure HTTP client of it (no
proxy, store or trainer code is imported here). One rollout per attempt; rewards come from the agent or from
what it returns; progress, a log of every attempt, and resuming after a crash."""
