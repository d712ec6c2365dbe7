#!/usr/bin/env python3
"""Writes orders.csv, the synthetic sales table of the `xpuctl ask` evaluation set
(tests/ask/*.ml), into the directory given as the argument. Deterministic (fixed seed,
stdlib only): 300 orders of 2024 with a few missing cells.

    python3 tests/ask/gen_orders.py DIR

Columns: order_id (int), date (YYYY-MM-DD text), region (North/South/East/West; 4 missing),
customer (text), product (text), channel (online/store), units (int; 6 missing),
unit_price (float; 5 missing).
"""
import csv
import datetime
import os
import random
import sys

ROWS = 300
REGIONS = ["North", "South", "East", "West"]
PRODUCTS = {  # name: (base price, spread)
    "Widget": (4.5, 0.5),
    "Widget Pro": (12.0, 1.5),
    "Gadget": (19.9, 2.0),
    "Gizmo": (7.25, 0.75),
    "Doohickey": (2.1, 0.3),
}
CUSTOMERS = ["Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Ind",
             "Wayne Ent", "Tyrell", "Soylent", "Cyberdyne", "Aperture", "Wonka"]


def main(out_dir: str) -> None:
    rng = random.Random(20240)
    start = datetime.date(2024, 1, 1)
    rows = []
    for i in range(ROWS):
        product = rng.choice(list(PRODUCTS))
        base, spread = PRODUCTS[product]
        rows.append({
            "order_id": 1001 + i,
            "date": (start + datetime.timedelta(days=rng.randrange(366))).isoformat(),
            "region": rng.choice(REGIONS),
            "customer": rng.choice(CUSTOMERS),
            "product": product,
            "channel": rng.choice(["online", "online", "store"]),
            "units": rng.randint(1, 40),
            "unit_price": round(base + rng.uniform(-spread, spread), 2),
        })
    rows.sort(key=lambda r: (r["date"], r["order_id"]))
    for i, r in enumerate(rows):
        r["order_id"] = 1001 + i
    # A few missing cells, at fixed places.
    for col, count in [("region", 4), ("units", 6), ("unit_price", 5)]:
        for i in rng.sample(range(ROWS), count):
            rows[i][col] = ""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "orders.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: gen_orders.py DIR")
    main(sys.argv[1])
