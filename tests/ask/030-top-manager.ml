# question: Which manager's stores brought in the most revenue (units times price) over the year? Show the manager and the revenue.
# data: sales.xlsx regions.csv
let sales = load_xlsx("sales.xlsx", sheet = "*") |> with_column(revenue = units * price)
print join(sales, load_csv("regions.csv"), on = "store")
  |> group_by("manager")
  |> agg(revenue = sum(revenue))
  |> sort(["revenue"], desc = true)
  |> head(1)
