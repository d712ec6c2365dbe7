# question: What is the sum of the integers from 0 to 99?
# data:
print sum(arange(100))
