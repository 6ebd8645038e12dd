"""Typed errors raised by the core; the CLI turns each into a one-line message."""


def one_line(text: str) -> str:
    """`text` with line breaks and unprintable characters escaped as repr() writes them.

    Messages quote paths and names from the store, which may hold any character.
    """
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class OllamaSpecError(Exception):
    """Base class: anything a user can fix by changing input, flags or environment."""


class InvalidModelName(OllamaSpecError):
    pass


class StoreNotFound(OllamaSpecError):
    pass


class StoreUnreadable(OllamaSpecError):
    pass


class ModelNotFound(OllamaSpecError):
    pass


class InvalidManifest(OllamaSpecError):
    pass


class BlobError(OllamaSpecError):
    """A blob is missing, has the wrong size, or fails its sha256 check."""


class NotGGUF(OllamaSpecError):
    pass


class CorruptGGUF(OllamaSpecError):
    pass


class IncompatibleDraft(OllamaSpecError):
    pass


class InsufficientMemory(OllamaSpecError):
    pass


class InvalidSetting(OllamaSpecError):
    pass


class ModelLoadError(OllamaSpecError):
    pass


class ContextFull(OllamaSpecError):
    pass


class InferenceError(OllamaSpecError):
    """llama.cpp refused to evaluate a batch or to cut a cache back."""


class Stopped(OllamaSpecError):
    """A generation stopped before its end because its request was cancelled (its client left, its model
    is being deleted, the server is stopping)."""


class PullError(OllamaSpecError):
    """A pull failed: registry, daemon or Hugging Face unreachable or answering with an error."""


class StoreNotWritable(OllamaSpecError):
    pass


class InsufficientDisk(OllamaSpecError):
    pass


class UnusableModel(OllamaSpecError):
    """A model that cannot serve as a target or a draft (no architecture, vocabulary or layers)."""


class RpcUnavailable(OllamaSpecError):
    """An RPC server cannot be reached or used, or this build has no RPC backend."""


class NoHfRepo(OllamaSpecError):
    """No Hugging Face repository of original weights is known for an Ollama name (`ollama-spec vllm`)."""


class VllmUnavailable(OllamaSpecError):
    """vLLM is not installed, or too old for speculative decoding with a draft model."""


class InvalidRequest(OllamaSpecError):
    """A request that cannot be served as asked; `param`: the field at fault, where there is one."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class PromptTooLong(InvalidRequest):
    """A prompt (and the tokens asked for after it) past the context; `wanted`: the context that would
    hold it, which a server may load the model again with."""

    def __init__(self, message: str, wanted: int, param: str | None = None):
        super().__init__(message, param)
        self.wanted = wanted


class BodyTooLarge(OllamaSpecError):
    """A request body past the server's limit."""


class ServerFault(OllamaSpecError):
    """A valid request the server cannot serve: its store unreadable, no memory for the model, a generation
    that failed."""


class Busy(OllamaSpecError):
    """The server cannot take the request now; `retry_after`: the seconds to wait before asking again."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class UpstreamUnreachable(OllamaSpecError):
    """The Ollama daemon a request is forwarded to does not answer."""
