# question: Make a table of total units with one row per region and one column per channel.
# data: orders.csv
print pivot(load_csv("orders.csv"), index = "region", columns = "channel", values = "units", agg = "sum")
