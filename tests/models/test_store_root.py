"""Where the model store is found (--models-dir, OLLAMA_MODELS, the user's own, the Linux service
store) and what is said when it, or a folder in it, is missing or cannot be read."""

import os
import shutil
from pathlib import Path

import pytest

from ollama_spec.errors import StoreNotFound, StoreUnreadable
from ollama_spec.models.store import (
    SERVICE_STORE,
    Store,
    StoreRoot,
    find_store_root,
)


def test_root_precedence(tmp_path, monkeypatch, isolated_user_paths):
    flag, env, home = tmp_path / "flag", tmp_path / "env", isolated_user_paths / ".ollama" / "models"
    for d in (flag, env, home):
        d.mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(env))
    assert find_store_root(flag).source == "--models-dir"
    assert find_store_root(None).path == env and find_store_root(None).source == "OLLAMA_MODELS"
    monkeypatch.delenv("OLLAMA_MODELS")
    assert find_store_root(None).path == home


def test_missing_explicit_root_is_an_error(tmp_path):
    with pytest.raises(StoreNotFound, match=r"the model store .*nowhere \(from OLLAMA_MODELS\) does not exist"):
        find_store_root(None, {"OLLAMA_MODELS": str(tmp_path / "nowhere")})


def test_no_store_anywhere_says_what_to_do(tmp_path, monkeypatch):
    import ollama_spec.models.store as store_module

    monkeypatch.setattr(store_module, "SERVICE_STORE", tmp_path / "no-service-store")
    with pytest.raises(StoreNotFound, match=r"no Ollama model store found .*no-service-store\); pull a model with"):
        find_store_root(None, {})


@pytest.fixture
def service_store(tiny_store, tmp_path, monkeypatch):
    """The Linux service install's store, /usr/share/ollama/.ollama/models, moved into tmp."""
    import ollama_spec.models.store as store_module

    root = tmp_path / "usr-share-ollama" / ".ollama" / "models"
    shutil.copytree(tiny_store, root)
    monkeypatch.setattr(store_module, "SERVICE_STORE", root)
    return root


def test_the_linux_service_store_is_found_last(service_store, isolated_user_paths, invoke):
    assert SERVICE_STORE == Path("/usr/share/ollama/.ollama/models")  # Ollama's install script
    assert find_store_root(None, {}) == StoreRoot(service_store, "the Ollama service store")
    listed = invoke("list")
    assert listed.exit_code == 0, listed.output
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert names == sorted(names) and {"tiny-alien:latest", "tiny-draft:latest", "tiny-target:latest"} <= set(names)
    generated = invoke("generate", "tiny-target", "hi", "--no-check", "--threads", "1", "-n", "2", "--json")
    assert generated.exit_code == 0, generated.output
    home = isolated_user_paths / ".ollama" / "models"
    home.mkdir(parents=True)
    assert find_store_root(None, {}).path == home  # a user's own store comes first


def test_an_unreadable_service_store_says_group_ollama(service_store, monkeypatch):
    import ollama_spec.models.store as store_module

    real_listdir = store_module.os.listdir

    def denied(path):
        if Path(path) == service_store:
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(store_module.os, "listdir", denied)
    with pytest.raises(StoreUnreadable) as err:
        find_store_root(None, {})
    assert str(err.value) == (
        f"the model store {service_store} (from the Ollama service store) exists but is not readable by you; "
        "add yourself to group ollama (sudo usermod -aG ollama $USER, then log in again)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable_root_mentions_group_ollama(tmp_path):
    root = tmp_path / "locked"
    root.mkdir()
    root.chmod(0)
    try:
        with pytest.raises(StoreUnreadable, match="add yourself to group ollama"):
            find_store_root(root)
    finally:
        root.chmod(0o755)


def test_parent_of_the_store_gets_a_hint(tiny_store, tmp_path):
    shutil.copytree(tiny_store, tmp_path / "dot-ollama" / "models")
    with pytest.raises(StoreNotFound, match=r"is the folder above the model store; use .*dot-ollama/models"):
        find_store_root(tmp_path / "dot-ollama")


def test_unreadable_store_says_group_ollama_even_as_root(tmp_path, monkeypatch):
    import ollama_spec.models.store as store_module

    root = tmp_path / "service"
    root.mkdir()

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(store_module.os, "listdir", denied)
    with pytest.raises(StoreUnreadable) as err:
        find_store_root(root)
    assert str(err.value) == (
        f"the model store {root} (from --models-dir) exists but is not readable by you; "
        "add yourself to group ollama (sudo usermod -aG ollama $USER, then log in again)"
    )


# --- audit fixes: folders in the store that cannot be read ----------------------------------------
def _deny(monkeypatch, denied: Path):
    """Python 3.11's Path.exists / is_dir / iterdir as they fail when `denied` may not be listed or searched
    (the tests run as root, for whom chmod 000 changes nothing)."""
    real_stat, real_iterdir = Path.stat, Path.iterdir

    def stat(self, *args, **kwargs):
        if self.parent == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_stat(self, *args, **kwargs)

    def iterdir(self):
        if self == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)

    monkeypatch.setattr(Path, "stat", stat)
    monkeypatch.setattr(Path, "iterdir", iterdir)


def test_an_unreadable_manifests_folder_is_one_error_not_an_empty_store(store_copy, monkeypatch, invoke):
    library = store_copy / "manifests" / "registry.ollama.ai" / "library"
    _deny(monkeypatch, library)
    store = Store(find_store_root(store_copy))
    message = (
        f"{library} is not readable by you; add yourself to group ollama "
        "(sudo usermod -aG ollama $USER, then log in again)"
    )
    with pytest.raises(StoreUnreadable) as err:
        store.resolve("tiny-target")
    assert str(err.value) == message
    with pytest.raises(StoreUnreadable):
        list(store.models())
    listed = invoke("list", "--models-dir", store_copy)
    assert listed.exit_code == 1 and listed.output.strip().splitlines()[-1] == f"Error: {message}"
    assert "no models" not in listed.output


def test_an_unreadable_blobs_folder_is_one_error(store_copy, monkeypatch, invoke):
    _deny(monkeypatch, store_copy / "blobs")
    shown = invoke("show", "tiny-target", "--models-dir", store_copy)
    assert shown.exit_code == 1
    assert shown.output.strip() == (
        f"Error: {store_copy / 'blobs'} is not readable by you; add yourself to group "
        "ollama (sudo usermod -aG ollama $USER, then log in again)"
    )


@pytest.mark.parametrize("value", ['"{}"', "'{}'", " {} ", '"{}" '])
def test_ollama_models_is_trimmed_of_spaces_and_quotes_as_ollama_does(tiny_store, value):
    root = find_store_root(None, {"OLLAMA_MODELS": value.format(tiny_store)})
    assert root.path == tiny_store and root.source == "OLLAMA_MODELS"
