# question: What was the total revenue (units × unit_price) per region for orders from July 2024 on? Sorted by region, leaving out orders with no region.
# data: orders.csv
print load_csv("orders.csv")
  |> filter(date >= "2024-07-01")
  |> with_column(revenue = units * unit_price)
  |> group_by("region")
  |> agg(revenue = sum(revenue))
