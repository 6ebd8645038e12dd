"""Models: names, Ollama's store (read-only), manifests, Modelfiles, GGUF headers, draft compatibility."""
