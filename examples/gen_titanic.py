#!/usr/bin/env python3
"""Writes examples/titanic.csv: a synthetic passenger list with the columns, types and quirks
of the well-known Kaggle Titanic training set (891 rows; names with commas and quotes, so
fields are quoted; missing Age, Cabin and Embarked). The values are generated from a fixed
seed, not copied from any dataset: the file is ours (Apache-2.0, like the project).

    python3 examples/gen_titanic.py > examples/titanic.csv
"""
import csv
import random
import sys

rng = random.Random(1912)
SURNAMES = ["Braund", "Cumings", "Heikkinen", "Futrelle", "Allen", "Moran", "McCarthy",
            "Palsson", "Johnson", "Nasser", "Sandstrom", "Bonnell", "Saundercock", "Andersson",
            "Vestrom", "Hewlett", "Rice", "Williams", "Vander Planke", "Masselmani", "Fynney",
            "Beesley", "McGowan", "Sloper", "Asplund", "Emir", "Fortune", "O'Dwyer", "Todoroff"]
MALE = ["Owen Harris", "William Henry", "Timothy J", "James", "Charles", "Lewis", "Jacques"]
FEMALE = ["Laina", "Lily May", "Elisabeth", "Florence", "Marguerite", "Anna", "Hulda"]

w = csv.writer(sys.stdout, lineterminator="\n")
w.writerow(["PassengerId", "Survived", "Pclass", "Name", "Sex", "Age", "SibSp", "Parch",
            "Ticket", "Fare", "Cabin", "Embarked"])
for pid in range(1, 892):
    pclass = rng.choices([1, 2, 3], weights=[216, 184, 491])[0]
    sex = "female" if rng.random() < 0.35 else "male"
    title = ("Mrs." if rng.random() < 0.6 else "Miss.") if sex == "female" else "Mr."
    first = rng.choice(FEMALE if sex == "female" else MALE)
    nick = f' ("{rng.choice(FEMALE)}")' if sex == "female" and rng.random() < 0.1 else ""
    name = f"{rng.choice(SURNAMES)}, {title} {first}{nick}"
    age = None if rng.random() < 0.2 else max(0.42, round(rng.gauss(30 - 3 * (pclass - 2), 14)))
    if age is not None and rng.random() < 0.05:
        age += 0.5  # estimated ages are written xx.5
    sibsp = rng.choices([0, 1, 2, 3, 4, 5, 8], weights=[608, 209, 28, 16, 18, 5, 7])[0]
    parch = rng.choices([0, 1, 2, 3, 4, 5, 6], weights=[678, 118, 80, 5, 4, 5, 1])[0]
    base = {1: 84.15, 2: 20.66, 3: 13.68}[pclass]
    fare = round(max(0.0, rng.lognormvariate(0, 0.6) * base), 4)
    p = 0.74 if sex == "female" else 0.19
    p += {1: 0.2, 2: 0.05, 3: -0.1}[pclass]
    survived = int(rng.random() < max(0.02, min(0.98, p)))
    cabin = (f"{rng.choice('ABCDE')}{rng.randint(1, 148)}"
             if pclass == 1 and rng.random() < 0.8 else None)
    embarked = None if rng.random() < 0.003 else rng.choices("SCQ", weights=[644, 168, 77])[0]
    ticket = str(rng.randint(110000, 390000)) if rng.random() < 0.75 else \
        f"{rng.choice(['A/5', 'PC', 'STON/O2.', 'C.A.', 'SOTON/O.Q.'])} {rng.randint(1000, 99999)}"
    w.writerow([pid, survived, pclass, name, sex, "" if age is None else age, sibsp, parch,
                ticket, fare, cabin or "", embarked or ""])
