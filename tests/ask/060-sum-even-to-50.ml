# question: What is the sum of the even numbers from 0 to 50, inclusive?
# data:
print sum(arange(0, 51, 2))
