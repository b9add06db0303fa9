"""The pages' templates (Jinja2): `audit --html` and the view share one shell and one stylesheet.

Every value a template shows goes through `printable`, then HTML escaping, so a workflow key
holding markup or terminal escapes is text wherever it lands; only `Markup` (a drawn figure,
the stylesheet) is taken as it is. Filters that return `Markup` (`join`, `safe`) would skip
`printable`: templates loop instead. The policy `CSP` allows no script and no style but the one
stylesheet, by its hash, so markup that escaped its escaping still could not run or load anything.
"""

from __future__ import annotations

import base64
import hashlib
from importlib.resources import files
from typing import Final

from jinja2 import Environment, PackageLoader, PrefixLoader, StrictUndefined
from markupsafe import Markup

from detector.report import context_sides, count, printable, witness
from detector.version import package_version

_PACKAGE: Final = "detector.timeline"
STYLE: Final = Markup((files(_PACKAGE) / "templates" / "page.css").read_text(encoding="utf-8"))
_STYLE_HASH: Final = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
# No script anywhere; the one stylesheet by its hash; forms only back to the view.
CSP: Final = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


def _shown(value: object) -> str:
    return value if isinstance(value, Markup) else printable(str(value))


def environment(*packages: str) -> Environment:
    """Templates by `PACKAGE/NAME` (`timeline/shell.html`), from this package's and `packages`'
    `templates/` folders (package data: the wheel carries them), each compiled when first
    rendered: a command that draws no page does not pay for it."""
    loader = PrefixLoader(
        {name.rsplit(".", 1)[-1]: PackageLoader(name) for name in (_PACKAGE, *packages)}
    )
    env = Environment(
        loader=loader,
        autoescape=True,
        undefined=StrictUndefined,
        finalize=_shown,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        auto_reload=False,  # package data: compiled on first use, never looked at again
    )
    env.globals.update(
        csp=Markup(CSP),  # ours, with no '"' in it: shown as the header sends it
        style=STYLE,
        version=package_version(),
        count=count,
        witness=witness,
        context_sides=context_sides,
    )
    return env


TEMPLATES: Final = environment()
