# question: Take the average units per order of each region (regions sorted by name, orders without a region or without units left out) and turn these averages into softmax weights. Print the weights as a vector.
# data: orders.csv
let regions = load_csv("orders.csv")
  |> group_by("region")
  |> agg(mean_units = mean(units))
print softmax(tensor(regions, ["mean_units"])[:, 0])
