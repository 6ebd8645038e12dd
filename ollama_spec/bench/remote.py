"""`--url`: time any OpenAI-compatible server (ollama-spec serve, llama-server, vLLM) over streaming
chat completions, the way people time `chat.completions.create(stream=True)`."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.runner import Progress
from ollama_spec.errors import InvalidSetting, OllamaSpecError

DEFAULT_TIMEOUT_S = 600.0
CHAT_PATH = "/chat/completions"  # appended to --url; a --url that already ends in it is the endpoint itself


class ServerError(OllamaSpecError):
    """The server is unreachable, refused the request, or does not stream OpenAI-style."""


@dataclass(frozen=True)
class RemoteSettings:
    url: str
    model: str
    max_tokens: int = 256
    runs: int = 3
    temperature: float = 0.0
    seed: int = 0
    warmup: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S
    concurrency: int = 1  # clients streaming at once, each the whole prompt set `runs` times

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", api_base(self.url))
        if self.concurrency < 1:
            raise InvalidSetting(f"--concurrency must be at least 1, got {self.concurrency}")

    @property
    def endpoint(self) -> str:
        return self.url + CHAT_PATH


def api_base(url: str) -> str:
    """`url` checked and written as the API base (http://HOST:PORT/v1), without a trailing slash or
    /chat/completions: refused here rather than as a traceback or a misleading error mid-bench."""
    if not url.startswith(("http://", "https://")):
        raise InvalidSetting(f"--url must start with http:// or https://, got '{url}'")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidSetting(f"--url '{url}' is not a valid URL ({exc})") from None
    if not parsed.host:
        raise InvalidSetting(f"--url '{url}' names no host; give the API base, e.g. http://127.0.0.1:8000/v1")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InvalidSetting(f"--url '{url}': port {parsed.port} is out of range (1 to 65535)")
    base = url.rstrip("/")
    return base.removesuffix(CHAT_PATH).rstrip("/") if base.endswith(CHAT_PATH) else base


@dataclass
class RemoteSample:
    prompt: str
    run: int
    tokens: int
    first_token_s: float
    total_s: float
    # the drafts of the request and those accepted, where the server says (llama-server's `timings`, which
    # ollama-spec serve sends too); None where it does not
    drafted: int | None = None
    accepted: int | None = None

    @property
    def tokens_per_second(self) -> float:
        decode = self.total_s - self.first_token_s
        return (self.tokens - 1) / decode if self.tokens > 1 and decode > 0 else 0.0


@dataclass
class RemoteResult:
    settings: RemoteSettings
    samples: list[RemoteSample] = field(default_factory=list)
    wall_s: float = 0.0  # the timed requests, first start to last end

    @property
    def aggregate_tokens_per_second(self) -> float:
        """Every client's tokens over the wall time: what the server gave all of them together."""
        return sum(s.tokens for s in self.samples) / self.wall_s if self.wall_s > 0 else 0.0

    def latency_percentiles(self) -> tuple[float, float]:
        """The p50 and p95 of the requests' whole times (seconds)."""
        times = sorted(s.total_s for s in self.samples)
        if len(times) < 2:
            return (times[0], times[0]) if times else (0.0, 0.0)
        cuts = statistics.quantiles(times, n=20, method="inclusive")
        return statistics.median(times), cuts[18]

    def by_prompt(self) -> dict[str, list[RemoteSample]]:
        grouped: dict[str, list[RemoteSample]] = {}
        for sample in self.samples:
            grouped.setdefault(sample.prompt, []).append(sample)
        return grouped

    def run_rates(self) -> list[float]:
        """A request's tok/s in each run, as the in-process bench's rows count it (samples.Row.run_rates):
        the run's generated tokens after each request's first over their decode times."""
        rates = []
        for run in sorted({s.run for s in self.samples}):
            chosen = [s for s in self.samples if s.run == run]
            decode = sum(s.total_s - s.first_token_s for s in chosen)
            rates.append(sum(s.tokens - 1 for s in chosen) / decode if decode > 0 else 0.0)
        return rates

    @property
    def tokens_per_second(self) -> float:
        """The median over runs of a request's rate (`run_rates`): one number the in-process bench's
        single-stream rows can be set beside."""
        return statistics.median(self.run_rates()) if self.samples else 0.0

    @property
    def drafts(self) -> tuple[int, int] | None:
        """(drafted, accepted) over the requests whose server said, or None where none did."""
        told = [s for s in self.samples if s.drafted is not None and s.accepted is not None]
        return (sum(s.drafted for s in told), sum(s.accepted for s in told)) if told else None

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.first_token_s for s in self.samples)


def run_remote(
    settings: RemoteSettings, prompts: Sequence[Prompt], progress: Progress = lambda label: None
) -> RemoteResult:
    """Stream every prompt `runs` times (after one unrecorded warm-up request); with concurrency N,
    N clients do so at once, each starting at another prompt of the set."""
    result = RemoteResult(settings)
    timeout = httpx.Timeout(settings.timeout_s, connect=10.0)
    with httpx.Client(timeout=timeout) as client:
        if settings.warmup:
            stream_chat(client, settings, prompts[0], min(16, settings.max_tokens))
            progress("warm-up")
    lock, errors = threading.Lock(), []

    def one_client(index: int) -> None:
        order = [*prompts[index % len(prompts) :], *prompts[: index % len(prompts)]]
        try:
            with httpx.Client(timeout=timeout) as client:
                for run in range(settings.runs):
                    for prompt in order:
                        streamed = stream_chat(client, settings, prompt, settings.max_tokens)
                        with lock:
                            result.samples.append(RemoteSample(prompt.name, run, *streamed))
                            progress(prompt.name)
        except ServerError as exc:
            errors.append(exc)

    started = time.perf_counter()
    clients = [threading.Thread(target=one_client, args=(i,)) for i in range(settings.concurrency)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    result.wall_s = time.perf_counter() - started
    if errors:
        raise errors[0]
    return result


def planned_remote_units(settings: RemoteSettings, n_prompts: int) -> int:
    return (1 if settings.warmup else 0) + settings.runs * n_prompts * settings.concurrency


def stream_chat(
    client: httpx.Client, settings: RemoteSettings, prompt: Prompt, max_tokens: int
) -> tuple[int, float, float, int | None, int | None]:
    """One streamed chat completion: (tokens, seconds to the first token, seconds in all, drafts, accepted
    drafts; the last two where a chunk carries llama-server's `timings`, else None)."""
    messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + [
        {"role": "user", "content": prompt.prompt}
    ]
    body = {
        "model": settings.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": settings.temperature,
        "seed": settings.seed,
        "stream_options": {"include_usage": True},
        # every request runs to max_tokens, as the in-process rows do: the same tokens timed on either side,
        # and on every server (llama-server and vLLM take it too)
        "ignore_eos": True,
    }
    pieces, usage_tokens, first, timings = 0, None, 0.0, {}
    start = time.perf_counter()
    try:
        with client.stream("POST", settings.endpoint, json=body) as response:
            if response.status_code >= 400:
                raise _refused(response, settings)
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue  # SSE comments, event names, keep-alives
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = _parse_chunk(data, settings.endpoint)
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens", usage_tokens)
                if isinstance(chunk.get("timings"), dict):
                    timings = chunk["timings"]
                for choice in chunk.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        if pieces == 0:
                            first = time.perf_counter() - start
                        pieces += 1
    except httpx.ConnectError as exc:
        raise ServerError(
            f"cannot reach the server at {settings.url} ({_reason(exc)}); start it or fix --url"
        ) from None
    except httpx.TimeoutException:
        raise ServerError(f"no answer from {settings.url} within {settings.timeout_s:.0f} s") from None
    except httpx.HTTPError as exc:
        raise ServerError(f"talking to {settings.url} failed: {_reason(exc)}") from None
    total = time.perf_counter() - start
    if pieces == 0:
        raise ServerError(f"{settings.endpoint} streamed no text for prompt '{prompt.name}'")
    # Servers that report usage give the true token count; otherwise each content chunk is one token.
    drafted, accepted = (_count(timings, key) for key in ("draft_n", "draft_n_accepted"))
    return usage_tokens or pieces, first, total, drafted, accepted


def _refused(response: httpx.Response, settings: RemoteSettings) -> ServerError:
    """The one-line error for a chat completion the server answered with an HTTP error."""
    detail = " ".join(response.read().decode("utf-8", "replace").split())[:200]
    hint = ""
    if response.status_code == 404 and not settings.url.endswith("/v1"):
        hint = "; --url is the API base, which ends in /v1 on OpenAI-compatible servers (e.g. http://127.0.0.1:8000/v1)"
    return ServerError(
        f"{settings.endpoint} answered HTTP {response.status_code}: {detail or response.reason_phrase}{hint}"
    )


def _count(timings: dict, key: str) -> int | None:
    value = timings.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _parse_chunk(data: str, endpoint: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise ServerError(f"{endpoint} does not stream OpenAI-style chunks (got {data[:60]!r})") from None
    if not isinstance(chunk, dict):
        raise ServerError(f"{endpoint} does not stream OpenAI-style chunks (got {data[:60]!r})")
    if "error" in chunk:
        raise ServerError(f"{endpoint} reported an error: {chunk['error']}")
    return chunk


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.splitlines()[0]
