# question: What is the total revenue (units times price) per region over all quarters? Show region and revenue, largest revenue first.
# data: sales.xlsx regions.csv
let sales = load_xlsx("sales.xlsx", sheet = "*") |> with_column(revenue = units * price)
print join(sales, load_csv("regions.csv"), on = "store")
  |> group_by("region")
  |> agg(revenue = sum(revenue))
  |> sort(["revenue"], desc = true)
