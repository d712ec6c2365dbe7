# question: Take the first 10 passengers that have a known age. What is the mean of each of their numeric columns, in the order the columns appear in the file, as one vector?
# data: titanic.csv
let people = load_csv("titanic.csv") |> filter(not_null(Age)) |> head(10)
print mean(tensor(people), axis = 0)
