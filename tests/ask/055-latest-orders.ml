# question: Show the 5 most recent orders (by date, newest first; ties in order_id order) with order_id, date and product.
# data: orders.csv
print load_csv("orders.csv")
  |> sort(["date"], desc = true)
  |> head(5)
  |> select(["order_id", "date", "product"])
