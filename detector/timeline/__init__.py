"""The incident as a picture: each finding's workflow drawn as a timeline, in a self-contained
HTML report (`audit --html`)."""

from detector.timeline.page import render
from detector.timeline.svg import Timeline, draw
from detector.timeline.window import EventWindows, Seen

__all__ = ["EventWindows", "Seen", "Timeline", "draw", "render"]
