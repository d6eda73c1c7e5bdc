"""The rlproxy HTTP server: OpenAI-compatible routes that capture every policy call, plus rollouts, rewards,
policies and operations routes."""
