# question: Over the orders with both units and unit_price known, what are the total units and the sum of unit prices? Give them as a vector [units, unit_price].
# data: orders.csv
let complete = load_csv("orders.csv") |> filter(not_null(units) and not_null(unit_price))
print sum(tensor(complete, ["units", "unit_price"]), axis = 0)
