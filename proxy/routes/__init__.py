"""Route handlers, one module per family; each handler is thin and calls the serving objects."""
