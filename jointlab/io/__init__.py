"""Reading and writing graphs: the value codec and the pickle-free archive format."""
