# question: What is the sum of the squares of 1 to 10?
# data:
print sum(arange(1, 11) ** 2)
