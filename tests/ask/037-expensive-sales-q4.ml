# question: List the rows of the Q4 sheet of sales.xlsx with a price above 8.5: store, product, units and price, highest price first.
# data: sales.xlsx
print load_xlsx("sales.xlsx", sheet = "Q4")
  |> filter(price > 8.5)
  |> sort(["price"], desc = true)
  |> select(["store", "product", "units", "price"])
