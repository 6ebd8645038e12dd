"""Synthetic GGUFs and store entries that only tests use: real layouts (Gemma 3's sliding window,
Mamba, SentencePiece, header-only shapes of real models, padded and code vocabularies, LoRA
adapters) over the demo models' builders in ollama_spec/synthetic/."""
