"""The edge's tests (proxy/edge/: keys, rate and size limits, uploads, the HTTP server's bounds), each against a
real `rlproxy serve` over Postgres. The fixtures they use come from tests/conftest.py (`postgres_server`,
`run_dir`, `stub_url`, `database_url`); an API key of a project is tests/support.py's `make_key`. A fixture
two of these modules would share belongs here."""
