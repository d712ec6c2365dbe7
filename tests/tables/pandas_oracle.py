"""The pandas side of the table parity tests (cli/tests/tables.rs).

    pandas_oracle.py DIR

DIR holds the generated CSVs and cases.json: {name: pandas expression}. Each expression is
evaluated with the CSVs loaded by plain `pd.read_csv` (as `people`, `orders`, `extra`) and
`pd` in scope; its result is written to DIR/expected_<name>.csv without the index.
"""

import json
import os
import sys

import pandas as pd


def main(d):
    frames = {
        name[:-4]: pd.read_csv(os.path.join(d, name))
        for name in os.listdir(d)
        if name.endswith(".csv") and not name.startswith(("expected_", "got_"))
    }
    with open(os.path.join(d, "cases.json")) as f:
        cases = json.load(f)
    for name, expr in cases.items():
        result = eval(expr, {"pd": pd, **frames})
        if isinstance(result, pd.Series):
            result = result.reset_index()
        result.to_csv(os.path.join(d, f"expected_{name}.csv"), index=False)


if __name__ == "__main__":
    main(sys.argv[1])
