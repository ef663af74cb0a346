"""Fixtures of the data-layer tests: a local HTTP mirror and folder snapshots.

Test modules import the fixtures they use by name. (Not a ``conftest.py``: tests/ has
no ``__init__.py``, so a second module named ``conftest`` would replace the top-level
one in ``sys.modules`` and break ``from conftest import ...`` in tests/.)

The mirror is ``http.server`` on 127.0.0.1 at a free port, in a thread, serving a
temporary folder; each test writes the files it serves into its own sub-folder
(``<mirror>/<dataset>/<file>``, the layout of fedshift's mirror option). Nothing
touches the network beyond localhost.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from fedshift_fakes import snapshot

from fedshift.data import download as dl
from fedshift.data.registry import FetchContext


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest output clean
        pass


@pytest.fixture(scope="session")
def http_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@dataclass
class Mirror:
    folder: Path  # what the server serves for this test
    url: str  # the mirror option's value

    def put(self, dataset: str, filename: str, data: bytes) -> str:
        """Serve ``data`` as ``<mirror>/<dataset>/<filename>``; return its md5."""
        path = self.folder / dataset / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return hashlib.md5(data).hexdigest()


@pytest.fixture
def mirror(http_root, request) -> Mirror:
    root, base = http_root
    name = request.node.name.replace("[", "_").replace("]", "_").replace("/", "_")
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    return Mirror(folder, f"{base}/{name}")


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    """Two attempts, no sleeping: the retry path runs without slowing the suite."""
    monkeypatch.setattr(dl, "RETRIES", 2)
    monkeypatch.setattr(dl, "BACKOFF_S", 0.0)
    monkeypatch.setattr(dl, "TIMEOUT_S", 10.0)


@pytest.fixture
def ctx_for(tmp_path):
    """FetchContext with data/ and the download cache under the test's tmp folder."""

    def make(mirror: str | None = None) -> FetchContext:
        (tmp_path / "data").mkdir(exist_ok=True)
        return FetchContext(data_dir=tmp_path / "data", cache_dir=tmp_path / "build" / "downloads", mirror=mirror)

    return make


@pytest.fixture
def previous_output(tmp_path):
    """An output folder holding an earlier build; returns (out_dir, check) where check()
    asserts the folder and its parent are exactly as before (no temp folders left)."""
    out = tmp_path / "build" / "datasets" / "ds"
    out.mkdir(parents=True)
    (out / "manifest.json").write_text('{"earlier": true}\n')
    (out / "train_images.npy").write_bytes(b"old bytes")
    before, siblings = snapshot(out), sorted(p.name for p in out.parent.iterdir())

    def check():
        assert snapshot(out) == before
        assert sorted(p.name for p in out.parent.iterdir()) == siblings

    return out, check


@pytest.fixture
def no_partial_files(tmp_path):
    """After the test: no ``.part-`` download or ``.tmp-`` folder left anywhere under tmp."""
    yield
    left = [p for p in tmp_path.rglob("*") if ".part-" in p.name or ".tmp-" in p.name]
    assert not left, left
