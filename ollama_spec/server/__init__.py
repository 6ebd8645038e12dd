"""`ollama-spec serve`: OpenAI- and Ollama-compatible HTTP APIs over the store's models (or one pinned pair).

A thin face, in three sub-packages, each importing only those below it: `serving/` (the pairs served, loaded on
demand, and each request checked and built for its pair's step loop), `protocol/` (each API's wire format),
`http/` (the app, its middleware and the routes). The answers carry the speculation statistics; no
speculative logic lives here.
"""

from ollama_spec.server.http.app import create_app
from ollama_spec.server.http.run import serve
from ollama_spec.server.serving.settings import ServerSettings
from ollama_spec.server.serving.state import ServerState

__all__ = ["ServerSettings", "ServerState", "create_app", "serve"]
