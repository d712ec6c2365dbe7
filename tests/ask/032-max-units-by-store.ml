# question: What is the largest number of units in a single sales row for each store, over all quarters? Sorted by store.
# data: sales.xlsx
print load_xlsx("sales.xlsx", sheet = "*")
  |> group_by("store")
  |> agg(max_units = max(units))
