# question: What is the total number of units per sales channel, counting missing units as 0? Sorted by channel.
# data: orders.csv
print load_csv("orders.csv")
  |> with_column(units = fill_null(units, 0))
  |> group_by("channel")
  |> agg(units = sum(units))
