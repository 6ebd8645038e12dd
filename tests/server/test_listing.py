"""/api/tags and /api/ps name a model as Ollama does, through Ollama's own Python client: the digest is the sha256
of the manifest's bytes (so two models on the same weights with other params are two digests, and clients that
group by digest keep them apart), the size is every layer's, and the newest manifest is listed first."""

import hashlib
import json
import os
from datetime import datetime

import ollama

from tests.serving import get, running_store
from tests.stores import LIBRARY, variant


def manifest(root, name: str):
    model, _, tag = name.partition(":")
    return root.joinpath(*LIBRARY, model, tag or "latest")


def test_tags_and_ps_give_the_manifests_digest_and_every_layers_size(store_copy):
    variant(store_copy, "tiny-cool", extra=[("params", json.dumps({"temperature": 0.1}).encode())])
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)
        listed = {m.model: m for m in client.list().models}
        assert {"tiny-cool:latest", "tiny-target:latest"} <= set(listed)
        for name, model in listed.items():
            data = manifest(store_copy, name).read_bytes()
            doc = json.loads(data)
            assert model.digest == hashlib.sha256(data).hexdigest(), name
            assert model.size == sum(layer["size"] for layer in [*doc["layers"], doc["config"]]), name
        # the same GGUF blob, another params layer: another model to every client that groups by digest
        assert listed["tiny-cool:latest"].digest != listed["tiny-target:latest"].digest
        assert len({m.digest for m in listed.values()}) == len(listed)

        client.generate(model="tiny-cool", prompt="Once", options={"num_predict": 2})
        (running,) = client.ps().models
        assert running.model == "tiny-cool:latest" and running.digest == listed["tiny-cool:latest"].digest


def test_tags_lists_the_newest_manifest_first(store_copy):
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)
        names = [m.model for m in client.list().models]
        assert len(names) >= 3
        # written a minute apart in an order that is not the names': Ollama lists the last written first
        newest_first = [*sorted(names)[1:], min(names)]
        base = 1_700_000_000
        for minutes, name in enumerate(reversed(newest_first)):
            os.utime(manifest(store_copy, name), (base + 60 * minutes, base + 60 * minutes))
        listed = client.list().models
        assert [m.model for m in listed] == newest_first
        assert [m["id"] for m in get(url + "/v1/models").json()["data"]] == newest_first  # OpenAI's list too
        for model in listed:  # and when: the manifest's time, not the GGUF blob's
            assert (
                model.modified_at
                == datetime.fromtimestamp(manifest(store_copy, model.model).stat().st_mtime).astimezone()
            )


def test_ps_reads_no_file_so_a_model_whose_files_went_is_still_listed(store_copy):
    variant(store_copy, "tiny-gone")
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)
        client.generate(model="tiny-gone", prompt="Once", options={"num_predict": 2})
        digest = hashlib.sha256(manifest(store_copy, "tiny-gone").read_bytes()).hexdigest()
        manifest(store_copy, "tiny-gone").unlink()  # as a delete racing its own load left it
        for blob in (store_copy / "blobs").iterdir():
            blob.unlink()
        (running,) = client.ps().models
        assert running.model == "tiny-gone:latest" and running.digest == digest
