# question: What is the average order value (units × unit_price) over the orders where both are known?
# data: orders.csv
print load_csv("orders.csv")
  |> with_column(value = units * unit_price)
  |> agg(mean_value = mean(value))
