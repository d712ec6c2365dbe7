# question: What are the median, lowest and highest unit price of each product? Show product, median, min, max, sorted by product.
# data: orders.csv
print load_csv("orders.csv")
  |> group_by("product")
  |> agg(median_price = median(unit_price), min_price = min(unit_price), max_price = max(unit_price))
