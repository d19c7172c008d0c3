"""Every YAML block of the README and docs/ that is a config (it has `kafka` and `table` or
`tables`) passes `streamberg check` as written, and the README's REST config, given the flags
its own `deploy k8s` line shows, gets manifests: the paths a newcomer follows literally work."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from streamberg.cli.check import check
from tests.helpers import streamberg

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def config_blocks() -> list[tuple[str, str]]:
    out = []
    for path in DOCS:
        for match in re.finditer(r"```ya?ml\n(.*?)```", path.read_text(), re.S):
            document = yaml.safe_load(match.group(1))  # a block that does not parse fails here
            if isinstance(document, dict) and "kafka" in document and {"table", "tables"} & set(document):
                out.append((f"{path.relative_to(ROOT)}:{path.read_text()[:match.start()].count(chr(10)) + 1}",
                            match.group(1)))
    return out


def test_every_config_in_the_docs_passes_check(tmp_path: Path) -> None:
    blocks = config_blocks()
    assert len(blocks) >= 4, blocks  # the README's two, docs/cdc.md's, docs/fleet.md's at least
    failed = {}
    for n, (where, text) in enumerate(blocks):
        path = tmp_path / f"block{n}.yaml"
        path.write_text(text)
        report = check(path, connect=False)
        if not report.valid:
            failed[where] = report.problems
    assert failed == {}


def test_the_readmes_rest_config_deploys_with_the_readmes_flags(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    (where, text), = [b for b in config_blocks() if b[0].startswith("README") and "type: rest" in b[1]]
    path = tmp_path / "prod.yaml"
    path.write_text(text)
    line = re.search(r"streamberg deploy k8s (.*?)\| kubectl", readme.replace("\\\n", " "), re.S).group(1)
    flags = [f for f in shlex.split(line) if f != "--config" and f != "prod.yaml"]
    proc = streamberg("deploy", "k8s", "--config", str(path), *flags, check=False)
    assert proc.returncode == 0, proc.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(proc.stdout) if d)
    assert "FlinkDeployment" in kinds and "SparkApplication" in kinds, kinds
