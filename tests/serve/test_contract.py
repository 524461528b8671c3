"""The Serve API against its own OpenAPI contract: schemathesis (every check, every phase)
generates requests from /openapi.json and checks each answer against the schema."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON

# 400 is the documented answer to a schema-valid request whose content the server rejects (a
# topology text that does not parse, node ids outside the topology): the schema cannot express
# a topology's grammar, so a 400 counts as the API accepting the data's shape.
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "403", "404", "409", "429"]
"""


@pytest.mark.slow  # ~1 min: a deployment of its own and a few thousand generated requests
def test_schemathesis_finds_nothing(ray_local, tmp_path):
    from ray import serve

    from m4ray.serve.app import AppArgs, build

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build(AppArgs(max_sessions=4096)), name="m4-contract", route_prefix="/contract")
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    cli = str(Path(PYTHON).parent / "schemathesis")
    try:
        proc = subprocess.run(
            [
                cli, "--config-file", str(config), "run",
                f"http://127.0.0.1:{port}/contract/openapi.json",
                "--checks", "all", "--max-examples", "100", "--seed", "1", "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            cwd=tmp_path,  # schemathesis keeps a cache in its working directory
        )  # fmt: skip
    finally:
        serve.delete("m4-contract")
    assert proc.returncode == 0, proc.stdout[-6000:]
    generated = re.search(r"(\d+) generated, \1 passed", proc.stdout)  # every case passed
    assert generated and int(generated.group(1)) > 300, proc.stdout[-3000:]
