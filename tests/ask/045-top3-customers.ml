# question: Who are the top 3 customers by total revenue (units × unit_price)? Show customer and revenue, highest first.
# data: orders.csv
print load_csv("orders.csv")
  |> with_column(revenue = units * unit_price)
  |> group_by("customer")
  |> agg(revenue = sum(revenue))
  |> sort(["revenue"], desc = true)
  |> head(3)
