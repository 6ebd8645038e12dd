"""Ollama's routes: /api/chat, /api/generate, the model routes (tags, show, ps, pull, delete, copy) and the
embeddings. Their request models: protocol/ollama.py."""
