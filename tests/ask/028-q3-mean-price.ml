# question: What was the average price of each product in the third quarter (sheet Q3 of sales.xlsx)? Sorted by product.
# data: sales.xlsx
print load_xlsx("sales.xlsx", sheet = "Q3")
  |> group_by("product")
  |> agg(mean_price = mean(price))
