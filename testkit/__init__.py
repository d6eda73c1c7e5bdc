"""What the tests and the benchmarks both use to run rlproxy for real, so neither imports the other:

    processes.py    free ports, rlproxy's commands as real processes (started, waited for, stopped with their
                    process group), throwaway Postgres databases
    stub_engine.py  a small deterministic server that answers like vLLM's OpenAI server (token ids, logprobs,
                    SSE, tool calls, LoRA loading): the local stand-in engine for testing the proxy alone
    model_kit/      tiny random models of other families (Qwen3, Llama 3, Mistral) with their real vocabularies
                    from registry packages and this project's chat templates of each family
    swap_load.py    steady agent traffic while adapter versions are published, counting what each call saw

Nothing here is imported by the proxy, the store or the trainer.
"""
