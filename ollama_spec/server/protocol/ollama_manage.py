"""The request bodies of Ollama's store routes (/api/pull, /api/delete, /api/copy), as api/types.go has
them: unknown fields ignored, JSON nulls read as unset, `name` the older spelling of `model`."""

from __future__ import annotations

from pydantic import ConfigDict

from ollama_spec.server.protocol.shared import NullsAsDefaults


class _Named(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")

    model: str = ""
    name: str = ""  # older clients

    @property
    def asked(self) -> str:
        """cmp.Or(model, name), as Ollama picks it."""
        return self.model or self.name


class PullModelRequest(_Named):  # username, password: ignored, as Ollama ignores them
    insecure: bool = False
    stream: bool = True  # absent or null: streamed


class DeleteRequest(_Named):
    pass


class CopyRequest(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")

    source: str = ""
    destination: str = ""
