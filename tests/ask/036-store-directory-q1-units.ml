# question: For every store in regions.csv, show its region, its manager and its total units sold according to the Q1 sheet of sales.xlsx, sorted by store name.
# data: regions.csv sales.xlsx
let q1 = load_xlsx("sales.xlsx", sheet = "Q1")
  |> group_by("store")
  |> agg(q1_units = sum(units))
print join(load_csv("regions.csv"), q1, on = "store", how = "left")
  |> sort(["store"])
