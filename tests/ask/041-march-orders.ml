# question: How many orders were placed in March 2024?
# data: orders.csv
print load_csv("orders.csv")
  |> filter(date >= "2024-03-01" and date < "2024-04-01")
  |> agg(orders = count())
