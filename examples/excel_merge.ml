# Merge a workbook's quarterly sheets, join the store regions, and total by region.
let sales = load_xlsx("sales.xlsx", sheet = "*")      # every sheet, stacked by column name
  |> with_column(revenue = units * price)
let regions = load_csv("regions.csv")
let by_region = join(sales, regions, on = "store", how = "left")
  |> group_by("region", "product")
  |> agg(orders = count(), units = sum(units), revenue = sum(revenue))
print by_region
write_csv(by_region, "revenue_by_region.csv")
