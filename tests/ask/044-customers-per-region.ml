# question: How many different customers ordered in each region? Sorted by region, leaving out orders with no region.
# data: orders.csv
print load_csv("orders.csv")
  |> group_by("region")
  |> agg(customers = nunique(customer))
