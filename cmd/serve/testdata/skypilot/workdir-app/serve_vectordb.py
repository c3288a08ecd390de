print("serving the corpus")
