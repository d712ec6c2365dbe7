# question: How many orders are missing the units, and how many are missing the unit price? Show the two counts in that order.
# data: orders.csv
let orders = load_csv("orders.csv")
print orders |> filter(is_null(units)) |> agg(missing_units = count())
print orders |> filter(is_null(unit_price)) |> agg(missing_price = count())
