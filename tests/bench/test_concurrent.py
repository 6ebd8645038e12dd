"""The in-process concurrency bench: clients on the engine's slots, no HTTP, and the ideal schedule's ceiling."""

import pytest

from ollama_spec.bench.concurrent import Cell, ConcurrentReport, Line, best_step, request_steps, run_concurrent
from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.settings import BenchSettings
from ollama_spec.cli.bench_local import client_counts
from ollama_spec.engine.engine import Engine
from ollama_spec.engine.tickets import Pass
from tests.conftest import engine_settings

FAST = ("--no-check", "--threads", "1", "--max-tokens", "6", "--runs", "1", "--no-warmup")


def test_a_pass_line_goes_through_each_sizes_median_so_one_pause_does_not_bend_it():
    points = [(n, 0.010 + 0.001 * n) for n in (1, 2, 4, 8) for _ in range(5)] + [(8, 5.0)]
    line = Line.fit(points)
    assert line.fixed_s == pytest.approx(0.010, abs=1e-6) and line.per_s == pytest.approx(0.001, abs=1e-6)
    assert Line.fit([(3, 0.02), (3, 0.04)]) == Line(0.03, 0.0) and Line.fit([]) is None


def test_the_ideal_step_drafts_deep_where_a_pass_costs_the_same_whatever_its_size():
    flat = Line(0.020, 0.0)  # a GPU: the weights' read is the whole pass
    step = best_step([[0.9, 0.8, 0.7, 0.6]] * 4, flat, Line(0.001, 0.0))
    assert step.deepest == 4 and step.tokens == pytest.approx(4 * (1 + 0.9 + 0.8 + 0.7 + 0.6))


def test_the_ideal_step_gives_a_draft_that_misses_no_tokens_and_one_that_hits_its_own():
    steep = Line(0.010, 0.010)  # a CPU: every token in the batch costs as much as the weights' read
    step = best_step([[0.95, 0.9], [0.0, 0.0]], steep, Line(0.001, 0.0))
    assert step.deepest == 2 and step.tokens == pytest.approx(2 + 0.95 + 0.9)  # the second slot's drafts not taken
    step = best_step([[0.1, 0.01]] * 2, steep, Line(0.001, 0.0))
    assert step.deepest == 0 and step.tokens == 2  # drafts that do not pay: the target alone


def test_a_requests_last_step_drafts_no_further_than_its_answer():
    assert request_steps([1.0, 1.0], 2, 6) == 2  # 3 tokens a step
    assert request_steps([1.0, 1.0], 2, 4) == 2  # 3, then the last token alone
    assert request_steps([0.5], 1, 2) == pytest.approx(1.5)  # 2 tokens, or 1 and then 1
    assert request_steps([0.0], 1, 5) == 5


def test_the_ceiling_prices_each_request_whole_its_last_step_cut_at_the_answers_end():
    """Every draft sure, K=2 pays: 3 tokens a step; a request of 4 tokens still takes two steps."""

    def report(max_tokens):
        out = ConcurrentReport("m", 1, max_tokens, [2], [1])
        out.passes[1] = [Pass(0, 1, n, n, n, 0.010 + 0.001 * n) for n in (1, 2, 3)] + [Pass(1, 1, 1, 1, 1, 0.001)]
        out.cells[(1, 2)] = Cell(drafted={"p": [10, 10]}, accepted={"p": [10, 10]})
        return out

    step_s = 2 * 0.001 + 0.013
    assert report(6).ceiling(1) == (pytest.approx(3 / step_s), 2)
    assert report(4).ceiling(1) == (pytest.approx(2 / step_s), 2)


def test_client_counts_double_up_to_the_most():
    assert client_counts(8) == [1, 2, 4, 8] and client_counts(6) == [1, 2, 4, 6] and client_counts(2) == [1, 2]


def test_two_clients_in_process_give_each_row_a_rate_and_a_ceiling(tiny_models):
    prompts = [Prompt("fox", "The quick brown fox"), Prompt("sky", "The sky is")]
    settings = BenchSettings(max_tokens=8, runs=2, warmup=False, n_ctx=512)
    labels = []
    with Engine(*tiny_models, engine_settings(parallel=2, n_ctx=512)) as engine:
        report = run_concurrent(engine, prompts, settings, [1, 2], [None, 2], labels.append)
        assert engine.loop.passes is None  # recorded only while the bench times a row
    # each round's rows in a turned order: no row always runs first, or just after another row
    assert [label.split(", K=")[1] for label in labels] == ["auto", "2", "auto", "2", "2", "auto", "2", "auto"]
    assert isinstance(report, ConcurrentReport) and not report.mismatches  # greedy: one text a prompt
    for n in (1, 2):
        for k in (None, 2):
            assert len(report.cells[(n, k)].rates) == 2 and min(report.cells[(n, k)].rates) > 0
        assert {p.sequences for p in report.passes[n]} <= set(range(1, n + 1))
        rate, deepest = report.ceiling(n)
        assert rate > 0 and 0 <= deepest <= 2
        steps, outside = report.outside[n]  # the Python of each step, outside llama.cpp's passes
        assert steps > 0 and outside > 0
    assert max(p.sequences for p in report.passes[2]) == 2  # two clients' steps ran as one batch


def test_the_clients_first_requests_run_side_by_side_however_late_their_threads_start(tiny_models, monkeypatch):
    """As a busy machine may: client 1's thread starts only once client 0's has run all its prompts. Their
    first requests still run in the same passes, so the row times the clients at once that it names."""
    import threading

    real_start, first = threading.Thread.start, []

    def start(thread):
        if thread.name == "bench-client-1":
            first[0].join(60)
        real_start(thread)
        if thread.name == "bench-client-0":
            first.append(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    prompts = [Prompt("fox", "The quick brown fox"), Prompt("sky", "The sky is")]
    settings = BenchSettings(max_tokens=8, runs=1, warmup=False, n_ctx=512)
    with Engine(*tiny_models, engine_settings(parallel=2, n_ctx=512)) as engine:
        report = run_concurrent(engine, prompts, settings, [2], [2])
    assert not report.mismatches and len(report.cells[(2, 2)].rates) == 1
    assert max(p.sequences for p in report.passes[2] if p.model == 1) == 2  # both clients' drafts in one pass


def test_bench_in_process_prints_the_table(invoke, tiny_store, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox\n", encoding="utf-8")
    args = ("bench", "tiny-target", "-d", "tiny-draft", "--models-dir", tiny_store, *FAST, "--prompts", prompts)
    result = invoke(*args, "--concurrency", "2", "--in-process", "-k", "2", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "in process (no HTTP), 2 slots" in result.output
    assert [line.split()[:2] for line in result.output.splitlines() if line.strip().startswith(("1 ", "2 "))] == [
        ["1", "K=2"],
        ["1", "ceiling"],
        ["1", "python"],
        ["2", "K=2"],
        ["2", "ceiling"],
        ["2", "python"],
    ]
    assert "python/step" in result.output  # each row's Python time a step, outside llama.cpp's passes
    rows = [line.split() for line in result.output.splitlines() if line.split()[1:2] == ["K=2"]]
    assert len(rows) == 2 and all(row[-1] == "ms" and float(row[-2]) > 0 for row in rows)
    assert (tmp_path / "out" / "results-concurrent.json").exists()
    refused = invoke(*args, "--in-process", "--url", "http://127.0.0.1:9/v1")
    assert refused.exit_code != 0
    assert refused.output.strip().splitlines()[-1] == (
        "Error: --in-process times clients in this process: drop --url (or --in-process)"
    )
    alone = invoke(*args, "--in-process", "-k", "auto,2")  # one client on one slot: the same loop, its ceiling
    assert alone.exit_code == 0, alone.output
    assert [line.split()[:2] for line in alone.output.splitlines() if line.strip().startswith("1 ")] == [
        ["1", "auto"],
        ["1", "K=2"],
        ["1", "ceiling"],
        ["1", "python"],
    ]


def test_clients_in_process_draft_with_the_targets_mtp_layers_one_sequence_a_slot(mtp_store):
    from ollama_spec.models.resolve import resolve_model

    target = resolve_model("mtp-target", str(mtp_store))
    prompts = [Prompt("fox", "The quick brown fox"), Prompt("sky", "The sky is")]
    settings = BenchSettings(max_tokens=24, runs=1, warmup=False, n_ctx=512)  # long enough for the clients to meet
    with Engine(target, None, engine_settings(parallel=2, n_ctx=512, mtp=True)) as engine:
        report = run_concurrent(engine, prompts, settings, [1, 2], [1, 2])
    assert not report.mismatches  # greedy: one text a prompt, whatever K and however many clients
    for n in (1, 2):
        for k in (1, 2):
            assert sum(sum(drafted) for drafted in report.cells[(n, k)].drafted.values()) > 0
    drafts = [p for p in report.passes[2] if p.model == 1]
    assert drafts and max(p.sequences for p in drafts) == 2  # both slots' NextN sequences in one pass


def test_bench_in_process_and_served_time_the_targets_mtp_layers(invoke, mtp_store, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox\n", encoding="utf-8")
    args = ("bench", "mtp-target", "-d", "mtp", "--models-dir", mtp_store, *FAST, "--prompts", prompts, "-k", "2")
    in_process = invoke(*args, "--concurrency", "2", "--in-process")
    assert in_process.exit_code == 0, in_process.output
    assert "mtp-target:latest, in process (no HTTP), 2 slots" in in_process.output
    served = invoke(*args, "--concurrency", "2")
    assert served.exit_code == 0, served.output
    assert "serving mtp-target:latest drafted by mtp (K=2, 2 slots) in this process" in served.output
    assert "2 clients at once: " in served.output
    assert "drafts accepted, as the server's timings say: " in served.output  # serve's timings, streamed
