"""The hooks of tests/conftest.py, in a pytest of their own: under SPLITBRAIN_REQUIRE_TOOLS=1 (CI)
a skip, of a test or of a module's collection, is a failure that says why; an xfail is not; and
every run prints how many tests it skipped, 0 included."""

from __future__ import annotations

import pytest

HOOKS = "from tests.conftest import pytest_make_collect_report, pytest_runtest_makereport"
SUMMARY = "from tests.conftest import pytest_terminal_summary"
SAID = "skipped under SPLITBRAIN_REQUIRE_TOOLS=1, which allows none: "


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(f"{HOOKS}\n{SUMMARY}\n")
    pytester.makepyfile(
        test_tools="""
            import pytest

            def test_a_tool_is_missing():
                pytest.skip("promtool is not on PATH")

            @pytest.mark.xfail(strict=True, reason="a known bug")
            def test_a_known_bug():
                assert False
        """,
        test_extra="""
            import pytest

            pytest.importorskip("no_such_extra_installed")

            def test_the_adapter():
                pass
        """,
    )
    return pytester


def test_under_require_tools_every_skip_fails_saying_why(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPLITBRAIN_REQUIRE_TOOLS", "1")
    result = suite.runpytest_inprocess("--continue-on-collection-errors")
    result.assert_outcomes(failed=1, errors=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR collecting test_extra.py*",
            f"{SAID}*could not import 'no_such_extra_installed'*",
            "*test_a_tool_is_missing*",
            f"{SAID}*promtool is not on PATH",
            "skipped: 0",
        ]
    )


def test_without_it_they_skip_and_the_run_counts_them(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPLITBRAIN_REQUIRE_TOOLS", raising=False)
    result = suite.runpytest_inprocess()
    result.assert_outcomes(skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(["skipped: 2"])
