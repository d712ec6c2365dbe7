# question: For each column of regions.csv, in the file's column order, how many distinct values does it have? Print one result per column.
# data: regions.csv
let regions = load_csv("regions.csv")
for c in columns(regions) {
  print regions |> agg(distinct_values = nunique(c))
}
