"""Generated data: the demo log and the movie knowledge base."""
