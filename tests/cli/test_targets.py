"""The draft a command runs (cli/targets.py) where the target carries MTP (NextN) layers: `--draft mtp` on
generate, chat and check, the same layers by default, the notes that say so, and one line with a non-zero exit
for a target without them."""

import json

BASE = ("--threads", "1", "--no-check", "-t", "0")
NO_NEXTN = (
    "tiny-target:latest has no MTP (NextN) layers to draft with (GLM-4.x and DeepSeek V3 GGUFs ship them); "
    "name a draft model, or --draft ngram"
)


def gen(invoke, store, *args):
    return invoke("generate", *args, *BASE, "--models-dir", store)


def test_generate_drafts_with_the_targets_mtp_layers_and_writes_its_text(invoke, mtp_store):
    alone = gen(invoke, mtp_store, "mtp-target", "The quick brown fox", "-n", "16", "--draft", "tiny-draft", "-k", "1")
    drafted = gen(invoke, mtp_store, "mtp-target", "The quick brown fox", "-n", "16", "--draft", "mtp", "-k", "2")
    assert alone.exit_code == 0 and drafted.exit_code == 0, drafted.output
    assert drafted.stdout == alone.stdout and drafted.stdout.strip()
    as_json = gen(invoke, mtp_store, "mtp-target", "Hi", "-n", "8", "-d", "MTP", "-k", "2", "--ngram", "--json")
    data = json.loads(as_json.stdout)
    assert data["draft"] == "mtp" and data["drafted"] > 0


def test_a_target_with_mtp_layers_drafts_with_them_by_default_where_they_pay(invoke, mtp_store):
    """Whether they pay depends on this machine's step costs (tests/engine/test_mtp_default.py prices both
    ways): where they do not, the target runs alone and says why."""
    result = gen(invoke, mtp_store, "mtp-target", "Hi", "-n", "8", "--json")
    assert result.exit_code == 0, result.output
    assert "draft: its own MTP (NextN) layers (1) by default, kept as it loads where they fit and pay" in result.stderr
    let_go = "note: the target's MTP layers would not pay on this machine" in result.stderr
    assert json.loads(result.stdout)["draft"] == (None if let_go else "mtp")


def test_mtp_for_a_target_without_nextn_layers_is_one_line_and_a_failure(invoke, mtp_store):
    for command, args in (("generate", ("Hi",)), ("chat", ()), ("check", ())):
        extra = BASE if command != "check" else ()
        result = invoke(command, "tiny-target", *args, "--draft", "mtp", *extra, "--models-dir", mtp_store, input="")
        assert result.exit_code == 1 and "Traceback" not in result.output, (command, result.output)
        assert result.output.strip().splitlines() == [f"Error: --draft mtp: {NO_NEXTN}"], command


def test_chat_drafts_with_the_mtp_layers(invoke, mtp_store):
    result = invoke("chat", "mtp-target", "-d", "mtp", *BASE, "-n", "6", "--models-dir", mtp_store, input="Hi\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip()


def test_check_and_drafts_say_the_target_carries_nextn_layers(invoke, mtp_store):
    plan = invoke("check", "mtp-target", "--json", "--models-dir", mtp_store)
    data = json.loads(plan.stdout)
    assert data["mtp"] == {"nextn_layers": 1, "planned": True}
    with_draft = json.loads(
        invoke("check", "mtp-target", "-d", "tiny-draft", "--json", "--models-dir", mtp_store).stdout
    )
    assert (with_draft["mtp"]["planned"], with_draft["target"]["kv_cache"] < data["target"]["kv_cache"]) == (
        False,
        True,
    )
    said = invoke("check", "mtp-target", "--models-dir", mtp_store)
    assert "the target carries 1 MTP (NextN) layer that draft for it (--draft mtp); the plan counts them" in said.stderr
    listed = invoke("drafts", "mtp-target", "--models-dir", mtp_store)
    assert "auto: the target carries 1 MTP (NextN) layer that draft for it (--draft mtp)" in listed.stderr
    assert "auto " not in listed.stdout  # the store's drafts come after the MTP layers
    listed = json.loads(invoke("drafts", "mtp-target", "--json", "--models-dir", mtp_store).stdout)
    assert (listed["nextn_layers"], listed["mtp"], [d["auto"] for d in listed["drafts"]].count(True)) == (1, True, 0)


def test_a_modelfile_s_draft_mtp_line_names_the_mtp_layers(invoke, mtp_store, tmp_path):
    preset = tmp_path / "Modelfile"
    preset.write_text("FROM mtp-target\nDRAFT mtp\nPARAMETER num_speculative_tokens 2\n", encoding="utf-8")
    result = invoke("generate", "-f", preset, "Hi", "-n", "8", "--json", *BASE, "--models-dir", mtp_store)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["draft"], data["drafted"] > 0) == ("mtp", True)
