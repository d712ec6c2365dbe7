#!/usr/bin/env python3
"""Writes examples/sales.xlsx (one sheet per quarter, same columns) and examples/regions.csv,
the inputs of examples/excel_merge.ml. Synthetic, from a fixed seed.

    .venv/bin/python examples/gen_sales.py
"""
import os
import random

from openpyxl import Workbook

here = os.path.dirname(os.path.abspath(__file__))
rng = random.Random(4)
stores = ["North", "South", "East", "West", "Harbour", "Airport"]
wb = Workbook()
wb.remove(wb.active)
for q in ["Q1", "Q2", "Q3", "Q4"]:
    ws = wb.create_sheet(q)
    ws.append(["store", "product", "units", "price"])
    for _ in range(40):
        ws.append([rng.choice(stores), rng.choice(["tea", "coffee", "cocoa"]),
                   rng.randint(1, 60), round(rng.uniform(2, 9), 2)])
wb.save(os.path.join(here, "sales.xlsx"))
with open(os.path.join(here, "regions.csv"), "w") as f:
    f.write("store,region,manager\n")
    for s, r, m in zip(stores, ["N", "S", "E", "W", "S", "E"],
                       ["Ana", "Ben", "Chi", "Dev", "Eli", "Fay"]):
        f.write(f"{s},{r},{m}\n")
