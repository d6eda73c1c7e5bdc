"""The API's tests (proxy/api/, proxy/checks.py): the routes as declared and documented (the OpenAPI document
against the running proxy), who may call each route, the error shapes and the order of checks. The fixtures
they use (`stub_url`, `postgres_server`, `run_dir`, `tenants`) come from tests/conftest.py."""
