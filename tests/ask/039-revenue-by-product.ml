# question: What is the total revenue (units × unit_price) of each product? Highest revenue first.
# data: orders.csv
print load_csv("orders.csv")
  |> with_column(revenue = units * unit_price)
  |> group_by("product")
  |> agg(revenue = sum(revenue))
  |> sort(["revenue"], desc = true)
