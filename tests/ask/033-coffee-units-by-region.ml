# question: How many units of coffee were sold in each region over the year? Sorted by region.
# data: sales.xlsx regions.csv
let coffee = load_xlsx("sales.xlsx", sheet = "*") |> filter(product == "coffee")
print join(coffee, load_csv("regions.csv"), on = "store")
  |> group_by("region")
  |> agg(units = sum(units))
