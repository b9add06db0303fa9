"""The incident as a picture: each finding's workflow drawn as a timeline, in a self-contained
HTML report (`audit --html`)."""

from detector.timeline.page import render
from detector.timeline.seen import Seen, Windows
from detector.timeline.svg import Timeline, draw

__all__ = ["Seen", "Timeline", "Windows", "draw", "render"]
