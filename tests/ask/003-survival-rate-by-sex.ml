# question: What fraction of women and of men survived? One row per sex (sorted by sex) with the survival rate.
# data: titanic.csv
print load_csv("titanic.csv")
  |> group_by("Sex")
  |> agg(survival_rate = mean(Survived))
