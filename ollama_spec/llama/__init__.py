"""The one seam to llama.cpp: loading, evaluating, grammars, RPC, embeddings."""
