"""The `rlproxy` subcommands, one module each; rlproxy/cli.py puts them together."""
