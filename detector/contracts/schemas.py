"""JSON Schemas of the contracts, generated from the models so they cannot drift silently."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from detector.contracts import events, findings, page_state

SCHEMAS: Final[dict[str, tuple[type[BaseModel], str]]] = {
    "ownership-event.v1.schema.json": (events.OwnershipEvent, events.SCHEMA),
    "finding.v1.schema.json": (findings.Finding, findings.SCHEMA),
    # The page-state schema has always been identified by its file name.
    "page-state.v1.schema.json": (page_state.PageStateRecord, "page-state.v1.schema.json"),
}


def schema_document(model: type[BaseModel], name: str) -> dict[str, Any]:
    # Events are what producers must send; findings are what readers receive.
    if model is events.OwnershipEvent:
        doc = model.model_json_schema(by_alias=True, mode="validation")
    else:
        doc = model.model_json_schema(by_alias=True, mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": name, **doc}


def render(filename: str) -> str:
    model, name = SCHEMAS[filename]
    return json.dumps(schema_document(model, name), indent=2, sort_keys=True) + "\n"


def write_all(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename in SCHEMAS:
        path = directory / filename
        path.write_text(render(filename), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "topics/schemas")):
        print(path)
