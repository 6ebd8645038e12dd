"""Other engines' ways to the same pair: llama-cpp-python's draft_model hook, vLLM."""
