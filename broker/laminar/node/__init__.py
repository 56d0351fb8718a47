"""A node: its sans-I/O core (`core`) and its storage service (`store`)."""
