"""Retrieval quality of the hotword app on held-out searches: MRR@5 of the clicked hotword.

The model is trained as the seed app ships it (``train_hotword`` with its own defaults: the
generated log of seed 7), into a temporary repository, and served through the pipeline harness
(the code path of ``POST /v1/predict``). Held-out searches come from the same generator with a
seed the training did not use; each is asked with ``top_k`` 5 and scored 1/rank of the clicked
hotword (0 when it is not in the five). The script runs unchanged against an older tree
(``PYTHONPATH=<worktree>/src``), so a commit can be measured before and after.

``--write-log`` saves the held-out searches (clicked hotword by word, not index) and ``--log``
evaluates on such a file instead: a log made with one tree's corpus can be asked of another
tree's model; searches whose clicked word that model's corpus lacks are counted apart.

    .venv/bin/python benchmarks/bench_hotword_quality.py --searches 2000 --seed 2026
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

from ortserve.apps.hotword.corpus import CORPUS, load_corpus
from ortserve.apps.hotword.training import train_hotword
from ortserve.apps.hotword.world import generate_log
from ortserve.apps.seeds import SEED_APPS
from ortserve.testing import pipeline_harness

TOP_K = 5


def _held_out(entries: list[Any], searches: int, seed: int) -> list[dict[str, Any]]:
    return [
        {
            "query": r.query,
            "region_id": r.region_id,
            "timestamp": r.timestamp_ms,
            "clicked": entries[r.clicked].word,
        }
        for r in generate_log(entries, searches, seed)
    ]


def _region_kind(region_id: int) -> str:
    """The searcher's place as the log gives it: nowhere, a province, or a city in one."""
    return "national" if region_id == 0 else "province" if region_id % 10_000 == 0 else "city"


def _summary(ranks: list[int | None], known: list[bool]) -> dict[str, Any]:
    """MRR@5 over all searches and over those whose clicked word the model's corpus has."""

    def mrr(rows: list[int | None]) -> float:
        return sum(1.0 / r for r in rows if r is not None) / max(len(rows), 1)

    common = [r for r, k in zip(ranks, known, strict=True) if k]
    return {
        "searches": len(ranks),
        "mrr_at_5": round(mrr(ranks), 4),
        "hit_at_1": round(sum(r == 1 for r in ranks) / max(len(ranks), 1), 4),
        "hit_at_5": round(sum(r is not None for r in ranks) / max(len(ranks), 1), 4),
        "clicked_in_corpus": len(common),
        "mrr_at_5_clicked_in_corpus": round(mrr(common), 4),
    }


async def _evaluate(root: Path, log: list[dict[str, Any]]) -> tuple[list[int | None], list[int], float]:
    """Each search's rank of the clicked hotword (None: not listed), how many were listed, seconds."""
    ranks: list[int | None] = []
    listed_counts: list[int] = []
    started = time.perf_counter()
    async with pipeline_harness(root) as harness:
        for search in log:
            body = {k: search[k] for k in ("query", "region_id", "timestamp")} | {"top_k": TOP_K}
            answer: Any = await harness.call("hotword", body)
            listed = [h["word"] for h in answer.get("hotwords", [])]
            listed_counts.append(len(listed))
            ranks.append(listed.index(search["clicked"]) + 1 if search["clicked"] in listed else None)
    return ranks, listed_counts, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=2026, help="held-out log seed (training uses 7)")
    parser.add_argument("--log", type=Path, help="evaluate on this JSONL log instead of generating one")
    parser.add_argument("--write-log", type=Path, help="save the held-out searches as JSONL")
    parser.add_argument("--out", type=Path, help="write the result as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        started = time.perf_counter()
        train_hotword(root / "hotword" / "1")
        (root / "hotword" / "config.yaml").write_text(SEED_APPS["hotword"][1], encoding="utf-8")
        trained_s = time.perf_counter() - started
        entries = load_corpus(root / "hotword" / "1" / CORPUS)
        if args.log:
            lines = args.log.read_text(encoding="utf-8").splitlines()
            log = [json.loads(line) for line in lines if line.strip()]
        else:
            log = _held_out(entries, args.searches, args.seed)
        if args.write_log:
            args.write_log.write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in log), "utf-8")
        words = {e.word for e in entries}
        ranks, listed, asked_s = asyncio.run(_evaluate(root, log))
    known = [s["clicked"] in words for s in log]
    kinds = [_region_kind(int(s["region_id"])) for s in log]
    result = {
        "corpus_entries": len(entries),
        "log": str(args.log) if args.log else f"generate_log(seed={args.seed}, size={args.searches})",
        **_summary(ranks, known),
        "short_answers": sum(n < TOP_K for n in listed),
        "by_region": {
            kind: _summary(
                [r for r, k in zip(ranks, kinds, strict=True) if k == kind],
                [c for c, k in zip(known, kinds, strict=True) if k == kind],
            )
            for kind in ("national", "province", "city")
        },
        "train_s": round(trained_s, 1),
        "ask_s": round(asked_s, 1),
        "python": platform.python_version(),
    }
    print(json.dumps(result, ensure_ascii=False, indent=2))
    if args.out:
        # Each search's rank (0: not in the five), for paired comparisons on the same log.
        result["ranks"] = [r or 0 for r in ranks]
        result["listed"] = listed
        args.out.write_text(json.dumps(result, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
