"""`ollama-spec serve`: OpenAI- and Ollama-compatible HTTP APIs over one loaded Engine.

A thin face: the routes turn requests into engine Requests, a worker thread runs them one at a
time, and the answers carry the speculation statistics. No speculative logic lives here.
"""

from ollama_spec.server.http.app import create_app
from ollama_spec.server.http.run import serve
from ollama_spec.server.serving.settings import ServerSettings
from ollama_spec.server.serving.state import ServerState

__all__ = ["ServerSettings", "ServerState", "create_app", "serve"]
