"""The project's own llama-architecture models, laid out as a real Ollama store.

No real weights can be downloaded where this project is built and tested, so it makes its own:
deterministic GGUF files with a real byte-level BPE tokenizer, special tokens and a chat
template, that llama-cpp-python loads and runs exactly like published models.
"""

from .catalog import PAIRS, build_demo_store, build_pair_store

__all__ = ["PAIRS", "build_demo_store", "build_pair_store"]
