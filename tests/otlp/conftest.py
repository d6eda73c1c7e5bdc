"""The OTLP wing's tests (proxy/otlp/: trace exports, their decoding off the event loop, each project's share of
the decoders, the rewards spans carry), each against a real `rlproxy serve` over Postgres started by its own
`proxy` fixture with the flags it tests. The bounded-ingest helpers they share with tests/test_bounded_ingest.py
are tests/bounded.py; the fixtures of every test (`stub_url`, `postgres_server`, `run_dir`) tests/conftest.py."""
