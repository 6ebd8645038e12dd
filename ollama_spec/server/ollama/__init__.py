"""Ollama's API: /api/chat, /api/generate, the model routes (tags, show, ps, pull) and the embeddings."""
