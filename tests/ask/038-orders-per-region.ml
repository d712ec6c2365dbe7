# question: How many orders came from each region? Leave out orders without a region; sort by region.
# data: orders.csv
print load_csv("orders.csv")
  |> group_by("region")
  |> agg(orders = count())
