"""The project's own llama-architecture models, laid out as a real Ollama store.

No real weights can be downloaded where this project is built and tested, so it makes its own:
deterministic GGUF files with a real byte-level BPE tokenizer, special tokens and a chat
template, that llama-cpp-python loads and runs exactly like published models.
"""

import logging

from ollama_spec.synthetic.catalog import PAIRS, build_demo_store, build_pair_store

# The gguf package logs at INFO for every file its writer makes (the byte order, the files written): under
# a log configured at INFO, serve's, that is noise each time the repack canary writes its models. Its
# warnings and errors still show.
logging.getLogger("gguf").setLevel(logging.WARNING)

__all__ = ["PAIRS", "build_demo_store", "build_pair_store"]
