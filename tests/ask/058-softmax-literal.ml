# question: What is the softmax of [1.0, 2.0, 3.0]?
# data:
print softmax([1.0, 2.0, 3.0])
