"""PTX parser throughput over the test corpus (pure Python, no GPU).

Reads every ``packages/pyptx-core/tests/corpus/*.ptx`` once, then times
``parse`` alone and ``parse`` + ``emit`` over the whole corpus, several times,
and prints MB/s (best and median) plus the largest single files.

    python benchmarks/parse.py [--repeats 7] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from pyptx.parser import emit, parse

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "packages" / "pyptx-core" / "tests" / "corpus"


def _time(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    a = ap.parse_args()
    texts = []
    for p in sorted(a.corpus.glob("*.ptx")):
        with open(p, encoding="utf-8", newline="") as f:
            texts.append((p.name, f.read()))
    total = sum(len(t.encode()) for _, t in texts)
    lines = sum(t.count("\n") for _, t in texts)

    def parse_all():
        for name, t in texts:
            parse(t, name)

    def roundtrip_all():
        for name, t in texts:
            if emit(parse(t, name)) != t:
                raise SystemExit(f"{name}: round trip differs")

    mb = total / 1e6
    print(f"corpus: {len(texts)} files, {mb:.2f} MB, {lines} lines ({a.corpus})")
    print(f"{'':<14}{'best MB/s':>10}{'median MB/s':>13}{'best s':>9}{'lines/s':>12}")
    for label, fn in (("parse", parse_all), ("parse+emit", roundtrip_all)):
        s = _time(fn, a.repeats)
        print(f"{label:<14}{mb / min(s):>10.1f}{mb / statistics.median(s):>13.1f}"
              f"{min(s):>9.3f}{lines / min(s):>12,.0f}")
    big = sorted(texts, key=lambda nt: -len(nt[1]))[:3]
    print("largest files (parse):")
    for name, t in big:
        s = min(_time(lambda t=t, name=name: parse(t, name), a.repeats))
        print(f"  {name:<48}{len(t) / 1e3:>8.0f} KB{len(t) / 1e6 / s:>8.1f} MB/s")


if __name__ == "__main__":
    main()
