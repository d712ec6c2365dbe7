# question: How many stores does each region have? Sorted by region.
# data: regions.csv
print load_csv("regions.csv")
  |> group_by("region")
  |> agg(stores = count())
