# question: How many orders are there for each product whose name contains "Widget"? Sorted by product.
# data: orders.csv
print load_csv("orders.csv")
  |> filter(contains(product, "Widget"))
  |> group_by("product")
  |> agg(orders = count())
