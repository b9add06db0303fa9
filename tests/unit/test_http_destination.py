"""The example destination's request parsing that needs no database."""

import pytest

from detector.leases.http_destination import content_length


@pytest.mark.parametrize(("text", "length"), [("0", 0), ("12", 12), ("0012", 12)])
def test_a_content_length_of_ascii_digits_is_read(text: str, length: int) -> None:
    assert content_length(text) == length


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "-1",
        "+1",
        " 1",
        "1_0",
        "\N{ARABIC-INDIC DIGIT THREE}",  # int() reads it as 3
        "\N{FULLWIDTH DIGIT TWO}",
        "\N{SUPERSCRIPT TWO}",  # in Latin-1, so a header can carry it; int() raises
    ],
)
def test_a_content_length_that_is_not_ascii_digits_is_no_length(text: str | None) -> None:
    assert content_length(text) is None
