"""`ollama-spec serve` maps its flags (shared with `generate`) onto the server's settings."""

import ollama_spec.server


def test_flags_become_the_server_settings(invoke, tiny_store, monkeypatch):
    seen = {}

    def capture(state, sock):
        engine = state.serving.served.engine  # the pinned pair's
        seen["settings"], seen["engine"], seen["address"] = state.settings, engine, sock.getsockname()
        seen["n_ctx"] = engine.target.n_ctx

    monkeypatch.setattr(ollama_spec.server, "serve", capture)
    monkeypatch.setenv("OLLAMA_SPEC_API_KEY", "sekret")
    result = invoke(
        "serve",
        "tiny-target",
        "-d",
        "tiny-draft",
        "-k",
        "3",
        "--draft-p-min",
        "0.2",
        "-t",
        "0.3",
        "--top-k",
        "7",
        "--seed",
        "5",
        "--ctx",
        "1024",
        "--threads",
        "1",
        "--no-check",
        "--port",
        "0",
        "--served-model-name",
        "gpt-4o",
        "--served-model-name",
        "llama3",
        "--max-queue",
        "2",
        "--models-dir",
        tiny_store,
    )
    assert result.exit_code == 0, result.output
    settings = seen["settings"]
    assert settings.api_key == "sekret" and settings.aliases == ("gpt-4o", "llama3") and settings.max_queue == 2
    assert (settings.sampling.temperature, settings.sampling.top_k, settings.sampling.seed) == (0.3, 7, 5)
    assert settings.sampling.top_p == 0.9  # not given: Ollama's default
    assert (settings.speculation.num_speculative_tokens, settings.speculation.draft_p_min) == (3, 0.2)
    assert seen["address"][0] == "127.0.0.1" and seen["address"][1] > 0 and seen["n_ctx"] == 1024
    assert seen["engine"].draft_model.name == "tiny-draft:latest"


def test_bad_settings_are_one_line(invoke, tiny_store):
    result = invoke("serve", "tiny-target", "--max-queue", "-1", "--port", "0", "--models-dir", tiny_store)
    assert result.exit_code == 1 and result.output.strip() == "Error: --max-queue must be >= 0, got -1"


def test_a_manifests_draft_and_go_template_are_used_and_logged(invoke, tiny_store, tmp_path, monkeypatch, caplog):
    import json
    import shutil

    from tests.stores import variant, without_chat_template

    root = tmp_path / "models"
    shutil.copytree(tiny_store, root)
    without_chat_template(root, "bare")
    params = json.dumps({"draft_num_predict": 4}).encode()
    variant(
        root,
        "bare-drafted",
        base="bare",
        keep=lambda layer: not layer["mediaType"].endswith(".params"),
        extra=[("draft", "tiny-draft"), ("params", params)],
    )
    seen = {}
    monkeypatch.setattr(ollama_spec.server, "serve", lambda state, sock: seen.update(state=state))
    result = invoke("serve", "bare-drafted", "--threads", "1", "--no-check", "--port", "0", "--models-dir", root)
    assert result.exit_code == 0, result.output
    assert "note: drafting with the draft stored in bare-drafted:latest's manifest" in result.stderr
    assert seen["state"].serving.served.engine.draft_model.name == "bare-drafted:latest (its draft layer)"
    assert seen["state"].settings.speculation.num_speculative_tokens == 4
    assert any("bare-drafted:latest has no chat template in its GGUF" in r.getMessage() for r in caplog.records)


def test_upstream_from_the_flag_or_ollama_host_or_none(invoke, tiny_store, monkeypatch):
    from tests.pull_servers import closed_port
    from tests.upstream_daemon import UpstreamDaemon

    seen = []
    monkeypatch.setattr(ollama_spec.server, "serve", lambda state, sock: seen.append(state.upstream))
    store = ("--port", "0", "--models-dir", str(tiny_store))
    daemon = UpstreamDaemon()
    try:
        monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{closed_port()}")
        assert invoke("serve", *store).exit_code == 0 and seen[-1] is None  # nobody there: nothing forwarded
        monkeypatch.setenv("OLLAMA_HOST", daemon.url)
        assert invoke("serve", *store).exit_code == 0 and seen[-1].base_url == daemon.url
        assert invoke("serve", "--no-upstream", *store).exit_code == 0 and seen[-1] is None
        monkeypatch.delenv("OLLAMA_HOST")
        given = invoke("serve", "--upstream", daemon.url.removeprefix("http://"), *store)
        assert given.exit_code == 0 and seen[-1].base_url == daemon.url
        pinned = invoke("serve", "tiny-target", "--no-check", "--upstream", daemon.url, *store)
        assert pinned.exit_code == 0 and seen[-1].base_url == daemon.url
    finally:
        daemon.close()
    both = invoke("serve", "--upstream", "http://127.0.0.1:1", "--no-upstream", *store)
    assert both.exit_code == 2 and "give --upstream URL or --no-upstream, not both" in both.output
    port = str(closed_port())
    itself = invoke("serve", "--upstream", f"localhost:{port}", "--port", port, "--models-dir", str(tiny_store))
    assert itself.exit_code == 2 and "this server's own address" in itself.output


def test_without_a_target_the_flags_reach_the_store_as_data(invoke, tiny_store, monkeypatch):
    """serve's sampling and speculation flags are a RequestDefaults the store lays over each model's params
    (no callback into the command); --ngram drafts with n-gram lookup beside each model's draft."""
    from ollama_spec.planning.devices import system_ram
    from ollama_spec.server.serving.defaults import RequestDefaults

    seen = {}
    monkeypatch.setattr(ollama_spec.server, "serve", lambda state, sock: seen.update(state=state))
    flags = ("-t", "0.3", "--top-k", "7", "-k", "4", "--ngram", "--max-queue", "2", "--no-check")
    result = invoke("serve", *flags, "--port", "0", "--models-dir", tiny_store)
    assert result.exit_code == 0, result.output
    store = seen["state"].serving.pairs
    assert isinstance(store.defaults, RequestDefaults) and not callable(store.defaults)
    assert store.defaults.flags == {"temperature": 0.3, "top_k": 7, "num_speculative_tokens": 4}
    assert store.defaults.proposer == "draft+ngram"
    settings = store.plan("tiny-target", [system_ram(64)]).settings
    assert (settings.sampling.temperature, settings.sampling.top_k, settings.sampling.top_p) == (0.3, 7, 0.9)
    assert settings.speculation.num_speculative_tokens == 4 and settings.speculation.proposer == "draft+ngram"
    assert settings.stop == ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")  # the model's own


def test_a_pinned_pair_drafts_as_its_flags_say(invoke, tiny_store, monkeypatch):
    seen = []
    monkeypatch.setattr(ollama_spec.server, "serve", lambda state, sock: seen.append(state.settings.speculation))
    common = ("--threads", "1", "--no-check", "--port", "0", "--models-dir", tiny_store)
    assert invoke("serve", "tiny-target", "-d", "ngram", "--ngram-size", "2", *common).exit_code == 0
    assert invoke("serve", "tiny-target", "-d", "tiny-draft", "--ngram", *common).exit_code == 0
    assert [(s.proposer, s.ngram_size) for s in seen] == [("ngram", 2), ("draft+ngram", 4)]
