"""Clicks per page in 10-second event-time windows.

Each click carries the time it happened; clicks arrive up to 2 s out of order. The
source's watermark trails the largest timestamp seen by 2 s, so a window
``[k*10, (k+1)*10)`` fires once the watermark passes its end, with the exact count.
A click more than 2 s behind is *late*: it goes to the dead-letter output. Clicks
arrive at 4,000 a second, so the 20,000 clicks (100 s of event time) take about 5 s.

    bastion run examples/clicks_tumbling.py
    bastion drill examples/clicks_tumbling.py --protocol cic --random-kills 2 --between 1,3.5
"""

import random
from typing import Any

import bastion as bn

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
CLICKS = 20_000
RATE = 4_000  # clicks per second


def click(i: int) -> dict[str, Any]:
    # Deterministic in i (replay after a failure must produce the same click): one
    # click every 5 ms of event time, jittered by up to 2.2 s (a few end up late).
    rng = random.Random(i)
    return {"page": rng.choice(PAGES), "user": f"u{rng.randrange(500)}",
            "ts": i * 0.005 + rng.uniform(-2.2, 0.0)}


topology = bn.Topology("clicks")
clicks = topology.source("clicks",
                         bn.sources.Generator(click, count=CLICKS, rate=RATE),
                         timestamp=lambda c: c["ts"], max_out_of_orderness=2.0)
per_page = clicks.key_by(lambda c: c["page"]).window(bn.windows.Tumbling(10)).aggregate(
    "clicks-per-page", bn.aggregations.Count(), parallelism=2)
per_page.sink("counts", bn.sinks.Collect())

if __name__ == "__main__":
    result = bn.run(topology)
    for page, start, end, count in sorted(result.outputs["counts"], key=lambda r: (r[1], r[0])):
        print(f"[{start:5.0f}, {end:5.0f})  {page:<10} {count}")
    print(f"late clicks: {sum(d.reason == 'late' for d in result.dead_letters)}")
