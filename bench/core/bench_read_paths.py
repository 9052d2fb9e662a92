"""Row-image reads by physical offset vs the fragment API they replaced, side by side.

    python -m bench.core.bench_read_paths --rows 1000000 --rows-per-file 20000

The object-store benchmark's table (id, name, 16-d vector; 50 fragments of 20,000 rows) on
local disk, then its heaviest commit: delete 1,000 rows spread over all 50 fragments.
Extraction of that commit (`ChangeFeed` planning + reading, what `read_changes(uri, v, v)`
does) is timed, alternating, with
  * physical  the default: one `LanceFileReader` take per data file by physical offset
              (process-wide readers dropped before each call: a fresh process);
  * fragment  every fragment forced through pylance's `LanceFragment` (the read path
              the physical one replaced: live-row indices, range scans for up to 31 windows).
Wall and CPU time (all threads of the process), medians.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import lance

import lance_cdf.core.rows as rows_mod
from bench.format.bench_objectstore import build, extract
from bench.support import stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rows-per-file", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    uri = os.path.join(tempfile.mkdtemp(prefix="lance-cdf-bench-read-"), "t.lance")
    build(uri, args.rows, args.rows_per_file, None)
    lance.dataset(uri).delete(f"id % {args.rows // 1000} = 11")
    v = lance.dataset(uri).version
    file_columns = rows_mod._file_columns

    def physical() -> int:
        rows_mod._file_columns = file_columns
        rows_mod._FILES.clear()
        return extract(uri, v, None)[0]

    def fragment() -> int:
        rows_mod._file_columns = lambda *a: None
        return extract(uri, v, None)[0]

    assert physical() == fragment()
    wall: dict[str, list[float]] = {"physical": [], "fragment": []}
    cpu: dict[str, list[float]] = {"physical": [], "fragment": []}
    for _ in range(args.repeat):
        for name, fn in (("physical", physical), ("fragment", fragment)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    med = {k: (stats.median(wall[k]), stats.median(cpu[k])) for k in wall}
    for k, (w, c) in med.items():
        print(f"{k:9s} wall {w:.3f} s  cpu {c:.3f} s")
    print(
        f"fragment / physical: wall {med['fragment'][0] / med['physical'][0]:.2f}x, "
        f"cpu {med['fragment'][1] / med['physical'][1]:.2f}x"
    )


if __name__ == "__main__":
    main()
