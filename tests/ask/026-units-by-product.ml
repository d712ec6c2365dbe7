# question: How many units of each product were sold over the whole year (all quarterly sheets of sales.xlsx)? Sorted by product.
# data: sales.xlsx
print load_xlsx("sales.xlsx", sheet = "*")
  |> group_by("product")
  |> agg(units = sum(units))
