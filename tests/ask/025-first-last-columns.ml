# question: Show the first two rows of titanic.csv with only its first and its last column.
# data: titanic.csv
let people = load_csv("titanic.csv")
let cols = columns(people)
print people |> select([cols[0], cols[-1]]) |> head(2)
