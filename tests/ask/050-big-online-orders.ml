# question: List the online orders with more than 35 units: order_id, customer and units, largest units first (ties in order_id order).
# data: orders.csv
print load_csv("orders.csv")
  |> filter(channel == "online" and units > 35)
  |> sort(["units"], desc = true)
  |> select(["order_id", "customer", "units"])
