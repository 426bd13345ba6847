"""The timeout lint (ADR-150 D6: one un-timeouted call is the entire hang class)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LINT = REPO_ROOT / "tools" / "lint_timeouts.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lint_timeouts", LINT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lint_timeouts"] = module
    spec.loader.exec_module(module)
    return module


lint = _load()


def offences(source: str) -> list[str]:
    return [o.message for o in lint.check_source(textwrap.dedent(source))]


@pytest.mark.parametrize(
    "snippet",
    [
        "import httpx\nhttpx.get('http://x')\n",
        "import httpx\nhttpx.stream('GET', 'http://x')\n",
        "import httpx as h\nh.post('http://x', json={})\n",
        "from httpx import request\nrequest('GET', 'http://x')\n",
        "import httpx\nc = httpx.Client()\n",
        "from httpx import AsyncClient as AC\nc = AC(follow_redirects=True)\n",
        "import httpx\nhttpx.get('http://x', timeout=None)\n",
        "import httpx\nhttpx.get('http://x', **opts)\n",
        # a client built with a timeout still needs one on each call: the bound must be visible there
        "import httpx\nc = httpx.Client(timeout=1)\nc.get('http://x')\n",
        "import httpx\nasync def f():\n    async with httpx.AsyncClient(timeout=1) as c:\n        await c.post('u')\n",
        "import httpx\ndef f(client: httpx.AsyncClient):\n    return client.stream('GET', 'u')\n",
        "import httpx\ndef f(client: 'httpx.Client | None'):\n    return client.delete('u')\n",
        "import httpx\nclass A:\n    _c: httpx.AsyncClient\n    def f(self):\n        return self._c.head('u')\n",
        "import httpx\nclass A:\n    def __init__(self):\n        self.c = httpx.Client(timeout=2)\n"
        "    def f(self):\n        return self.c.request('GET', 'u')\n",
        "import httpx\nc = httpx.Client(timeout=1)\nr = c.build_request('GET', 'u')\nc.send(r)\n",
        "import httpx\nc = httpx.Client(timeout=1)\nc.send(httpx.Request('GET', 'u'))\n",
    ],
)
def test_snippet_without_timeout_fails(snippet: str) -> None:
    assert offences(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "import httpx\nhttpx.get('http://x', timeout=5)\n",
        "import httpx\nT = httpx.Timeout(1)\nc = httpx.Client(timeout=T)\nc.get('u', timeout=T)\n",
        "import httpx\nasync def f():\n    async with httpx.AsyncClient(timeout=1) as c:\n"
        "        await c.post('u', timeout=1)\n",
        "import httpx\nc = httpx.Client(timeout=1)\nr = c.build_request('GET', 'u', timeout=2)\nc.send(r)\n",
        # not httpx: a dict's .get, requests, an unrelated client
        "d = {}\nd.get('k')\n",
        "import requests\nrequests.get('u')\n",
        "import httpx\nclass Other:\n    def get(self, k): ...\nOther().get('k')\n",
    ],
)
def test_snippet_with_timeout_passes(snippet: str) -> None:
    assert offences(snippet) == [], snippet


def test_reports_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "pkg" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import httpx\n\n\nhttpx.get('u')\n")
    (tmp_path / "pkg" / "good.py").write_text("import httpx\nhttpx.get('u', timeout=1)\n")
    proc = subprocess.run(
        [sys.executable, str(LINT), str(tmp_path / "pkg")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    assert proc.stdout.strip() == f"{bad}:4:1: httpx.get(...) without an explicit timeout="


def test_missing_or_empty_directory_passes(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = subprocess.run(
        [sys.executable, str(LINT), str(tmp_path / "empty"), str(tmp_path / "not-yet")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "does not exist" in proc.stderr


def test_unparsable_file_is_an_offence() -> None:
    assert offences("def (:\n")


def test_the_runner_itself_passes() -> None:
    proc = subprocess.run(
        [sys.executable, str(LINT), str(REPO_ROOT / "pipeline_runner")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout
