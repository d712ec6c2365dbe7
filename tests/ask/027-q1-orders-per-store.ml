# question: In the Q1 sheet, how many sales rows does each store have? Sorted by store name.
# data: sales.xlsx
print load_xlsx("sales.xlsx", sheet = "Q1")
  |> group_by("store")
  |> agg(rows = count())
