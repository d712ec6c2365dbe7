# Table programs are type-checked against the real columns of their files (people.csv).
let people = load_csv("people.csv")
print people |> filter(Agee >= 18 and Sex == "female")
print select(people, ["Name", "Fare", "sex"])
print people |> group_by("Sex") |> agg(n = count(), m = mean(Name))
print people |> filter(Sex > 3)
print stats(people, ["mean", "99th"])
print people |> with_column(x = Age @ Fare)
print load_csv("nowhere.csv")
print load_csv("../secrets.csv")
# ==== expected ====
error[E0208]: unknown column `Agee`
  ┌─ columns.ml:3:24
  │
3 │ print people |> filter(Agee >= 18 and Sex == "female")
  │                        ^^^^ not a column of this table
  │
  = help: did you mean `Age`?

error[E0208]: unknown column `sex`
  ┌─ columns.ml:4:22
  │
4 │ print select(people, ["Name", "Fare", "sex"])
  │                      ^^^^^^^^^^^^^^^^^^^^^^^ not a column of this table
  │
  = help: did you mean `Sex`?

error[E0201]: `mean` needs a numeric column; `Name` is string
  ┌─ columns.ml:5:62
  │
5 │ print people |> group_by("Sex") |> agg(n = count(), m = mean(Name))
  │                                                              ^^^^

error[E0201]: `>` compares values of different kinds: the left side is string, the right side i64
  ┌─ columns.ml:6:24
  │
6 │ print people |> filter(Sex > 3)
  │                        ^^^^^^^

error[E0201]: unknown statistic `99th`
  ┌─ columns.ml:7:21
  │
7 │ print stats(people, ["mean", "99th"])
  │                     ^^^^^^^^^^^^^^^^
  │
  = help: statistics: count, mean, std, min, 25%, 50%, 75%, max (any N% is a percentile)

error[E0201]: `@` is a tensor operation, not a row expression
  ┌─ columns.ml:8:33
  │
8 │ print people |> with_column(x = Age @ Fare)
  │                                 ^^^^^^^^^^

error[E0301]: `nowhere.csv` does not exist in the data roots ($ROOT)
  ┌─ columns.ml:9:16
  │
9 │ print load_csv("nowhere.csv")
  │                ^^^^^^^^^^^^^ cannot read

error[E0301]: `../secrets.csv` climbs out of the data roots with `..` (roots: $ROOT)
   ┌─ columns.ml:10:16
   │
10 │ print load_csv("../secrets.csv")
   │                ^^^^^^^^^^^^^^^^ cannot read

