# question: Make a table of total units sold over the year with one row per store and one column per product.
# data: sales.xlsx
print pivot(load_xlsx("sales.xlsx", sheet = "*"), index = "store", columns = "product", values = "units", agg = "sum")
