"""What-if results kept in the store (`<store>/whatif/*.json`, written by `infertrace replay`), for the
dashboard's What if page and the report's recommendations: neither runs the engine, both read these."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from infertrace.replay.compare import SCHEMA

log = logging.getLogger(__name__)
WHATIF_DIR = "whatif"


def save_whatif(root: Path, doc: dict[str, Any]) -> Path:
    """Writes the document atomically under the store; the materialised report is dropped, so the next report
    reads the new replay (its recommendations use it)."""
    from infertrace.results.materialized import REPORT, RESULTS_DIR

    folder = Path(root) / WHATIF_DIR
    folder.mkdir(exist_ok=True)
    window = doc["window"]
    name = f"{doc['model']}-{window['since_ns'] or 'start'}-{window['until_ns'] or 'end'}.json"
    path = folder / name
    temporary = folder / f".{name}.tmp-{os.getpid()}"
    temporary.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    temporary.replace(path)
    shutil.rmtree(Path(root) / RESULTS_DIR / REPORT, ignore_errors=True)
    return path


def load_whatifs(root: Path) -> list[dict[str, Any]]:
    """Every kept what-if document of the store, newest first; an unreadable one is logged and skipped."""
    folder = Path(root) / WHATIF_DIR
    docs = []
    for path in sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            log.warning("what-if result %s unreadable (%s): skipped", path, e)
            continue
        if doc.get("schema") == SCHEMA:
            doc["path"] = str(path)
            docs.append(doc)
    return docs


def replayed_chunk_budget(docs: list[dict[str, Any]], model: str, budget: int) -> dict[str, Any] | None:
    """The newest trustworthy replay of `model` with a chunked-prefill variant of `budget` tokens (the variant
    the ITL analyzer's bound is about), as {doc, variant}; None when there is none."""
    for doc in docs:
        if doc["model"] != model or not doc["trust"]["trustworthy"]:
            continue
        for v in doc["variants"]:
            d = v["deployment"]
            if d["policy"] == "decode_first" and d["max_num_batched_tokens"] == budget and \
                    all(d[k] == doc["captured_config"][k] for k in ("replicas", "tensor_parallel", "prefill_replicas")):
                return {"doc": doc, "variant": v}
    return None
