# question: Describe units and unit_price: count, mean, min and max (statistics as rows, units then unit_price as columns).
# data: orders.csv
print load_csv("orders.csv")
  |> select(["units", "unit_price"])
  |> stats(["count", "mean", "min", "max"])
