"""The inference engine as the rest of the project sees it: the local vLLM process, the bundled model, and the
one module that loads adapters into every replica (`engine.adapters`) with the version lifecycle over it."""
