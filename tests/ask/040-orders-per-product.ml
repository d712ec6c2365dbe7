# question: How often was each product ordered? Show product and number of orders, most ordered product first.
# data: orders.csv
print load_csv("orders.csv") |> value_counts("product")
