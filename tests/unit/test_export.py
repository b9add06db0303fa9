"""`splitbrain export KIND DIR`: the bundled files, as the repository has them, accepted by the
tools that load them; the PrometheusRule carries the labels a ruleSelector needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from detector.cli.main import main
from tests.exported import KINDS, PROMETHEUS_RULE, check_export
from tests.paths import ROOT


# The alerts are checked by promtool and amtool: a program run, so not unit (tests/conftest.py).
@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.integration) if k == "alerts" else k for k in KINDS]
)
def test_export_writes_the_repository_files_the_tools_accept(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out" / kind
    assert main(["export", kind, str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == sorted(str(p) for p in out.rglob("*") if p.is_file())
    check_export(kind, out)


def test_a_second_export_overwrites_its_files_and_keeps_the_others(tmp_path: Path) -> None:
    (tmp_path / "topics.yaml").write_text("edited\n")
    (tmp_path / "mine.yaml").write_text("kept\n")
    assert main(["export", "topics", str(tmp_path)]) == 0
    assert (tmp_path / "mine.yaml").read_text() == "kept\n"
    assert (tmp_path / "topics.yaml").read_bytes() == (ROOT / "topics" / "topics.yaml").read_bytes()


def test_the_prometheus_rule_carries_the_labels_asked_for(tmp_path: Path) -> None:
    args = ["export", "alerts", str(tmp_path), "--label", "release=kube-prometheus-stack"]
    assert main([*args, "--label", "example.com/team=payments"]) == 0
    labels = yaml.safe_load((tmp_path / PROMETHEUS_RULE).read_text())["metadata"]["labels"]
    assert labels == {
        "app.kubernetes.io/name": "splitbrain",
        "release": "kube-prometheus-stack",
        "example.com/team": "payments",
    }


@pytest.mark.parametrize("label", ["release", "bad key=x", "a=" + "v" * 64, "Team/x=y"])
def test_a_bad_label_exits_2_naming_the_flag(
    label: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["export", "alerts", str(tmp_path), "--label", label])
    assert exited.value.code == 2
    assert "argument --label: expected KEY=VALUE" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_label_for_another_kind_exits_2_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", "dashboards", str(tmp_path), "--label", "a=b"]) == 2
    assert "--label" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_a_directory_that_cannot_be_written_exits_2_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["export", "dashboards", str(blocker / "dir")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"splitbrain export: cannot write {blocker / 'dir'}"), err
    assert len(err.splitlines()) == 1
