"""One arithmetic agent written with five frameworks, each recorded by the proxy (see examples/README.md)."""
